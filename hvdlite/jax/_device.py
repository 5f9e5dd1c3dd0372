"""JAX GPU arrays on the engine's device path, through DLPack.

A GPU array goes to the engine as a CuPy view of its buffer
(``cupy.from_dlpack``, no copy) when every rank of the job can move CUDA
arrays (CuPy and a device on every rank, agreed at ``init()``, so every rank
decides alike); its result comes back as a JAX array on the same GPU
(``jax.dlpack.from_dlpack``, no copy).  JAX does not expose its streams, so
the input is made ready (``block_until_ready``) before the engine reads it
and the device is synchronized before JAX reads the result, as the
TensorFlow adapter does.  bfloat16 (which CuPy lacks) is reduced through a
float32 copy and moved as int16 bits, both made by JAX on the GPU.

Where the device path is absent, :mod:`hvdlite.jax._arrays` copies the array
to the host instead.  CuPy is imported here only when a GPU array arrives: a
CPU install never imports a CUDA library.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hvdlite import basics as _basics

__all__ = ["available", "stage"]

_BFLOAT16 = np.dtype(jnp.bfloat16)


def available() -> bool:
    """Whether every rank of the job can move CUDA arrays on the device path."""
    choice = _basics.device_choice()
    return bool(choice is not None and choice.capabilities.cuda)


def stage(x, reduce: bool):
    """(CuPy view of GPU array *x* for the engine, result -> JAX array)."""
    import cupy

    dtype = np.dtype(x.dtype)
    if dtype == _BFLOAT16:
        x = x.astype(jnp.float32) if reduce else jax.lax.bitcast_convert_type(x, jnp.int16)
    x.block_until_ready()  # JAX's streams are not ours to order
    array = cupy.from_dlpack(x)

    def back(result):
        cupy.cuda.Device(result.device.id).synchronize()  # complete before JAX reads it
        out = jax.dlpack.from_dlpack(result)
        if dtype == _BFLOAT16:
            out = (
                out.astype(jnp.bfloat16)
                if reduce
                else jax.lax.bitcast_convert_type(out, jnp.bfloat16)
            )
        return out

    return array, back
