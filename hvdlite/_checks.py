"""A collective's arguments, checked once per call, and the request facts read off them.

:mod:`hvdlite.collectives` runs every argument of a call through these on the
calling thread, once: the process set (:func:`members`), the name
(:func:`next_name`), each input array (:func:`checked_input`, which also asks
its device, the call's one question about it) and output
(:func:`checked_output`), the devices together (:func:`devices_apart`), the
reduction op and scale factors.  :func:`single_host` is the one place that
decides whether a request takes the single-tensor fast path
(``Params.single_host``).  A framework adapter that validates its tensors
itself hands the engine's views to the ``submit_*`` seams of
:mod:`hvdlite.collectives`, which skip :func:`checked_input` and
:func:`checked_output`: a tensor is validated once per call either way.

Errors are :class:`~hvdlite.exceptions.ArgumentError` (a ValueError) naming
the fix, raised on the calling rank only.
"""

from __future__ import annotations

import numpy as np

from .device import arrays as _device
from .device.arrays import CPU
from .exceptions import ArgumentError
from .ops import Adasum, ReduceOp, resolve_op
from .process_sets import GLOBAL_SET_ID, ProcessSet, global_process_set
from .util.dtypes import OWN_WIRE

__all__ = [
    "members",
    "next_name",
    "checked_input",
    "checked_output",
    "devices_apart",
    "single_host",
    "device_submission",
    "reduction_op",
    "scales",
]

_ON_CPU = frozenset({CPU})


def members(st, process_set: ProcessSet, what: str) -> tuple[int, list[int]]:
    """``(set id, its global ranks)`` of *process_set*, which must be registered and
    hold this rank."""
    if process_set is global_process_set:  # the common case: every rank is a member
        return GLOBAL_SET_ID, st.sets.ranks[GLOBAL_SET_ID]
    if not isinstance(process_set, ProcessSet):
        raise ArgumentError(
            f"{what}: process_set must be a hvd.ProcessSet, got {type(process_set).__name__}."
        )
    set_id = process_set.process_set_id
    ps = st.sets.get(set_id) if set_id is not None else None
    if ps is None:
        raise ArgumentError(
            f"{what}: {process_set} is not registered; pass it to "
            "hvd.init(process_sets=[...]) or hvd.add_process_set() first."
        )
    if st.world.Get_rank() not in st.sets.members[set_id]:
        raise ArgumentError(
            f"{what}: rank {st.world.Get_rank()} is not a member of {ps} "
            f"(ranks {ps.ranks}); only its members may call collectives on it."
        )
    return set_id, st.sets.ranks[set_id]


def next_name(st, op: str, name: str | None, set_id: int = 0) -> str:
    """*name*, or the next automatic name of *op* in process set *set_id*.

    Counting per process set (per registration of its id) keeps automatic names in
    step across the members of a set even when some of them also call unnamed
    collectives on other sets;
    counting per thread (:mod:`hvdlite.engine.auto_names`) keeps threads apart.
    """
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"{op}: name must be a non-empty string, got {name!r}.")
        return name
    if set_id == GLOBAL_SET_ID:
        return f"{op}.noname.{st.names.suffix(op)}"
    # A removed set's id comes back for a later set: count per registration, so that
    # the new set's members start from the same number.
    return f"{op}.noname.{st.names.suffix((op, set_id, st.sets.registration_of(set_id)))}"


def checked_input(x, what: str) -> tuple:
    """The one validation of an input: ``(array, device)``, where *array* is what
    the engine moves (*x* itself for a C-contiguous numpy array, else a zero-copy
    view) and *device* where it lives, asked here once for the whole call."""
    if type(x) is np.ndarray:  # the common case: no device to ask about
        device = CPU
    else:
        device = _device.device_of(x)
        if not isinstance(x, np.ndarray):
            if device != CPU:  # CuPy arrays, torch CUDA tensors, DLPack
                return device_submission().engine_array(x, what, device), device
            x = np.asarray(x)
    if not x.flags.c_contiguous:
        raise ArgumentError(
            f"{what}: the array is not C-contiguous; pass "
            "np.ascontiguousarray(x) (hvdlite never copies silently)."
        )
    return x, device


def checked_output(out, like, device: str, what: str):
    """The output for input *like* (from :func:`checked_input`, on *device*): *out*
    checked, or a new array where *out* is None."""
    if out is like and type(like) is np.ndarray and like.flags.writeable:
        return out  # in place: checked_input has checked the rest
    if not isinstance(like, np.ndarray):
        if out is like:  # in place on a device: checked_input made and checked it
            return out
        return device_submission().engine_output(out, like, what, device)
    if out is None:
        return np.empty_like(like)
    if (
        not isinstance(out, np.ndarray)
        or out.shape != like.shape
        or out.dtype != like.dtype
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ArgumentError(
            f"{what}: output must be a writeable C-contiguous array with the "
            f"input's shape {like.shape} and dtype {like.dtype}."
        )
    return out


def devices_apart(devices, arrays=(), outs=()) -> frozenset | None:
    """None where a call's arrays all sit on one device, else the devices found,
    which the submission refuses, naming the call.  *devices*: its inputs' (from
    :func:`checked_input`).  Where those are all the CPU the call takes the host
    path, its outputs being numpy memory; an output that :func:`checked_output`
    made or checked for a device input is on that device; so only the numpy
    outputs of HostDeviceArray inputs are asked about here, once each."""
    found = set(devices)
    if found == _ON_CPU:
        return None
    for array, out in zip(arrays, outs):
        if out is not array and isinstance(array, np.ndarray):
            found.add(_device.device_of(out))
    return frozenset(found) if len(found) > 1 else None


def single_host(device: str, dtypes: tuple) -> bool:
    """The one decision of the single-tensor fast path (``Params.single_host``), for an
    allreduce request of *dtypes* on *device*: one host array that reduces in its
    own dtype (not float16 or bool).  The executor reads the answer off the request."""
    return device == CPU and len(dtypes) == 1 and dtypes[0] in OWN_WIRE


_submission_module = None


def device_submission():
    """The device path's submission side (imported on the first device array)."""
    global _submission_module
    if _submission_module is None:
        from .device import submission

        _submission_module = submission
    return _submission_module


def reduction_op(op, average, what: str, set_size: int) -> ReduceOp:
    """The reduction *op* (or Horovod's *average* flag) names, checked against the set's size."""
    rop = resolve_op(op, average)
    if rop == Adasum and set_size & (set_size - 1):
        raise ArgumentError(
            f"{what}: op=Adasum needs a power-of-two number of ranks, the "
            f"process set has {set_size}; use op=Average or run on 2, 4, 8... "
            "ranks."
        )
    return rop


def scales(prescale_factor, postscale_factor) -> tuple[float, float]:
    """The scale factors as floats."""
    try:
        return float(prescale_factor), float(postscale_factor)
    except (TypeError, ValueError):
        raise ArgumentError("prescale_factor and postscale_factor must be numbers.") from None
