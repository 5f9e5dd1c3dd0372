"""The caller-thread side of the device path: device arrays into engine entries.

:mod:`hvdlite.collectives` calls these only for arrays that are not plain
numpy arrays, so the CPU path pays one type check per submission.  A device
array becomes its backend's zero-copy view (:func:`engine_array`); the
request's ``device`` field is set to the arrays' device, which every rank of
the set must agree on; and the producers' streams are marked
(:func:`prepare`) so the engine's stream waits for them on the device.
"""

from __future__ import annotations

from ..exceptions import ArgumentError
from .arrays import CPU, device_of, devices_of
from .registry import backend

__all__ = ["engine_array", "engine_output", "prepare"]


def engine_array(x, what: str):
    """The backend's view of device array *x* (no copy)."""
    return backend(device_of(x)).wrap(x, what)


def engine_output(out, like, what: str):
    """An output array for *like* (a device array): new, or *out* checked and viewed."""
    device = device_of(like)
    owner = backend(device)
    if out is None:
        return owner.empty(like.shape, like.dtype)
    if device_of(out) != device:
        raise ArgumentError(
            f"{what}: the output is on device {device_of(out)!r} but the input "
            f"on {device!r}; pass an output on the input's device."
        )
    arr = owner.wrap(out, what)
    if tuple(arr.shape) != tuple(like.shape) or arr.dtype != like.dtype:
        raise ArgumentError(
            f"{what}: output must have the input's shape {tuple(like.shape)} "
            f"and dtype {like.dtype}, got {tuple(arr.shape)} {arr.dtype}."
        )
    return arr


def prepare(params, inputs, outputs):
    """(params with its device set, the producers' ready token) for a submission
    with a non-numpy array; ArgumentError when its arrays sit on different devices."""
    if len(inputs) == 1 and (not outputs or outputs[0] is inputs[0]):  # one, in place
        device = device_of(inputs[0])
        if device == CPU:
            return params, None
        if params.device != device:
            params = params._replace(device=device)
        return params, backend(device).record_ready(inputs)
    arrays = list(inputs)
    others = [o for o in (outputs or ()) if o is not None]
    if len(others) != len(arrays) or any(o is not i for o, i in zip(others, arrays)):
        arrays += others  # not in place: the outputs' devices count too
    devices = devices_of(arrays)
    if devices == {CPU}:
        return params, None
    if len(devices) > 1:
        raise ArgumentError(
            f"{params.name}: the arrays of one collective must all be on one device, got "
            f"{', '.join(sorted(devices))}; move them first (e.g. tensor.cuda() or .cpu())."
        )
    device = devices.pop()
    ready = backend(device).record_ready(list(inputs) or arrays)
    return params._replace(device=device), ready
