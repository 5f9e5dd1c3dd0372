"""Fusion on the device: packing tensors into one buffer and back, scaled and cast.

Written once against :class:`~hvdlite.device.backend.ArrayBackend`, so the
same code packs CuPy arrays on the engine stream and numpy arrays on CPU CI.
A :class:`~hvdlite.engine.fusion.Reduction` lists the tensors; a joined rank's
tensors (input None) contribute zeros and receive nothing.
"""

from __future__ import annotations

import numpy as np

from ..engine.fusion import Reduction

__all__ = ["pack", "unpack", "flat_bytes", "reduce_alone"]


def flat_bytes(array):
    """The bytes of a C-contiguous array, as a flat uint8 view."""
    return array.reshape(-1).view(np.uint8)


def pack(backend, tensors: Reduction, buf) -> None:
    """Copy the inputs of *tensors* into *buf*, back to back: prescaled, cast to
    buf's dtype, zeros for a joined rank."""
    inputs, prescales = tensors.inputs, tensors.prescales
    if all(inp is not None and inp.dtype == buf.dtype for inp in inputs) \
            and all(pre == 1.0 for pre in prescales):
        backend.concatenate([inp.reshape(-1) for inp in inputs], buf)
        return
    offset = 0
    for inp, count, pre in zip(inputs, tensors.counts, prescales):
        view = buf[offset:offset + count]
        offset += count
        if inp is None:
            backend.zero(view)
        elif pre != 1.0:
            backend.scale(view, inp.reshape(-1), pre)
        else:
            backend.copy(view, inp.reshape(-1))


def unpack(backend, tensors: Reduction, buf) -> None:
    """Copy the reduced *buf* out into the outputs: postscaled, cast back."""
    offset = 0
    for out, count, post in zip(tensors.outputs, tensors.counts, tensors.postscales):
        view = buf[offset:offset + count]
        offset += count
        if out is None:
            continue
        if post != 1.0:
            backend.scale(out.reshape(-1), view, post)
        else:
            backend.copy(out.reshape(-1), view)


def reduce_alone(backend, tensors: Reduction, link, op: int) -> None:
    """A single tensor of the wire dtype: reduce it in its output, no fusion buffer."""
    inp, out = tensors.inputs[0].reshape(-1), tensors.outputs[0].reshape(-1)
    pre, post = tensors.prescales[0], tensors.postscales[0]
    if pre != 1.0:
        backend.scale(out, inp, pre)
    elif tensors.inputs[0] is not tensors.outputs[0]:
        backend.copy(out, inp)
    link.allreduce(out, op)
    if post != 1.0:
        backend.scale(out, out, post)
