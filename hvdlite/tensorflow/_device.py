"""GPU tensors in eager TensorFlow: through DLPack onto the engine's device path.

Eagerly, a collective whose inputs sit on a GPU goes to the engine as CuPy
views of the tensors' memory (``tf.experimental.dlpack``: no host copy), and
its results come back as GPU tensors the same way, when every rank of the job
can move CUDA arrays (CuPy and a device on every rank, agreed at ``init``, so
every rank decides alike).  TensorFlow does not expose its streams, so the
device is synchronized before the arrays are handed over and after the
collective, instead of ordering streams with events as the torch adapter does.

Where TensorFlow does not allow it, the host path stays: inside a
``tf.function`` a collective is a ``tf.numpy_function`` node, whose inputs
TensorFlow copies to the host; inside XLA (``jit_compile=True``) collectives
cannot run at all and raise a ValueError saying so.
"""

from __future__ import annotations

import tensorflow as tf

from hvdlite import basics as _basics

__all__ = ["wants_device_path", "run_eager"]


def wants_device_path(inputs) -> bool:
    """Eager *inputs* include a GPU tensor, and every rank can take the device path."""
    if not any("GPU" in getattr(t, "device", "") for t in inputs):
        return False
    choice = _basics.device_choice()
    return bool(choice is not None and choice.capabilities.cuda)


def run_eager(fn, inputs, out_dtypes):
    """``fn`` on CuPy views of GPU *inputs* (numpy for CPU ones); tensors back."""
    import cupy

    tf.test.experimental.sync_devices()  # TF's producer streams are not ours to order
    arrays = [
        cupy.from_dlpack(tf.experimental.dlpack.to_dlpack(x)) if "GPU" in x.device else x.numpy()
        for x in inputs
    ]
    outs = fn(*arrays, outputs=None)
    cupy.cuda.Device().synchronize()  # the results are complete before TF reads them
    return [
        tf.experimental.dlpack.from_dlpack(o.toDlpack())
        if isinstance(o, cupy.ndarray)
        else tf.convert_to_tensor(o, dtype=d)
        for o, d in zip(outs, out_dtypes, strict=True)
    ]
