"""The caller-thread side of the device path: device arrays into engine entries.

:mod:`hvdlite.collectives` calls these only for arrays off the CPU, whose device
it has asked once per array (:func:`hvdlite.device.arrays.device_of`) and passes
in.  A device array becomes its backend's zero-copy view (:func:`engine_array`);
the request's ``device`` field is the arrays' device, which every rank of the
set must agree on; and the producers' streams are marked (:func:`record_ready`)
so the engine's stream waits for them on the device.
"""

from __future__ import annotations

from ..exceptions import ArgumentError
from .arrays import device_of
from .registry import backend

__all__ = ["engine_array", "engine_output", "record_ready"]


def engine_array(x, what: str, device: str):
    """The backend's view of array *x* on *device* (no copy)."""
    return backend(device).wrap(x, what)


def engine_output(out, like, what: str, device: str):
    """An output array for *like* (a device array on *device*): new, or *out*
    checked and viewed."""
    owner = backend(device)
    if out is None:
        return owner.empty(like.shape, like.dtype)
    out_device = device_of(out)
    if out_device != device:
        raise ArgumentError(
            f"{what}: the output is on device {out_device!r} but the input "
            f"on {device!r}; pass an output on the input's device."
        )
    arr = owner.wrap(out, what)
    if tuple(arr.shape) != tuple(like.shape) or arr.dtype != like.dtype:
        raise ArgumentError(
            f"{what}: output must have the input's shape {tuple(like.shape)} "
            f"and dtype {like.dtype}, got {tuple(arr.shape)} {arr.dtype}."
        )
    return arr


def record_ready(device: str, inputs):
    """The producers' ready token for a submission whose *inputs* (engine arrays)
    are on *device*, not the CPU."""
    return backend(device).record_ready(inputs)
