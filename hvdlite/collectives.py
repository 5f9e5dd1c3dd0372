"""Collectives on numpy arrays: Horovod's names and arguments, over the engine.

Every ``*_async`` function validates its arguments on the calling thread
(ValueError naming the fix), submits one engine entry and returns a
:class:`~hvdlite.handles.Handle`; the plain spelling waits for it.  Framework
adapters call the same functions with zero-copy views of their tensors and,
for in-place ops, ``output=`` set to the input itself.

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

Every ``*_async`` function returns a :class:`~hvdlite.handles.Handle`, a
``concurrent.futures.Future`` whose result is what the blocking form returns.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence

import numpy as np

from .device import arrays as _device
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
#: How many argument combinations of named allreduces are remembered (then afresh).
_KNOWN_LIMIT = 1024


def _members(st, process_set: ProcessSet, what: str) -> tuple[int, list[int]]:
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


def _name(st, op: str, name: str | None, set_id: int = 0) -> str:
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


def _array(x, what: str) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        if _device.device_of(x) != "cpu":  # CuPy arrays, torch CUDA tensors, DLPack
            return _device_submission().engine_array(x, what)
        x = np.asarray(x)
    if not x.flags.c_contiguous:
        raise ArgumentError(
            f"{what}: the array is not C-contiguous; pass "
            "np.ascontiguousarray(x) (hvdlite never copies silently)."
        )
    return x


def _output(out, like: np.ndarray, what: str) -> np.ndarray:
    if out is like and type(like) is np.ndarray and like.flags.writeable:
        return out  # in place: _array has checked the rest
    if not isinstance(like, np.ndarray):
        if out is like:  # in place on a device: _array made and checked it
            return out
        return _device_submission().engine_output(out, like, what)
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
    st, params: Params, inputs, outputs, grouped=False, splits=None, payload=None, keepalive=None
) -> Handle:
    ready = None
    for array in inputs:
        if type(array) is not np.ndarray:  # a device array (or a numpy subclass)
            params, ready = _device_submission().prepare(params, inputs, outputs)
            break
    handle = Handle(params.name, keepalive)
    entry = Entry(params, inputs, outputs, handle, grouped, splits, payload)
    entry.ready = ready
    return st.engine.submit(entry, not _calling.sync)


_submission_module = None


def _device_submission():
    """The device path's submission side (imported on the first device array)."""
    global _submission_module
    if _submission_module is None:
        from .device import submission

        _submission_module = submission
    return _submission_module


def submit_control(kind: Kind, name: str, extra: tuple, payload=None) -> Handle:
    """Submit a control message of the global set (every rank, same *name*)."""
    st = state()
    params = Params(set_id=GLOBAL_SET_ID, name=name, kind=int(kind), extra=extra)
    return _submit(st, params, [], [], payload=payload)


def _reduction_op(op, average, what: str, set_size: int) -> ReduceOp:
    rop = resolve_op(op, average)
    if rop == Adasum and set_size & (set_size - 1):
        raise ArgumentError(
            f"{what}: op=Adasum needs a power-of-two number of ranks, the "
            f"process set has {set_size}; use op=Average or run on 2, 4, 8... "
            "ranks."
        )
    return rop


def _scales(prescale_factor, postscale_factor) -> tuple[float, float]:
    try:
        return float(prescale_factor), float(postscale_factor)
    except (TypeError, ValueError):
        raise ArgumentError("prescale_factor and postscale_factor must be numbers.") from None


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
    set_id, ranks = _members(st, process_set, what)
    rop = _reduction_op(op, average, what, len(ranks))
    pre, post = _scales(prescale_factor, postscale_factor)
    arrays = [_array(t, what) for t in tensors]
    if not arrays:
        raise ArgumentError(f"{what}: needs at least one array.")
    if outputs is None:
        outputs = [None] * len(arrays)
    if len(outputs) != len(arrays):
        raise ArgumentError(f"{what}: got {len(arrays)} arrays but {len(outputs)} outputs.")
    outs = [_output(o, a, what) for o, a in zip(outputs, arrays)]
    dtypes = tuple(check_dtype(a, what, rop) for a in arrays)
    name = _name(st, "allreduce", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=_ALLREDUCE,
        dtypes=dtypes,
        shapes=tuple(a.shape for a in arrays),
        op=int(rop),
        prescale=pre,
        postscale=post,
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, arrays, outs, grouped=True, keepalive=(arrays, outs))


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
    array = _array(tensor, "allreduce")
    out = _output(output, array, "allreduce")
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
            type(array),
            dtype_names,
        )
        try:
            params = known.get(key)
        except TypeError:  # an unhashable argument: checked below, every time
            params = key = None
        if params is not None:
            return _submit(st, params, (array,), (out,))
    set_id, ranks = _members(st, process_set, "allreduce")
    rop = _reduction_op(op, average, "allreduce", len(ranks))
    pre, post = _scales(prescale_factor, postscale_factor)
    dtype = check_dtype(array, "allreduce", rop)
    name = _name(st, "allreduce", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=_ALLREDUCE,
        dtypes=(dtype,),
        shapes=(array.shape,),
        op=int(rop),
        prescale=pre,
        postscale=post,
        framework_dtypes=dtype_names,
    )
    if key is not None:
        if len(known) >= _KNOWN_LIMIT:
            known.clear()
        if type(array) is not np.ndarray:  # remembered with its device: no _replace per call
            params = params._replace(device=_device.device_of(array))
        known[key] = params
    # Tuples of arrays: the garbage collector stops tracking them (lists it would not).
    return _submit(st, params, (array,), (out,))


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
    )


