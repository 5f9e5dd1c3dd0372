"""Collectives on numpy arrays: Horovod's names and arguments, over the engine.

Every ``*_async`` function validates its arguments on the calling thread, once
each (:mod:`hvdlite._checks`; ValueError naming the fix), submits one engine
entry and returns a :class:`~hvdlite.handles.Handle`; the plain spelling waits
for it.  Framework adapters call the same functions with zero-copy views of
their tensors and, for in-place ops, ``output=`` set to the input itself; an
adapter that validates a tensor itself hands its view to
:func:`submit_allreduce` or :func:`submit_grouped_allreduce`, which check only
the other arguments, so that a tensor is validated once per call either way.

Cross-rank contract: every rank of ``process_set`` must submit the same
collectives under the same names (automatic names count calls per op, so ranks
must call in the same order); shapes, dtypes, ops, roots and scale factors must
agree, else every rank gets HorovodInternalError naming the difference.

Arguments shared by the collectives (each function lists only its own):

- *tensor* / *tensors*: a C-contiguous numpy array (or a list of them for the
  ``grouped_*`` forms), or a device array (CuPy, a torch CUDA tensor); never
  copied silently, so a non-contiguous array is refused.
- *name*: the name the ranks agree on; None takes the next automatic name of
  the op (counted per thread and process set, so ranks must then call in the
  same order).
- *op*: :data:`~hvdlite.ops.Average` (the default of the reductions),
  :data:`~hvdlite.ops.Sum`, :data:`~hvdlite.ops.Adasum`, ``Min``, ``Max``,
  ``Product``; *average*: Horovod's older boolean spelling (True = Average).
- *prescale_factor*, *postscale_factor*: multiply every input before the
  reduction and the result after it.
- *process_set*: a registered :class:`~hvdlite.process_sets.ProcessSet`; only
  its members call, and ranks are global ranks.
- *output* / *outputs* (keyword only): where the result goes; pass the input
  itself to work in place.
- *dtype_names* (keyword only, for framework adapters): the framework's dtype
  of each array where the adapter hands the engine another (torch's bfloat16
  as int16 bits, say); the ranks must agree on them too.  () for numpy arrays.
- *device* (keyword only, for framework adapters): the array(s) are the
  engine's C-contiguous views of tensors the adapter has validated itself, all
  on this device (``"cpu"``, ``"cuda"``), and an *output* the same; they are
  not validated again.  None (the default) validates them here.

Every ``*_async`` function returns a :class:`~hvdlite.handles.Handle`, a
``concurrent.futures.Future`` whose result is what the blocking form returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import numpy as np

from ._checks import (
    checked_input,
    checked_output,
    device_submission,
    devices_apart,
    members,
    next_name,
    reduction_op,
    scales,
    single_host,
)
from .device.arrays import CPU
from .engine.runtime import state
from .util.dtypes import check_dtype
from .handles import Handle, synchronize
from .engine.messages import JOIN_PARAMS, LEAVE_PARAMS, Kind, Params
from .ops import Adasum, Average, ReduceOp, resolve_op
from .process_sets import GLOBAL_SET_ID, ProcessSet, global_process_set
from .engine.submissions import Entry
from .exceptions import ArgumentError, HorovodInternalError

__all__ = [
    "allreduce",
    "allreduce_async",
    "grouped_allreduce",
    "grouped_allreduce_async",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_async",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "barrier",
    "join",
]


# ------------------------------------------------------------------ helpers
_ALLREDUCE = int(Kind.ALLREDUCE)


def _input(x, what: str, device: str | None) -> tuple:
    """``(array, device)``: *x* as an adapter validated it on *device*, or
    :func:`~hvdlite._checks.checked_input` where *device* is None."""
    return checked_input(x, what) if device is None else (x, device)


#: How many argument combinations of named allreduces are remembered (then afresh).
_KNOWN_LIMIT = 1024


class _Calling(threading.local):
    """Per thread: is the current submission made by a caller that waits on it at once?"""

    sync = False  # a class default: reading it needs no per-thread setup


_calling = _Calling()


@contextlib.contextmanager
def waiting_caller():
    """Submissions made inside are waited on by this thread right after (it
    drives the engine itself), so they do not rouse the engine thread: one
    thread hand-off less per collective."""
    _calling.sync = True
    try:
        yield
    finally:
        _calling.sync = False


def call_and_wait(async_fn, *args, **kwargs):
    """Run *async_fn* (any function that submits and returns a handle, a
    framework adapter's too) and wait for it, as a :func:`waiting_caller`."""
    calling = _calling  # waiting_caller() without its context manager: per call, it shows
    calling.sync = True
    try:
        handle = async_fn(*args, **kwargs)
    finally:
        calling.sync = False
    return synchronize(handle)


def _submit(
    st,
    params: Params,
    inputs,
    outputs,
    grouped=False,
    splits=None,
    payload=None,
    keepalive=None,
    apart=None,
) -> Handle:
    """Queue one entry of *params* (whose ``device`` its arrays are on) and return
    its handle; *apart*: the devices of a call whose arrays are not on one
    (:func:`devices_apart`), refused here, where its name is known."""
    if apart is not None:
        raise ArgumentError(
            f"{params.name}: the arrays of one collective must all be on one device, got "
            f"{', '.join(sorted(apart))}; move them first (e.g. tensor.cuda() or .cpu())."
        )
    ready = None
    if params.device != CPU:  # the producers' streams, for the engine's to wait on
        ready = device_submission().record_ready(params.device, inputs)
    handle = Handle(params.name, keepalive)
    entry = Entry(params, inputs, outputs, handle, grouped, splits, payload)
    entry.ready = ready
    return st.engine.submit(entry, not _calling.sync)


def submit_control(kind: Kind, name: str, extra: tuple, payload=None) -> Handle:
    """Submit a control message of the global set (every rank, same *name*)."""
    st = state()
    params = Params(set_id=GLOBAL_SET_ID, name=name, kind=int(kind), extra=extra)
    return _submit(st, params, [], [], payload=payload)


# ----------------------------------------------------------------- allreduce
def grouped_allreduce_async(
    tensors: Sequence,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    outputs: Sequence | None = None,
    dtype_names: tuple = (),
) -> Handle:
    """Start reducing a list of arrays as one unit (negotiated and fused together).

    Returns:
        A handle whose result is the list of outputs: each the element-wise
        reduction over the ranks of *process_set* (Average divides by its size).
    """
    st = state()
    what = "grouped_allreduce" if isinstance(tensors, (list, tuple)) else "allreduce"
    set_id, ranks = members(st, process_set, what)
    rop = reduction_op(op, average, what, len(ranks))
    pre, post = scales(prescale_factor, postscale_factor)
    checked = [checked_input(t, what) for t in tensors]
    if not checked:
        raise ArgumentError(f"{what}: needs at least one array.")
    if outputs is None:
        outputs = [None] * len(checked)
    if len(outputs) != len(checked):
        raise ArgumentError(f"{what}: got {len(checked)} arrays but {len(outputs)} outputs.")
    arrays = [a for a, _ in checked]
    outs = [checked_output(o, a, d, what) for o, (a, d) in zip(outputs, checked)]
    devices = [d for _, d in checked]
    apart = devices_apart(devices, arrays, outs)
    return _grouped_allreduce(
        st, what, set_id, rop, pre, post, arrays, outs, devices[0], name, dtype_names, apart
    )


def submit_grouped_allreduce(
    arrays: list,
    outputs: list,
    device: str,
    average: bool | None,
    name: str | None,
    op: ReduceOp | None,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    dtype_names: tuple = (),
) -> Handle:
    """:func:`grouped_allreduce_async` for a framework adapter that has validated its
    tensors itself (the call's one validation of each): *arrays*, a non-empty
    list of the engine's C-contiguous views of them, all on *device*; *outputs*,
    for each one itself (in place) or a writeable C-contiguous array of its shape
    and dtype on *device*.  Every other argument is checked as there."""
    st = state()
    what = "grouped_allreduce"
    set_id, ranks = members(st, process_set, what)
    rop = reduction_op(op, average, what, len(ranks))
    pre, post = scales(prescale_factor, postscale_factor)
    return _grouped_allreduce(
        st, what, set_id, rop, pre, post, arrays, outputs, device, name, dtype_names, None
    )


def _grouped_allreduce(
    st, what, set_id, rop, pre, post, arrays, outs, device, name, dtype_names, apart
) -> Handle:
    dtypes = tuple(check_dtype(a, what, rop) for a in arrays)
    name = next_name(st, "allreduce", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=_ALLREDUCE,
        dtypes=dtypes,
        shapes=tuple(a.shape for a in arrays),
        op=int(rop),
        prescale=pre,
        postscale=post,
        device=device,
        framework_dtypes=dtype_names,
        single_host=single_host(device, dtypes),
    )
    return _submit(st, params, arrays, outs, grouped=True, keepalive=(arrays, outs), apart=apart)


def allreduce_async(
    tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    output=None,
    dtype_names: tuple = (),
) -> Handle:
    """Start an allreduce of *tensor* (``output=tensor`` reduces in place).

    Returns:
        A handle whose result is the output array: the element-wise reduction
        over the ranks of *process_set*.
    """
    st = state()
    array, device = checked_input(tensor, "allreduce")
    out = checked_output(output, array, device, "allreduce")
    apart = None if device == CPU else devices_apart((device,), (array,), (out,))
    return _allreduce(
        st,
        array,
        out,
        device,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        dtype_names,
        apart,
    )


def submit_allreduce(
    array,
    output,
    device: str,
    average: bool | None,
    name: str | None,
    op: ReduceOp | None,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    dtype_names: tuple = (),
) -> Handle:
    """:func:`allreduce_async` for a framework adapter that has validated its tensor
    itself (the call's one validation of it): *array* is the engine's
    C-contiguous view of it (a numpy array, or a device array) on *device*;
    *output* is *array* itself (in place) or a writeable C-contiguous array of
    its shape and dtype on *device*.  Every other argument is checked as there."""
    return _allreduce(
        state(),
        array,
        output,
        device,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        dtype_names,
        None,
    )


def _allreduce(
    st,
    array,
    out,
    device: str,
    average,
    name,
    op,
    prescale_factor,
    postscale_factor,
    process_set,
    dtype_names: tuple,
    apart,
) -> Handle:
    """Submit one checked array's allreduce: the request is made (or remembered) here."""
    # A named allreduce of the global set is usually called again with the same
    # arguments (a metric, each step): its checked Params are remembered.
    known = st.allreduce_params
    key = None
    if name is not None and process_set is global_process_set:
        key = (
            name,
            op,
            average,
            prescale_factor,
            postscale_factor,
            array.dtype,
            array.shape,
            device,
            dtype_names,
        )
        try:
            params = known.get(key)
        except TypeError:  # an unhashable argument: checked below, every time
            params = key = None
        if params is not None:
            return _submit(st, params, (array,), (out,), apart=apart)
    set_id, ranks = members(st, process_set, "allreduce")
    rop = reduction_op(op, average, "allreduce", len(ranks))
    pre, post = scales(prescale_factor, postscale_factor)
    dtypes = (check_dtype(array, "allreduce", rop),)
    name = next_name(st, "allreduce", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=_ALLREDUCE,
        dtypes=dtypes,
        shapes=(array.shape,),
        op=int(rop),
        prescale=pre,
        postscale=post,
        device=device,
        framework_dtypes=dtype_names,
        single_host=single_host(device, dtypes),
    )
    if key is not None:
        if len(known) >= _KNOWN_LIMIT:
            known.clear()
        known[key] = params
    # Tuples of arrays: the garbage collector stops tracking them (lists it would not).
    return _submit(st, params, (array,), (out,), apart=apart)


def allreduce(
    tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    output=None,
) -> np.ndarray:
    """Reduce *tensor* over the ranks of *process_set* (default op: Average).

    Returns:
        The output array (*output* itself where given), the same on every rank.
    """
    return call_and_wait(
        allreduce_async,
        tensor,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        output=output,
    )


def grouped_allreduce(
    tensors: Sequence,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    outputs: Sequence | None = None,
    dtype_names: tuple = (),
) -> list:
    """Reduce a list of arrays as one unit.

    Returns:
        The list of outputs, in the order of *tensors*.
    """
    return call_and_wait(
        grouped_allreduce_async,
        tensors,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        outputs=outputs,
        dtype_names=dtype_names,
    )


# ----------------------------------------------------------------- allgather
def grouped_allgather_async(
    tensors: Sequence,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start gathering a list of arrays as one unit (see :func:`allgather_async`).

    Returns:
        A handle whose result is the list of gathered arrays.
    """
    st = state()
    set_id, _ = members(st, process_set, "allgather")
    checked = [_input(t, "allgather", device) for t in tensors]
    if not checked:
        raise ArgumentError("grouped_allgather: needs at least one array.")
    arrays = [a for a, _ in checked]
    devices = [d for _, d in checked]
    for a in arrays:
        if a.ndim == 0:
            raise ArgumentError(
                "allgather: the array needs at least one dimension (it is "
                "concatenated along dim 0); use x.reshape(1)."
            )
    dtypes = tuple(check_dtype(a, "allgather") for a in arrays)
    name = next_name(st, "allgather", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLGATHER),
        dtypes=dtypes,
        shapes=tuple(a.shape[1:] for a in arrays),
        device=devices[0],
        framework_dtypes=dtype_names,
    )
    return _submit(
        st, params, arrays, None, grouped=True, keepalive=arrays, apart=devices_apart(devices)
    )


def allgather_async(
    tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start concatenating *tensor* along dim 0 over the ranks, in rank order.

    Dim 0 may differ between ranks; the other dimensions must agree.

    Returns:
        A handle whose result is the concatenated array, the same on every rank.
    """
    st = state()
    set_id, _ = members(st, process_set, "allgather")
    array, device = _input(tensor, "allgather", device)
    if array.ndim == 0:
        raise ArgumentError(
            "allgather: the array needs at least one dimension (it is "
            "concatenated along dim 0); use x.reshape(1)."
        )
    dtype = check_dtype(array, "allgather")
    name = next_name(st, "allgather", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLGATHER),
        dtypes=(dtype,),
        shapes=(array.shape[1:],),
        device=device,
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, [array], None, keepalive=array)


def allgather(
    tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> np.ndarray:
    """Concatenate *tensor* along dim 0 over the ranks of *process_set*, in rank order.

    Returns:
        The concatenated array, the same on every rank.
    """
    return call_and_wait(allgather_async, tensor, name, process_set)


def grouped_allgather(
    tensors: Sequence,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
) -> list:
    """Gather a list of arrays as one unit.

    Returns:
        The list of concatenated arrays, in the order of *tensors*.
    """
    return call_and_wait(
        grouped_allgather_async, list(tensors), name, process_set, dtype_names=dtype_names
    )


# ----------------------------------------------------------------- broadcast
def broadcast_async(
    tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    output=None,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start copying *tensor* from *root_rank* to every rank of the set.

    Arguments:
        root_rank: the global rank whose array everyone receives; a member of the set.

    Returns:
        A handle whose result is the root's array (in *output* where given).
    """
    st = state()
    set_id, ranks = members(st, process_set, "broadcast")
    try:
        root = int(root_rank)
    except (TypeError, ValueError):
        raise ArgumentError(f"broadcast: root_rank must be an int, got {root_rank!r}.") from None
    if root not in ranks:
        raise ArgumentError(
            f"broadcast: root_rank {root} is not a rank of the process set "
            f"(ranks {ranks}); pass the global rank of a member."
        )
    if device is None:
        array, device = checked_input(tensor, "broadcast")
        out = checked_output(output, array, device, "broadcast")
    else:  # validated by the adapter, its output too
        array = tensor
        out = checked_output(None, array, device, "broadcast") if output is None else output
    dtype = check_dtype(array, "broadcast")
    name = next_name(st, "broadcast", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.BROADCAST),
        dtypes=(dtype,),
        shapes=(array.shape,),
        root=root,
        device=device,
        framework_dtypes=dtype_names,
    )
    apart = None if device == CPU else devices_apart((device,), (array,), (out,))
    return _submit(st, params, [array], [out], keepalive=(array, out), apart=apart)


def broadcast(
    tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    output=None,
) -> np.ndarray:
    """Copy *tensor* from the global rank *root_rank* to every rank of the set.

    Returns:
        The root's array (*output* itself where given).
    """
    return call_and_wait(broadcast_async, tensor, root_rank, name, process_set, output=output)


# ------------------------------------------------------------------ alltoall
def alltoall_async(
    tensor,
    splits: Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start sending dim-0 slices of *tensor* to the ranks of the set.

    Arguments:
        splits: how many rows go to each rank of the set, in set order (ints
            summing to dim 0); None splits dim 0 evenly (it must divide).

    Returns:
        A handle whose result is ``(output, received_splits)``: the rows every
        rank sent here, in rank order, and how many came from each.
    """
    st = state()
    set_id, ranks = members(st, process_set, "alltoall")
    array, device = _input(tensor, "alltoall", device)
    if array.ndim == 0:
        raise ArgumentError("alltoall: the array needs at least one dimension.")
    n = len(ranks)
    if splits is None:
        if array.shape[0] % n:
            raise ArgumentError(
                f"alltoall: dim 0 ({array.shape[0]}) is not divisible by the "
                f"{n} ranks; pass splits= to say how many rows each rank gets."
            )
        split_arr = np.full(n, array.shape[0] // n, dtype=np.int64)
    else:
        split_arr = np.asarray(splits, dtype=np.int64).reshape(-1)
        if split_arr.size != n or (split_arr < 0).any() or split_arr.sum() != array.shape[0]:
            raise ArgumentError(
                f"alltoall: splits must be {n} non-negative ints summing to dim 0 "
                f"({array.shape[0]}), got {list(split_arr)}."
            )
    dtype = check_dtype(array, "alltoall")
    name = next_name(st, "alltoall", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLTOALL),
        dtypes=(dtype,),
        shapes=(array.shape[1:],),
        device=device,
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, [array], None, splits=split_arr, keepalive=array)


def alltoall(
    tensor,
    splits: Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Send dim-0 slices of *tensor* to the ranks (see :func:`alltoall_async`).

    Returns:
        ``output`` where *splits* is None, else ``(output, received_splits)``.
    """
    output, received = call_and_wait(alltoall_async, tensor, splits, name, process_set)
    return output if splits is None else (output, received)


# ------------------------------------------------------------- reducescatter
def grouped_reducescatter_async(
    tensors: Sequence,
    name: str | None = None,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start a reducescatter of each array of *tensors*, as one unit.

    Returns:
        A handle whose result is the list of this rank's shards (see
        :func:`reducescatter_async`).
    """
    return _reducescatter_async(
        tensors, name, op, prescale_factor, postscale_factor, process_set, True, dtype_names, device
    )


def _reducescatter_async(
    tensors,
    name,
    op,
    prescale_factor,
    postscale_factor,
    process_set,
    grouped: bool,
    dtype_names,
    device,
) -> Handle:
    st = state()
    set_id, _ = members(st, process_set, "reducescatter")
    rop = resolve_op(op, None)
    if rop == Adasum:
        raise ArgumentError("reducescatter: op=Adasum is not supported; use Average or Sum.")
    pre, post = scales(prescale_factor, postscale_factor)
    checked = [_input(t, "reducescatter", device) for t in tensors]
    if not checked:
        raise ArgumentError("grouped_reducescatter: needs at least one array.")
    arrays = [a for a, _ in checked]
    devices = [d for _, d in checked]
    for a in arrays:
        if a.ndim == 0:
            raise ArgumentError("reducescatter: the array needs at least one dimension.")
    dtypes = tuple(check_dtype(a, "reducescatter", rop) for a in arrays)
    name = next_name(st, "reducescatter", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.REDUCESCATTER),
        dtypes=dtypes,
        shapes=tuple(a.shape for a in arrays),
        op=int(rop),
        prescale=pre,
        postscale=post,
        device=devices[0],
        framework_dtypes=dtype_names,
    )
    return _submit(
        st, params, arrays, None, grouped=grouped, keepalive=arrays, apart=devices_apart(devices)
    )


def reducescatter_async(
    tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
    device: str | None = None,
) -> Handle:
    """Start reducing *tensor* over the ranks, each keeping one dim-0 shard (op:
    Average or Sum).

    Returns:
        A handle whose result is this rank's shard: the i-th member of the set
        gets the i-th block of rows, as even as possible (the first
        ``rows % size`` members get one row more).
    """
    return _reducescatter_async(
        [tensor],
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        False,
        dtype_names,
        device,
    )


def reducescatter(
    tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> np.ndarray:
    """Reduce *tensor* over the ranks and keep this rank's dim-0 shard.

    Returns:
        This rank's shard (see :func:`reducescatter_async`).
    """
    return call_and_wait(
        reducescatter_async, tensor, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_reducescatter(
    tensors: Sequence,
    name: str | None = None,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
) -> list:
    """Reducescatter each array of *tensors*, as one unit.

    Returns:
        The list of this rank's shards, in the order of *tensors*.
    """
    return call_and_wait(
        grouped_reducescatter_async,
        tensors,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        dtype_names=dtype_names,
    )


# --------------------------------------------------------- barrier and join
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of *process_set* has called barrier().

    Returns:
        None.
    """
    st = state()
    set_id, _ = members(st, process_set, "barrier")
    name = next_name(st, "barrier", None, set_id)
    params = Params(set_id=set_id, name=name, kind=int(Kind.BARRIER))
    synchronize(_submit(st, params, [], []))


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank joined, contribute zeros.

    Meanwhile the other ranks' allreduces keep working (Adasum included): a
    joined rank adds zeros, and Average still divides by the full size.  Any
    other collective submitted while a rank of its set has joined fails at once
    on every rank that submitted it, whatever its name, as in Horovod.

    A caller that leaves before it returns (an exception arrives while it
    waits: a test's timeout, Ctrl-C) takes its join back: this rank is no
    longer counted as joined, and join() may be called again.

    Arguments:
        device: accepted for Horovod's signature; unused.

    Returns:
        The rank that joined last, the same on every rank.
    """
    st = state()
    handle = None
    try:  # an exception inside _submit may come after the engine took the join
        handle = _submit(st, JOIN_PARAMS, [], [])
        return synchronize(handle)
    except BaseException:
        if handle is None or not handle.done():
            _leave_join(st)  # harmless where the engine never took the join
        raise


def _leave_join(st) -> None:
    leave = Entry(LEAVE_PARAMS, [], [], Handle(LEAVE_PARAMS.name))
    try:
        st.engine.submit(leave)
    except (HorovodInternalError, ValueError):
        pass  # the engine has stopped (nothing is left to take back), or a leave is queued
