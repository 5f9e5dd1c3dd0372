"""Horovod's torch collectives on CPU and CUDA tensors, on top of the engine.

Every op is one engine call: the tensor's own memory goes to the engine as a
numpy view (``Tensor.numpy()`` shares storage; a CUDA tensor as a device view),
so nothing is copied unless the tensor is non-contiguous (out-of-place ops copy
it; in-place ops refuse it) or float16/bfloat16 (reductions run on a float32
copy made by torch and are cast back, except on CPU where the set spans nodes:
there they go as they are and cross as 16 bits; broadcast, allgather and
alltoall move bfloat16's raw bits as int16).

An ``*_async`` op returns the engine's :class:`hvdlite.Handle` (a
``concurrent.futures.Future``) carrying a converter; ``synchronize(handle)``
waits and returns torch tensors.  The non-async spellings are
``synchronize(<op>_async(...))``; ``allreduce``, ``allgather``, ``broadcast``,
``alltoall``, ``reducescatter`` and their grouped forms are differentiable
(their autograd Functions are at the end of this module).

Cross-rank contract (as in Horovod): every rank of the process set submits
the same collectives with matching dtypes, shapes (dim 0 excepted for
allgather and alltoall), ops, roots and scale factors; with ``name=None``
names come from per-op counters, so unnamed collectives must be submitted in
the same order on every rank.  A mismatch fails the collective on every rank
with :class:`hvdlite.HorovodInternalError`; an invalid argument raises
:class:`hvdlite.ArgumentError` (a ValueError) on the calling rank at once.

Arguments shared by the collectives (each function lists only its own):

- *tensor* / *tensors*: a strided ``torch.Tensor`` on the CPU or a CUDA device
  (uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32,
  float64 or bool), or a list of them for the ``grouped_*`` forms, which are
  negotiated and fused as one unit.  Only the differentiable spellings
  record gradients.
- *name*: the name the ranks agree on, qualified by the op (so
  ``allreduce(x, name="w")`` and ``broadcast(y, 0, name="w")`` never collide);
  None takes the op's next automatic name.
- *op*: a :class:`~hvdlite.ops.ReduceOp`: ``Average`` (the default), ``Sum``,
  ``Adasum`` (a power-of-two number of ranks), ``Min``, ``Max``, ``Product``;
  reducescatter refuses Adasum.  *average*: Horovod's deprecated
  boolean spelling (True = Average); giving it with *op* raises ValueError.
- *prescale_factor*, *postscale_factor*: multiply every input before the
  reduction and the result after it.
- *process_set*: a registered :class:`~hvdlite.process_sets.ProcessSet`; only
  its members call, and ranks (``root_rank``) are global ranks.
- *compression* (the differentiable reductions): a compressor such as
  ``Compression.fp16``: the tensor is cast for the wire and the result cast
  back; every rank must pass the same one.

Results stay on the input's device.  Out-of-place results are new tensors of
the input's dtype; in-place ops (a trailing ``_``) refuse non-contiguous
tensors.  Every ``*_async`` op returns a :class:`~hvdlite.handles.Handle`:
:func:`poll` says whether it is done, :func:`synchronize` waits for it and
returns the tensor(s) its docstring names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from hvdlite import basics as _basics
from hvdlite import collectives as _collectives
from hvdlite.device.arrays import CPU, CUDA
from hvdlite.ops import Average, ReduceOp, Sum
from hvdlite.process_sets import ProcessSet, global_process_set
from hvdlite.torch import _device
from hvdlite.util.dtypes import BFLOAT16 as _BFLOAT16
from hvdlite.torch._handles import (
    _NUMPY_DTYPES,
    _all_of,
    _array,
    _attach,
    _check,
    _contiguous,
    _in_place,
    _named,
    _source,
    _target,
    _tensor,
    poll,
    synchronize,
)
from hvdlite.torch.casts import Compressor, NoneCompressor
from hvdlite.exceptions import ArgumentError
from hvdlite.util import half_casts as _half_casts

if TYPE_CHECKING:  # annotations only (postponed by the __future__ import)
    from collections.abc import Sequence

    from hvdlite.handles import Handle

#: Submit and wait at once, driving the engine on this thread (no hand-off).
_now = _collectives.call_and_wait

__all__ = [
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "allgather",
    "allgather_async",
    "grouped_allgather",
    "grouped_allgather_async",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "alltoall",
    "alltoall_async",
    "reducescatter",
    "reducescatter_async",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "sparse_allreduce_async",
    "poll",
    "synchronize",
    "join",
    "barrier",
]

# --------------------------------------------------------------------- allreduce
#: Reduced through a float32 copy made by torch: numpy has no bfloat16, and its
#: float16 <-> float32 casts are far slower than torch's for small (subnormal)
#: values, which gradients often are.  Same precision: the engine sums float16 in
#: float32 anyway.  CUDA float16 tensors are the exception (:func:`_widened`).
_WIDENED = (torch.bfloat16, torch.float16)


def _widened(dtype: torch.dtype, cuda: bool, process_set=None) -> bool:
    """Whether a tensor of *dtype* (on a CUDA device where *cuda*) travels as a
    float32 copy.  A CUDA float16 tensor does not: the device path casts it inside
    its fused copies and scales it in float16, as Horovod does on CUDA (its suite
    checks that bit for bit).  Nor does a CPU float16 or bfloat16 one whose
    allreduce over *process_set* crosses nodes as 16 bits (bfloat16 then as
    numpy's, :func:`_host_view`)."""
    if dtype not in _WIDENED:
        return False
    if cuda:
        return dtype == torch.bfloat16
    return process_set is None or not _basics.halves_cross_as_16_bits(process_set)


def _host_view(tensor: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous CPU tensor; bfloat16 as numpy's bfloat16
    (ml_dtypes'), which the engine reduces in float32."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(_BFLOAT16)
    return tensor.numpy()


def _cast(src: np.ndarray, out: np.ndarray) -> None:
    torch.from_numpy(out).copy_(torch.from_numpy(src))


# The engine's float16 <-> float32 conversions through torch (hardware casts).
_half_casts.register(_cast, _cast)


def _framework_dtypes(tensors) -> tuple:
    """The torch dtype names of *tensors* where the engine is handed another dtype
    for one of them (float16 and bfloat16 reduced as float32 copies, bfloat16 moved
    as int16 bits), for the ranks to agree on as Horovod's do; () otherwise, where
    the engine compares the dtypes it sees."""
    if any(t.dtype in _WIDENED for t in tensors):
        return tuple(str(t.dtype).removeprefix("torch.") for t in tensors)
    return ()


def _allreduce(
    src,
    out,
    cuda: bool,
    average,
    name,
    op,
    prescale_factor,
    postscale_factor,
    process_set,
    returned,
):
    """Submit the allreduce of one tensor that :func:`_check` passed (*cuda*: what
    it found) into *out* (*src* itself in place), validated no further; synchronize
    returns *returned* (the user's tensor for in-place ops)."""
    device = CUDA if cuda else CPU
    name = _named("allreduce", name)
    if _widened(src.dtype, cuda, process_set):  # reduce a float32 copy in place, cast back
        wide = src.float()
        arr = _view(wide, cuda)
        handle = _collectives.submit_allreduce(
            arr,
            arr,
            device,
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
            _framework_dtypes([src]),
        )

        def convert(_result):
            out.copy_(wide)
            return returned

        return _attach(handle, convert)
    if not cuda:  # the lean, common case
        arr = _host_view(src)
        output = arr if out is src else _host_view(out)
    elif out is src:
        # In place on a CUDA tensor: its view made once per tensor (the handle holds
        # *returned*, the caller's tensor, until the collective completes).
        arr = output = _device.held_view(returned)
    else:
        arr, output = _view(src, cuda), _view(out, cuda)
    handle = _collectives.submit_allreduce(
        arr, output, device, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return _attach(handle, lambda _result: returned)


def _engine_device(tensor: torch.Tensor) -> str:
    """Where a tensor :func:`_check` has passed lives, as the engine names it."""
    return CPU if tensor.is_cpu else CUDA


def _one_device(tensors) -> str | None:
    """The engine's device of *tensors* (checked) where they share one, else None:
    the engine then refuses them, naming the devices."""
    devices = {_engine_device(t) for t in tensors}
    return devices.pop() if len(devices) == 1 else None


def _view(tensor: torch.Tensor, cuda: bool):
    """The engine's view of a contiguous tensor of a numpy dtype (a CUDA one where
    *cuda*, as :func:`_check` found)."""
    return _device.engine_view(tensor) if cuda else _host_view(tensor)


def _grouped_allreduce(
    sources,
    cudas,
    outputs,
    average,
    name,
    op,
    prescale_factor,
    postscale_factor,
    process_set,
    returned,
):
    """Submit one grouped allreduce of *sources* (checked by :func:`_check`, whose
    answers *cudas* are) into *outputs*, the general way (float16 and bfloat16 as
    float32 copies); synchronize returns *returned*."""
    ins, outs, casts = [], [], []
    for src, cuda, out in zip(sources, cudas, outputs, strict=True):
        if _widened(src.dtype, cuda, process_set):  # a float32 copy, cast back later
            wide = src.float()
            arr = _view(wide, cuda)
            ins.append(arr)
            outs.append(arr)
            casts.append((out, wide))
        else:
            ins.append(_view(src, cuda))
            outs.append(ins[-1] if out is src else _view(out, cuda))
    args = (average, _named("allreduce", name), op, prescale_factor, postscale_factor, process_set)
    dtype_names = _framework_dtypes(sources)
    devices = set(cudas)
    if len(devices) == 1:  # validated here: the engine takes the views as they are
        device = CUDA if devices.pop() else CPU
        handle = _collectives.submit_grouped_allreduce(ins, outs, device, *args, dtype_names)
    else:  # none, or on several devices: refused there, saying which
        handle = _collectives.grouped_allreduce_async(
            ins, *args, outputs=outs, dtype_names=dtype_names
        )

    def convert(_result):
        for out, wide in casts:
            out.copy_(wide)
        return returned

    return _attach(handle, convert)


#: Dtypes whose tensors the engine reduces through their own numpy view.
_AS_IS = _NUMPY_DTYPES - frozenset(_WIDENED)


def _plain_views(tensors) -> list | None:
    """The numpy views of *tensors* when every one is a contiguous CPU tensor
    that the engine reduces as it is (not float16 or bfloat16, which travel
    widened), else None: the caller takes the general path, which also names
    what is wrong with a tensor."""
    arrays = []
    for t in tensors:
        if (
            t.__class__ is not torch.Tensor
            or not t.is_cpu
            or t.layout is not torch.strided
            or t.dtype not in _AS_IS
            or not t.is_contiguous()
        ):
            return None
        arrays.append((t.detach() if t.requires_grad else t).numpy())
    return arrays


#: Dtypes whose CUDA tensors the engine reduces through their own device view
#: (float16 too: see :func:`_widened`).
_CUDA_AS_IS = _AS_IS | {torch.float16}


def _cuda_views(tensors) -> list | None:
    """The engine's device views of *tensors* when every one is a contiguous CUDA
    tensor that the engine reduces as it is, else None (the general path).  The
    caller's handle must hold *tensors* until the collective completes."""
    arrays = []
    for t in tensors:
        if (
            t.__class__ is not torch.Tensor
            or not t.is_cuda
            or t.layout is not torch.strided
            or t.dtype not in _CUDA_AS_IS
            or not t.is_contiguous()
        ):
            return None
        arrays.append(_device.held_view(t))
    return arrays


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start reducing *tensor* over the ranks of *process_set* into a new tensor.

    Returns:
        A handle; ``synchronize(handle)`` returns a new tensor of *tensor*'s
        shape, dtype and device holding the reduction, the same on every rank.
    """
    cuda = _check(tensor, "allreduce_async")
    src = _contiguous(tensor)
    out = torch.empty_like(src)
    return _allreduce(
        src, out, cuda, average, name, op, prescale_factor, postscale_factor, process_set, out
    )


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start an in-place allreduce: the reduction overwrites *tensor* on every rank.

    Returns:
        A handle; ``synchronize(handle)`` returns *tensor* itself, holding the
        reduction (float16 and bfloat16 are copied back by that call, so read
        *tensor* only after it).
    """
    cuda = _check(tensor, "allreduce_async_")
    dst = _in_place(tensor, "allreduce_async_")
    return _allreduce(
        dst, dst, cuda, average, name, op, prescale_factor, postscale_factor, process_set, tensor
    )


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start one allreduce of a list of tensors into new tensors, as one unit.

    Returns:
        A handle; ``synchronize(handle)`` returns a list of new tensors, one per
        input in order, each like :func:`allreduce_async`'s result.
    """
    srcs, cudas = [], []
    for t in tensors:
        cudas.append(_check(t, "grouped_allreduce_async"))
        srcs.append(_contiguous(t))
    outs = [torch.empty_like(s) for s in srcs]
    return _grouped_allreduce(
        srcs, cudas, outs, average, name, op, prescale_factor, postscale_factor, process_set, outs
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start an in-place allreduce of a list of tensors, as one unit: each
    reduction overwrites its input on every rank.

    Returns:
        A handle; ``synchronize(handle)`` returns the list of the input tensors
        themselves, holding the reductions (float16 and bfloat16 are copied
        back by that call).
    """
    tensors = list(tensors)
    arrays, device = _plain_views(tensors), CPU
    if arrays is None and tensors and tensors[0].__class__ is torch.Tensor and tensors[0].is_cuda:
        arrays, device = _cuda_views(tensors), CUDA
    if arrays:  # the common case (a gradient bucket): validated here, converted no further
        handle = _collectives.submit_grouped_allreduce(
            arrays,
            arrays,
            device,
            average,
            _named("allreduce", name),
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
        return _attach(handle, lambda _result: tensors)
    dsts, cudas = [], []
    for t in tensors:
        cudas.append(_check(t, "grouped_allreduce_async_"))
        dsts.append(_in_place(t, "grouped_allreduce_async_"))
    return _grouped_allreduce(
        dsts,
        cudas,
        dsts,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        tensors,
    )


# ----------------------------------------------------------- allgather, broadcast


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Start concatenating every rank's *tensor* along dim 0, in rank order.

    Dim 0 may differ between ranks; the other dimensions must agree.

    Returns:
        A handle; ``synchronize(handle)`` returns a new tensor of *tensor*'s
        dtype and device, of shape ``[sum of every rank's dim 0, *rest]``, the
        same on every rank.
    """
    src = _source(tensor, "allgather_async")
    handle = _collectives.allgather_async(
        _array(src),
        name=_named("allgather", name),
        process_set=process_set,
        dtype_names=_framework_dtypes([src]),
        device=_engine_device(src),
    )
    return _attach(handle, lambda result: _tensor(result, src.dtype))


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start allgathering a list of tensors as one unit (see :func:`allgather_async`).

    Returns:
        A handle; ``synchronize(handle)`` returns a list of new tensors, the
        concatenation of each input in order, the same on every rank.
    """
    srcs = [_source(t, "grouped_allgather_async") for t in tensors]
    handle = _collectives.grouped_allgather_async(
        [_array(s) for s in srcs],
        name=_named("allgather", name),
        process_set=process_set,
        dtype_names=_framework_dtypes(srcs),
        device=_one_device(srcs),
    )
    dtypes = [s.dtype for s in srcs]
    return _attach(
        handle, lambda result: [_tensor(r, d) for r, d in zip(result, dtypes, strict=True)]
    )


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start copying *root_rank*'s *tensor* into a new tensor on every rank.

    Arguments:
        root_rank: the global rank whose tensor every rank receives; a member
            of *process_set*.  Every rank passes a tensor of the same shape
            and dtype.

    Returns:
        A handle; ``synchronize(handle)`` returns a new tensor holding the
        root's values (a copy on the root too), on the input's device.
    """
    src = _source(tensor, "broadcast_async")
    out = torch.empty_like(src)
    handle = _collectives.broadcast_async(
        _array(src),
        root_rank,
        name=_named("broadcast", name),
        process_set=process_set,
        output=_array(out),
        dtype_names=_framework_dtypes([src]),
        device=_engine_device(src),
    )
    return _attach(handle, lambda _result: out)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start an in-place broadcast: the root's values overwrite *tensor* on the
    other ranks (see :func:`broadcast_async` for *root_rank*).

    Returns:
        A handle; ``synchronize(handle)`` returns *tensor* itself, now holding
        the root's values.
    """
    dst = _target(tensor, "broadcast_async_")
    arr = _array(dst)
    handle = _collectives.broadcast_async(
        arr,
        root_rank,
        name=_named("broadcast", name),
        process_set=process_set,
        output=arr,
        dtype_names=_framework_dtypes([dst]),
        device=_engine_device(dst),
    )
    return _attach(handle, lambda _result: tensor)


# ------------------------------------------------------ alltoall, reducescatter


def _splits(splits) -> list[int] | None:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        kind = (
            "integer"
            if not splits.is_floating_point()
            and not splits.is_complex()
            and splits.dtype != torch.bool
            else str(splits.dtype)
        )
        splits = splits.tolist()
    else:
        kind = (
            "integer"
            if np.asarray(splits).dtype.kind in "iu" or len(splits) == 0
            else str(np.asarray(splits).dtype)
        )
    if kind != "integer":
        # As Horovod: rows are counted in integers; a float tensor is a mistake to name,
        # not to round (torch.empty(n) holds whatever the memory held).
        raise ArgumentError(
            f"alltoall: splits must hold integers, got {kind}; pass e.g. "
            "torch.tensor(splits, dtype=torch.int32)."
        )
    return [int(s) for s in np.asarray(splits).reshape(-1)]


def alltoall_async(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start sending dim-0 slices of *tensor* to the ranks and receiving theirs.

    Arguments:
        splits: how many rows go to each member of *process_set*, in set order
            (ints summing to dim 0; a list or an int tensor); None splits dim 0
            evenly (the set size must divide it).

    Returns:
        A handle; ``synchronize(handle)`` returns ``(output, received_splits)``:
        a new tensor of *tensor*'s dtype and device with the rows every member
        sent here, in rank order, and an int32 tensor of how many came from
        each, on the device of *splits* when it is a tensor (else the CPU).
    """
    src = _source(tensor, "alltoall_async")
    splits_device = splits.device if isinstance(splits, torch.Tensor) else None
    handle = _collectives.alltoall_async(
        _array(src),
        splits=_splits(splits),
        name=_named("alltoall", name),
        process_set=process_set,
        dtype_names=_framework_dtypes([src]),
        device=_engine_device(src),
    )

    def convert(result):
        output, received = result
        return (
            _tensor(output, src.dtype),
            torch.as_tensor(np.asarray(received), dtype=torch.int32, device=splits_device),
        )

    return _attach(handle, convert)


def _reducescatter(srcs, name, op, prescale_factor, postscale_factor, process_set, grouped):
    # float16 and bfloat16 on CPU go as they are where the set spans nodes: the
    # engine's 16-bit wire carries them (:func:`_widened`), 2 bytes per value
    widened = [_widened(s.dtype, s.is_cuda, process_set) for s in srcs]
    wide = [s.float() if w else s for s, w in zip(srcs, widened, strict=True)]
    kwargs = dict(
        name=_named("reducescatter", name),
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
        dtype_names=_framework_dtypes(srcs),
        device=_one_device(srcs),
    )
    if grouped:
        handle = _collectives.grouped_reducescatter_async(
            [_view(w, w.is_cuda) for w in wide], **kwargs
        )
    else:
        handle = _collectives.reducescatter_async(_view(wide[0], wide[0].is_cuda), **kwargs)

    def back(result, src, widened):
        if widened:
            return _tensor(result, None).to(src.dtype)
        if src.dtype == torch.bfloat16 and not src.is_cuda:  # numpy's bfloat16, as bits
            return _tensor(np.asarray(result).view(np.int16), torch.bfloat16)
        return _tensor(result, None)

    if grouped:
        return _attach(
            handle, lambda result: [back(*args) for args in zip(result, srcs, widened, strict=True)]
        )
    return _attach(handle, lambda result: back(result, srcs[0], widened[0]))


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reducing *tensor* over the ranks, each keeping one dim-0 shard.

    Returns:
        A handle; ``synchronize(handle)`` returns a new tensor of *tensor*'s
        dtype and device: member i of the set gets the i-th block of rows of
        the reduction, as even as possible (the first ``rows % size`` members
        get one row more).
    """
    src = _source(tensor, "reducescatter_async")
    return _reducescatter(
        [src], name, op, prescale_factor, postscale_factor, process_set, grouped=False
    )


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start a reducescatter of each tensor of a list, as one unit.

    Returns:
        A handle; ``synchronize(handle)`` returns the list of this rank's
        shards, in input order (see :func:`reducescatter_async`).
    """
    srcs = [_source(t, "grouped_reducescatter_async") for t in tensors]
    return _reducescatter(
        srcs, name, op, prescale_factor, postscale_factor, process_set, grouped=True
    )


# -------------------------------------------------------------------- sparse


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None,
    op: ReduceOp | None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start reducing a sparse COO *tensor*: two allgathers, of its values and indices.

    Every rank passes a sparse tensor of the same dense size; the number of
    entries may differ.  *op* is Average (or None) or Sum; *name* (or None)
    names both allgathers (``<name>.values``, ``<name>.indices``).

    Returns:
        A handle; ``synchronize(handle)`` (or ``handle()``, Horovod's spelling)
        returns a new, uncoalesced sparse tensor of the same size holding every
        rank's entries (duplicates add up when coalesced), the values divided
        by the set's size for Average; the same on every rank.
    """
    if not isinstance(tensor, torch.Tensor) or not tensor.is_sparse:
        raise ArgumentError("hvdlite.torch.sparse_allreduce_async: expected a sparse COO tensor")
    if op not in (Average, Sum, None):
        raise ArgumentError(
            f"hvdlite.torch.sparse_allreduce_async: op must be Average or Sum, got {op!r}"
        )
    sparse = tensor.coalesce()
    # allgather concatenates dim 0, so gather indices as (nnz, ndim) rows.
    indices = sparse.indices().t().contiguous()
    values = sparse.values().contiguous()
    idx_name = None if name is None else f"{name}.indices"
    val_name = None if name is None else f"{name}.values"
    values_handle = allgather_async(values, name=val_name, process_set=process_set)
    indices_handle = allgather_async(indices, name=idx_name, process_set=process_set)

    def convert():
        all_values = synchronize(values_handle)
        all_indices = synchronize(indices_handle)
        if op in (Average, None):
            all_values = all_values / process_set.size()
        return torch.sparse_coo_tensor(
            all_indices.t(), all_values, tensor.size(), check_invariants=True
        )

    return _all_of([values_handle, indices_handle], convert)


# -------------------------------------------------------------------- control


def join(device: int = -1) -> int:
    """This rank has no more data: it contributes zeros to the other ranks'
    allreduces (Average still divides by the full size) until every rank has
    joined; every rank calls it once it is done.

    Arguments:
        device: accepted for Horovod's signature; unused.

    Returns:
        The global rank that joined last, the same on every rank.
    """
    return _collectives.join()


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of *process_set* has called barrier().

    Returns:
        None.
    """
    _collectives.barrier(process_set=process_set)


# ------------------------------------------------------ differentiable spellings


class _Allreduce(torch.autograd.Function):
    """Gradient of an allreduce = the same allreduce of the gradient."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return _now(
            allreduce_async,
            tensor,
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )

    @staticmethod
    def backward(ctx, grad):
        average, op, pre, post, process_set = ctx.args
        reduced = _now(allreduce_async, grad, average, None, op, pre, post, process_set)
        return (reduced,) + (None,) * 6


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.args = (average, op, prescale_factor, postscale_factor, process_set)
        return tuple(
            _now(
                grouped_allreduce_async,
                list(tensors),
                average,
                name,
                op,
                prescale_factor,
                postscale_factor,
                process_set,
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        average, op, pre, post, process_set = ctx.args
        reduced = _now(
            grouped_allreduce_async, list(grads), average, None, op, pre, post, process_set
        )
        return (None,) * 6 + tuple(reduced)


def _own_rows(grads, first_dims: list[int], process_set) -> list[torch.Tensor]:
    """This rank's dim-0 slices of allgathered gradients, averaged over ranks
    (Horovod's convention for the gradient of allgather)."""
    if len(grads) == 1:
        reduced = [_now(allreduce_async, grads[0], op=Average, process_set=process_set)]
    else:
        reduced = _now(grouped_allreduce_async, grads, op=Average, process_set=process_set)
    counts = _now(
        allgather_async, torch.tensor([first_dims], dtype=torch.int64), process_set=process_set
    )
    offsets = counts[: process_set.rank()].sum(dim=0).tolist()
    return [r.narrow(0, int(o), d) for r, o, d in zip(reduced, offsets, first_dims, strict=True)]


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle = allgather_async(tensor, name, process_set)  # validates the tensor
        ctx.first_dim, ctx.process_set = tensor.shape[0], process_set
        return synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        return _own_rows([grad], [ctx.first_dim], ctx.process_set)[0], None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        handle = grouped_allgather_async(list(tensors), name, process_set)
        ctx.first_dims = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grads):
        rows = _own_rows(list(grads), ctx.first_dims, ctx.process_set)
        return (None, None) + tuple(rows)


class _Broadcast(torch.autograd.Function):
    """Gradient reaches the root only: the average of every rank's gradient."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _now(broadcast_async, tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = _now(allreduce_async, grad, op=Average, process_set=ctx.process_set)
        if _basics.rank() != ctx.root_rank:
            reduced.zero_()
        return reduced, None, None, None


class _Alltoall(torch.autograd.Function):
    """Gradient: send each received slice's gradient back where it came from."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _now(alltoall_async, tensor, splits, name, process_set)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _grad_received):
        back, _ = _now(alltoall_async, grad, ctx.received, process_set=ctx.process_set)
        return back, None, None, None


def _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set) -> float:
    """Horovod's factor on the gathered output gradient: the scale factors, times
    the set's size for Sum; an Average is not divided (Horovod's convention)."""
    scale = prescale_factor * postscale_factor
    return scale * process_set.size() if op == Sum else scale


class _Reducescatter(torch.autograd.Function):
    """Gradient, as Horovod defines it: every rank's output gradient, gathered, times
    the scale factors (and the set's size for Sum)."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)
        ctx.process_set = process_set
        return _now(
            reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor
        )

    @staticmethod
    def backward(ctx, grad):
        gathered = _now(allgather_async, grad, process_set=ctx.process_set)
        return gathered * ctx.scale, None, None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.scale = _reducescatter_grad_scale(op, prescale_factor, postscale_factor, process_set)
        ctx.process_set = process_set
        return tuple(
            _now(
                grouped_reducescatter_async,
                list(tensors),
                name,
                op,
                process_set,
                prescale_factor,
                postscale_factor,
            )
        )

    @staticmethod
    def backward(ctx, *grads):
        gathered = _now(grouped_allgather_async, list(grads), process_set=ctx.process_set)
        return (None,) * 5 + tuple(g * ctx.scale for g in gathered)


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce *tensor* over the ranks of *process_set* (default op: Average).

    Differentiable: the gradient is the same allreduce of the gradient, so
    every rank must also run the backward pass.

    Returns:
        A new tensor of *tensor*'s shape, dtype and device holding the
        reduction, the same on every rank.
    """
    compressed, ctx = compression.compress(tensor)
    if torch.is_grad_enabled() and compressed.requires_grad:
        reduced = _Allreduce.apply(
            compressed, average, name, op, prescale_factor, postscale_factor, process_set
        )
    else:  # nothing to differentiate: skip autograd's bookkeeping
        reduced = _now(
            allreduce_async,
            compressed,
            average,
            name,
            op,
            prescale_factor,
            postscale_factor,
            process_set,
        )
    return compression.decompress(reduced, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place allreduce (not differentiable): the reduction overwrites *tensor*.

    Returns:
        *tensor* itself, holding the reduction, the same on every rank.
    """
    return _now(
        allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allreduce a list of tensors as one unit; differentiable (see :func:`allreduce`).

    Returns:
        A list of new tensors, one per input in order, each like
        :func:`allreduce`'s result.
    """
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(
        average, name, op, prescale_factor, postscale_factor, process_set, *[t for t, _ in pairs]
    )
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """In-place allreduce of a list of tensors, as one unit (not differentiable):
    each reduction overwrites its input.

    Returns:
        The list of the input tensors themselves, holding the reductions.
    """
    return _now(
        grouped_allreduce_async_,
        tensors,
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's *tensor* along dim 0, in rank order.

    Dim 0 may differ between ranks; the other dimensions must agree.
    Differentiable: the gradient is this rank's rows of the output gradient
    averaged over the ranks.

    Returns:
        A new tensor of *tensor*'s dtype and device, of shape
        ``[sum of every rank's dim 0, *rest]``, the same on every rank.
    """
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allgather a list of tensors as one unit; differentiable (see :func:`allgather`).

    Returns:
        A list of new tensors, the concatenation of each input in order, the
        same on every rank.
    """
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Copy *root_rank*'s *tensor* to every rank of *process_set*.

    Differentiable: the root's gradient is the gradient averaged over the
    ranks, the other ranks' is zero.

    Arguments:
        root_rank: the global rank whose tensor every rank receives; a member
            of *process_set*.  Every rank passes a tensor of the same shape
            and dtype.

    Returns:
        A new tensor holding the root's values, on the input's device.
    """
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """In-place broadcast (not differentiable): the root's values overwrite
    *tensor* on the other ranks (see :func:`broadcast` for *root_rank*).

    Returns:
        *tensor* itself, holding the root's values.
    """
    return _now(broadcast_async_, tensor, root_rank, name, process_set)


def alltoall(
    tensor: torch.Tensor,
    splits: Sequence[int] | torch.Tensor | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Send dim-0 slices of *tensor* to the ranks and receive theirs.

    Differentiable: the gradient goes back to the rank each row came from.

    Arguments:
        splits: as for :func:`alltoall_async` (None: even slices).

    Returns:
        The received rows in rank order, a new tensor of *tensor*'s dtype and
        device; with *splits* given, ``(output, received_splits)`` (an int32
        CPU tensor of how many rows came from each member).
    """
    output, received = _Alltoall.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce *tensor* over the ranks and keep this rank's dim-0 shard.

    Differentiable, with Horovod's rule: the gradient is every rank's output
    gradient gathered, times the scale factors (and the set's size for Sum).

    Returns:
        This rank's shard, a new tensor of *tensor*'s dtype and device (see
        :func:`reducescatter_async` for which rows).
    """
    compressed, ctx = compression.compress(tensor)
    shard = _Reducescatter.apply(
        compressed, name, op, process_set, prescale_factor, postscale_factor
    )
    return compression.decompress(shard, ctx)


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatter each tensor of a list, as one unit; differentiable (see
    :func:`reducescatter`).

    Returns:
        The list of this rank's shards, in input order.
    """
    pairs = [compression.compress(t) for t in tensors]
    shards = _GroupedReducescatter.apply(
        name, op, process_set, prescale_factor, postscale_factor, *[t for t, _ in pairs]
    )
    return [compression.decompress(s, ctx) for s, (_, ctx) in zip(shards, pairs, strict=True)]