# ----------------------------------------------------------------- allgather
def grouped_allgather_async(
    tensors: Sequence,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
) -> Handle:
    """Start gathering a list of arrays as one unit (see :func:`allgather_async`).

    Returns:
        A handle whose result is the list of gathered arrays.
    """
    st = state()
    set_id, _ = _members(st, process_set, "allgather")
    arrays = [_array(t, "allgather") for t in tensors]
    if not arrays:
        raise ArgumentError("grouped_allgather: needs at least one array.")
    for a in arrays:
        if a.ndim == 0:
            raise ArgumentError(
                "allgather: the array needs at least one dimension (it is "
                "concatenated along dim 0); use x.reshape(1)."
            )
    dtypes = tuple(check_dtype(a, "allgather") for a in arrays)
    name = _name(st, "allgather", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLGATHER),
        dtypes=dtypes,
        shapes=tuple(a.shape[1:] for a in arrays),
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, arrays, None, grouped=True, keepalive=arrays)


def allgather_async(
    tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
) -> Handle:
    """Start concatenating *tensor* along dim 0 over the ranks, in rank order.

    Dim 0 may differ between ranks; the other dimensions must agree.

    Returns:
        A handle whose result is the concatenated array, the same on every rank.
    """
    st = state()
    set_id, _ = _members(st, process_set, "allgather")
    array = _array(tensor, "allgather")
    if array.ndim == 0:
        raise ArgumentError(
            "allgather: the array needs at least one dimension (it is "
            "concatenated along dim 0); use x.reshape(1)."
        )
    dtype = check_dtype(array, "allgather")
    name = _name(st, "allgather", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLGATHER),
        dtypes=(dtype,),
        shapes=(array.shape[1:],),
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
    tensors: Sequence, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list:
    """Gather a list of arrays as one unit.

    Returns:
        The list of concatenated arrays, in the order of *tensors*.
    """
    return call_and_wait(grouped_allgather_async, list(tensors), name, process_set)


# ----------------------------------------------------------------- broadcast
def broadcast_async(
    tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    *,
    output=None,
    dtype_names: tuple = (),
) -> Handle:
    """Start copying *tensor* from *root_rank* to every rank of the set.

    Arguments:
        root_rank: the global rank whose array everyone receives; a member of the set.

    Returns:
        A handle whose result is the root's array (in *output* where given).
    """
    st = state()
    set_id, ranks = _members(st, process_set, "broadcast")
    try:
        root = int(root_rank)
    except (TypeError, ValueError):
        raise ArgumentError(f"broadcast: root_rank must be an int, got {root_rank!r}.") from None
    if root not in ranks:
        raise ArgumentError(
            f"broadcast: root_rank {root} is not a rank of the process set "
            f"(ranks {ranks}); pass the global rank of a member."
        )
    array = _array(tensor, "broadcast")
    out = _output(output, array, "broadcast")
    dtype = check_dtype(array, "broadcast")
    name = _name(st, "broadcast", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.BROADCAST),
        dtypes=(dtype,),
        shapes=(array.shape,),
        root=root,
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, [array], [out], keepalive=(array, out))


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
    set_id, ranks = _members(st, process_set, "alltoall")
    array = _array(tensor, "alltoall")
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
    name = _name(st, "alltoall", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.ALLTOALL),
        dtypes=(dtype,),
        shapes=(array.shape[1:],),
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
) -> Handle:
    """Start a reducescatter of each array of *tensors*, as one unit.

    Returns:
        A handle whose result is the list of this rank's shards (see
        :func:`reducescatter_async`).
    """
    return _reducescatter_async(
        tensors, name, op, prescale_factor, postscale_factor, process_set, True, dtype_names
    )


def _reducescatter_async(
    tensors, name, op, prescale_factor, postscale_factor, process_set, grouped: bool, dtype_names
) -> Handle:
    st = state()
    set_id, _ = _members(st, process_set, "reducescatter")
    rop = resolve_op(op, None)
    if rop == Adasum:
        raise ArgumentError("reducescatter: op=Adasum is not supported; use Average or Sum.")
    pre, post = _scales(prescale_factor, postscale_factor)
    arrays = [_array(t, "reducescatter") for t in tensors]
    if not arrays:
        raise ArgumentError("grouped_reducescatter: needs at least one array.")
    for a in arrays:
        if a.ndim == 0:
            raise ArgumentError("reducescatter: the array needs at least one dimension.")
    dtypes = tuple(check_dtype(a, "reducescatter", rop) for a in arrays)
    name = _name(st, "reducescatter", name, set_id)
    params = Params(
        set_id=set_id,
        name=name,
        kind=int(Kind.REDUCESCATTER),
        dtypes=dtypes,
        shapes=tuple(a.shape for a in arrays),
        op=int(rop),
        prescale=pre,
        postscale=post,
        framework_dtypes=dtype_names,
    )
    return _submit(st, params, arrays, None, grouped=grouped, keepalive=arrays)


def reducescatter_async(
    tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
    *,
    dtype_names: tuple = (),
) -> Handle:
    """Start reducing *tensor* over the ranks, each keeping one dim-0 shard (op:
    Average or Sum).

    Returns:
        A handle whose result is this rank's shard: the i-th member of the set
        gets the i-th block of rows, as even as possible (the first
        ``rows % size`` members get one row more).
    """
    return _reducescatter_async(
        [tensor], name, op, prescale_factor, postscale_factor, process_set, False, dtype_names
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
    )


# --------------------------------------------------------- barrier and join
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of *process_set* has called barrier().

    Returns:
        None.
    """
    st = state()
    set_id, _ = _members(st, process_set, "barrier")
    name = _name(st, "barrier", None, set_id)
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
