"""JAX arrays to the engine's arrays and back: checks, host views, results.

Where an input's data goes, by the device it lives on:

- the CPU: the engine reads ``np.asarray(x)``, a zero-copy read-only view of
  the JAX buffer.  Results are fresh engine arrays; ``jax.device_put`` adopts
  a 64-byte aligned host array as the new JAX array's buffer without a copy,
  so the outputs hvdlite allocates itself (allreduce, broadcast) are aligned
  and come back zero-copy; the others are copied once where not aligned;
- a GPU, where every rank can take the device path (agreed at ``init()``):
  a CuPy view through DLPack (:mod:`hvdlite.jax._device`);
- anything else (a GPU without the device path, another accelerator): copied
  to the host, moved there, the result copied back to the input's device.

bfloat16, which numpy's engine does not carry natively: reductions run on a
float32 copy and cast back; broadcast, allgather and alltoall move its bits
as int16 (a view, no copy, on the host).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from hvdlite.exceptions import ArgumentError

from . import _device

__all__ = ["Staged", "aligned_empty", "check_dtype", "flatten", "host_input", "is_traced", "stage"]

#: The dtypes hvdlite.jax moves (float64 and int64 need ``jax_enable_x64``).
SUPPORTED = frozenset(
    np.dtype(d)
    for d in (
        jnp.uint8,
        jnp.int8,
        jnp.uint16,
        jnp.int16,
        jnp.int32,
        jnp.int64,
        jnp.float16,
        jnp.bfloat16,
        jnp.float32,
        jnp.float64,
        jnp.bool_,
    )
)
_NAMES = "uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool"
BFLOAT16 = np.dtype(jnp.bfloat16)
_ALIGN = 64  # bytes: what jax.device_put needs to adopt host memory on the CPU


def is_traced(leaves) -> bool:
    """Whether any of *leaves* is a JAX tracer (inside ``jax.jit``, ``grad``, ``vmap``)."""
    return any(isinstance(x, jax.core.Tracer) for x in leaves)


def flatten(tree, what: str) -> tuple[list, object]:
    """The leaves of *tree* as JAX arrays (numpy arrays and Python numbers are
    converted onto the default device), and its structure."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    if not leaves:
        raise ArgumentError(f"hvdlite.jax.{what}: got no arrays (an empty pytree).")
    return [_as_jax(x, what) for x in leaves], treedef


def _as_jax(x, what: str):
    if isinstance(x, jax.Array):  # tracers included
        return x
    if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
        return jnp.asarray(x)
    raise TypeError(
        f"hvdlite.jax.{what}: expected JAX arrays (or a pytree of them), got a leaf "
        f"of type {type(x).__name__}."
    )


def check_dtype(dtype, what: str) -> np.dtype:
    """*dtype* as a numpy dtype; ArgumentError naming the supported ones otherwise."""
    dt = np.dtype(dtype)
    if dt not in SUPPORTED:
        raise ArgumentError(
            f"hvdlite.jax.{what}: dtype {dt.name} is not supported; supported: {_NAMES} "
            "(cast it first, e.g. x.astype(jnp.float32))."
        )
    return dt


def aligned_empty(shape, dtype) -> np.ndarray:
    """An uninitialized C-contiguous array whose data starts on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + _ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def framework_dtypes(arrays) -> tuple:
    """The dtype names of a call's arrays where the engine may be handed another
    dtype for one of them (bfloat16 moved as int16 bits), for the
    ranks to agree on: a rank with bfloat16 and one with float32 are told so, not
    summed together; () otherwise, where the engine compares the dtypes it sees."""
    dtypes = [np.dtype(x.dtype) for x in arrays]
    if BFLOAT16 in dtypes:
        return tuple(d.name for d in dtypes)
    return ()


class HostInput(NamedTuple):
    """A host array as the engine takes it, and how to read a result back in its dtype."""

    array: np.ndarray
    restore: Callable[[np.ndarray], np.ndarray]


def _same(result: np.ndarray) -> np.ndarray:
    return result


def _from_bits(result: np.ndarray) -> np.ndarray:
    return result.view(BFLOAT16)


def host_input(host: np.ndarray, reduce: bool) -> HostInput:
    """The engine's form of host array *host*: itself (a reduction of bfloat16
    too: the engine reduces it in float32 and rounds once, and across nodes moves
    it as 16 bits), or for a bfloat16 move its int16 bits (a view)."""
    if host.dtype != BFLOAT16 or reduce:
        return HostInput(host if host.flags.c_contiguous else np.ascontiguousarray(host), _same)
    return HostInput(np.ascontiguousarray(host).view(np.int16), _from_bits)


class Staged(NamedTuple):
    """One input on its way to the engine.

    ``array``: what the engine reads; ``output``: where an allreduce or broadcast
    writes (None: the engine allocates); ``back``: engine result -> JAX array on
    the input's device.
    """

    array: object
    output: object
    back: Callable


def _device_of(x, what: str):
    devices = x.devices()
    if len(devices) != 1:
        raise ArgumentError(
            f"hvdlite.jax.{what}: the array is sharded over {len(devices)} devices; hvdlite "
            "moves single-device arrays (one process per device): pass one shard, e.g. "
            "x.addressable_shards[0].data, or jax.device_put(x, jax.devices()[0])."
        )
    return next(iter(devices))


def stage(x, what: str, reduce: bool, with_output: bool) -> Staged:
    """Prepare concrete JAX array *x* for the engine (see the module doc for where
    its data goes).  *with_output*: allocate the output here (same shape and dtype
    as the engine's input)."""
    check_dtype(x.dtype, what)
    device = _device_of(x, what)
    if device.platform != "cpu" and _device.available():
        array, back = _device.stage(x, reduce)
        return Staged(array, None, back)
    dtype = x.dtype
    host = host_input(np.asarray(x), reduce)  # a view on the CPU, a copy elsewhere
    output = aligned_empty(host.array.shape, host.array.dtype) if with_output else None
    restore = host.restore

    def back(result):
        out = restore(result)
        if out.dtype != dtype:
            out = out.astype(dtype)
        return jax.device_put(out, device)

    return Staged(host.array, output, back)
