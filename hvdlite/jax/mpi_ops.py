"""Horovod's collectives on JAX arrays, eagerly and inside ``jax.jit``.

Eagerly, each op is one engine call on the arrays' own memory where JAX
allows it (see :mod:`hvdlite.jax._arrays`: a CPU array is read through a
zero-copy view, a GPU array goes to the device path through DLPack) and
returns new JAX arrays on the input's device (JAX arrays are immutable, so
there are no in-place spellings).  The ``*_async`` forms return a
:class:`hvdlite.Handle`; :func:`synchronize` waits and returns the JAX
result.

Inside ``jax.jit`` (any traced value: ``jit``, ``grad``) the blocking forms
become ordered host callbacks (:mod:`hvdlite.jax._traced`): every rank runs
them in program order; their inputs and outputs are copied between XLA and
the host.  Handles cannot live in a traced function: the ``*_async`` forms,
:func:`join` and :func:`barrier` refuse traced values with an error that
says so.  allgather and alltoall inside jit need the same dim 0 on every
rank (the traced program must know its output shape).

Pytrees: :func:`allreduce` and the ``grouped_*`` forms take any pytree of
arrays and return the same structure; a pytree goes to the engine as one
group, negotiated and fused as a unit.

Cross-rank contract (as in Horovod): every rank of the process set submits
the same collectives with matching dtypes, shapes (dim 0 excepted for
allgather and alltoall), ops, roots and scale factors; unnamed collectives
take per-op automatic names, so ranks must call them in the same order.  A
mismatch fails the collective on every rank with
:class:`hvdlite.HorovodInternalError` (inside jit: JAX's ``JaxRuntimeError``
carrying that message); an invalid argument raises
:class:`hvdlite.ArgumentError` (a ValueError) on the calling rank at once.

Arguments shared by the collectives (each function lists only its own):

- *tensor*: a JAX array (numpy arrays and Python numbers are converted onto
  the default device); *tensors*: a pytree of them.  Supported dtypes: uint8,
  int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool
  (bool reduces only with Min, Max or Product).
- *name*: the name the ranks agree on, qualified by the op; None takes the
  op's next automatic name.
- *op*: ``Average`` (the default), ``Sum``, ``Adasum``, ``Min``, ``Max``,
  ``Product``; *average*: Horovod's deprecated boolean spelling.
- *prescale_factor*, *postscale_factor*: multiply every input before the
  reduction and the result after it.
- *compression*: ``Compression.none``, ``.fp16`` or ``.bf16``: cast for the
  wire, cast back after.
- *process_set*: a registered :class:`~hvdlite.ProcessSet`; only its members
  call; ranks (``root_rank``) are global ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from hvdlite import collectives as _collectives
from hvdlite import handles as _handles
from hvdlite.exceptions import ArgumentError
from hvdlite.handles import Handle, poll
from hvdlite.ops import Adasum, Average, ReduceOp, resolve_op
from hvdlite.process_sets import ProcessSet, global_process_set

from . import _arrays, _traced
from .compression import Compressor, NoneCompressor

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
    "poll",
    "synchronize",
    "join",
    "barrier",
]

_now = _collectives.call_and_wait


def synchronize(handle: Handle):
    """Wait for *handle* (from an ``*_async`` op) and return its JAX result.

    Raises :class:`hvdlite.HorovodInternalError` when the collective failed on
    any rank.
    """
    return _handles.synchronize(handle)


def _named(op: str, name):
    return None if name is None else f"{op}.{name}"


def refuse_traced(leaves, what: str, fix: str) -> None:
    """ArgumentError when a traced value reaches an eager-only function."""
    if _arrays.is_traced(leaves):
        raise ArgumentError(
            f"hvdlite.jax.{what} got a traced value (it was called inside jax.jit, grad or "
            f"vmap), and it works on concrete arrays only: {fix}"
        )


_NO_HANDLES = (
    "a handle cannot live inside a traced function. Inside jax.jit call the blocking form "
    "(e.g. hvdlite.jax.allreduce), which runs as an ordered host callback; or call this "
    "outside the jitted function."
)


def _check_set(process_set, what: str) -> None:
    if not isinstance(process_set, ProcessSet):
        raise ArgumentError(
            f"hvdlite.jax.{what}: process_set must be a hvdlite.ProcessSet, "
            f"got {type(process_set).__name__}."
        )
    if process_set.included() is False:
        raise ArgumentError(
            f"hvdlite.jax.{what}: this rank is not a member of {process_set}; only its "
            "members may call collectives on it."
        )


def _scales(prescale_factor, postscale_factor) -> tuple[float, float]:
    try:
        return float(prescale_factor), float(postscale_factor)
    except (TypeError, ValueError):
        raise ArgumentError("prescale_factor and postscale_factor must be numbers.") from None


def _compress(leaves, compression):
    if compression is NoneCompressor:
        return leaves, None
    pairs = [compression.compress(x) for x in leaves]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _decompress(leaves, contexts, compression):
    if contexts is None:
        return leaves
    return [compression.decompress(x, c) for x, c in zip(leaves, contexts, strict=True)]


# --------------------------------------------------------------------- allreduce
def _reduction_args(op, average, prescale_factor, postscale_factor, process_set, what):
    _check_set(process_set, what)
    rop = resolve_op(op, average)
    pre, post = _scales(prescale_factor, postscale_factor)
    return rop, pre, post


def _allreduce_async(leaves, treedef, grouped, name, rop, pre, post, compression, process_set):
    sent, contexts = _compress(leaves, compression)
    staged = [_arrays.stage(x, "allreduce", reduce=True, with_output=True) for x in sent]
    kwargs = dict(
        name=_named("allreduce", name),
        op=rop,
        prescale_factor=pre,
        postscale_factor=post,
        process_set=process_set,
        dtype_names=_arrays.framework_dtypes(sent),
    )
    if grouped:
        handle = _collectives.grouped_allreduce_async(
            [s.array for s in staged], outputs=[s.output for s in staged], **kwargs
        )
    else:
        handle = _collectives.allreduce_async(staged[0].array, output=staged[0].output, **kwargs)

    def convert(result):
        results = result if grouped else [result]
        out = [s.back(r) for s, r in zip(staged, results, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, _decompress(out, contexts, compression))

    return handle.add_conversion(convert)


def allreduce_async(
    tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start reducing *tensor* (an array, or a pytree of arrays reduced as one
    group) over the ranks of *process_set*.

    Returns:
        A handle; ``synchronize(handle)`` returns new JAX arrays in *tensor*'s
        structure, each of its input's shape, dtype and device, holding the
        reduction, the same on every rank.
    """
    leaves, treedef = _arrays.flatten(tensor, "allreduce_async")
    refuse_traced(leaves, "allreduce_async", _NO_HANDLES)
    rop, pre, post = _reduction_args(
        op, average, prescale_factor, postscale_factor, process_set, "allreduce_async"
    )
    grouped = treedef.num_leaves != 1 or not isinstance(tensor, jax.Array)
    return _allreduce_async(
        leaves, treedef, grouped, name, rop, pre, post, compression, process_set
    )


def allreduce(
    tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Reduce *tensor* (an array, or a pytree of arrays as one fused group) over
    the ranks of *process_set* (default op: Average).

    Works eagerly and inside ``jax.jit`` (an ordered host callback there;
    differentiable for Average and Sum: the gradient is the same allreduce of
    the cotangent).

    Returns:
        New JAX arrays in *tensor*'s structure, the same on every rank.
    """
    leaves, treedef = _arrays.flatten(tensor, "allreduce")
    rop, pre, post = _reduction_args(
        op, average, prescale_factor, postscale_factor, process_set, "allreduce"
    )
    if _arrays.is_traced(leaves):
        for x in leaves:
            _arrays.check_dtype(x.dtype, "allreduce")
        sent, contexts = _compress(leaves, compression)
        out = _traced.allreduce(sent, rop, pre, post, name, process_set)
        return jax.tree_util.tree_unflatten(treedef, _decompress(out, contexts, compression))
    grouped = treedef.num_leaves != 1 or not isinstance(tensor, jax.Array)
    return _now(
        _allreduce_async, leaves, treedef, grouped, name, rop, pre, post, compression, process_set
    )


def grouped_allreduce_async(
    tensors,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start one allreduce of a list (or any pytree) of arrays, as one unit.

    Returns:
        A handle; ``synchronize(handle)`` returns the reductions in the
        structure of *tensors*.
    """
    leaves, treedef = _arrays.flatten(tensors, "grouped_allreduce_async")
    refuse_traced(leaves, "grouped_allreduce_async", _NO_HANDLES)
    rop, pre, post = _reduction_args(
        op, average, prescale_factor, postscale_factor, process_set, "grouped_allreduce_async"
    )
    return _allreduce_async(leaves, treedef, True, name, rop, pre, post, compression, process_set)


def grouped_allreduce(
    tensors,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Reduce a list (or any pytree) of arrays as one unit; eagerly or inside jit.

    Returns:
        The reductions in the structure of *tensors*.
    """
    return allreduce(
        tensors if not isinstance(tensors, jax.Array) else [tensors],
        average,
        name,
        compression,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
    )


# --------------------------------------------------------------------- allgather
def _check_rows(leaves, what: str) -> None:
    for x in leaves:
        if x.ndim == 0:
            raise ArgumentError(
                f"hvdlite.jax.{what}: the array needs at least one dimension (it is "
                "concatenated along dim 0); use x.reshape(1)."
            )


def _allgather_async(leaves, treedef, grouped, name, process_set) -> Handle:
    staged = [_arrays.stage(x, "allgather", reduce=False, with_output=False) for x in leaves]
    arrays = [s.array for s in staged]
    names = _arrays.framework_dtypes(leaves)
    if grouped:
        handle = _collectives.grouped_allgather_async(
            arrays, name=_named("allgather", name), process_set=process_set, dtype_names=names
        )
    else:
        handle = _collectives.allgather_async(
            arrays[0], name=_named("allgather", name), process_set=process_set, dtype_names=names
        )

    def convert(result):
        results = result if grouped else [result]
        out = [s.back(r) for s, r in zip(staged, results, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, out)

    return handle.add_conversion(convert)


def allgather_async(
    tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Start concatenating every rank's *tensor* along dim 0, in rank order
    (dim 0 may differ between ranks; the other dimensions must agree).

    Returns:
        A handle; ``synchronize(handle)`` returns a new array of *tensor*'s
        dtype and device, the same on every rank.
    """
    leaves, treedef = _arrays.flatten(tensor, "allgather_async")
    if len(leaves) != 1:
        raise ArgumentError(
            "hvdlite.jax.allgather_async: takes one array; use grouped_allgather_async "
            "for a list or pytree."
        )
    refuse_traced(leaves, "allgather_async", _NO_HANDLES)
    _check_set(process_set, "allgather_async")
    _check_rows(leaves, "allgather_async")
    return _allgather_async(leaves, treedef, False, name, process_set)


def grouped_allgather_async(
    tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Start allgathering a list (or pytree) of arrays as one unit.

    Returns:
        A handle; ``synchronize(handle)`` returns the gathered arrays in the
        structure of *tensors*.
    """
    leaves, treedef = _arrays.flatten(tensors, "grouped_allgather_async")
    refuse_traced(leaves, "grouped_allgather_async", _NO_HANDLES)
    _check_set(process_set, "grouped_allgather_async")
    _check_rows(leaves, "grouped_allgather_async")
    return _allgather_async(leaves, treedef, True, name, process_set)


def _allgather(tensor, name, process_set, grouped: bool, what: str):
    leaves, treedef = _arrays.flatten(tensor, what)
    if not grouped and len(leaves) != 1:
        raise ArgumentError(
            f"hvdlite.jax.{what}: takes one array; use grouped_allgather for a list or pytree."
        )
    _check_set(process_set, what)
    _check_rows(leaves, what)
    if _arrays.is_traced(leaves):
        for x in leaves:
            _arrays.check_dtype(x.dtype, what)
        out = _traced.allgather(leaves, name, process_set)
        return jax.tree_util.tree_unflatten(treedef, out)
    return _now(_allgather_async, leaves, treedef, grouped, name, process_set)


def allgather(
    tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> jax.Array:
    """Concatenate every rank's *tensor* along dim 0, in rank order.

    Inside ``jax.jit`` every rank must pass the same dim 0.

    Returns:
        A new array of *tensor*'s dtype and device, the same on every rank.
    """
    return _allgather(tensor, name, process_set, False, "allgather")


def grouped_allgather(
    tensors, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Any:
    """Allgather a list (or pytree) of arrays as one unit; eagerly or inside jit.

    Returns:
        The gathered arrays in the structure of *tensors*.
    """
    return _allgather(tensors, name, process_set, True, "grouped_allgather")


# --------------------------------------------------------------------- broadcast
def _root(root_rank, process_set, what: str) -> int:
    try:
        root = int(root_rank)
    except (TypeError, ValueError):
        raise ArgumentError(
            f"hvdlite.jax.{what}: root_rank must be an int, got {root_rank!r}."
        ) from None
    ranks = process_set.ranks
    if ranks is not None and root not in ranks:
        raise ArgumentError(
            f"hvdlite.jax.{what}: root_rank {root} is not a rank of the process set "
            f"(ranks {ranks}); pass the global rank of a member."
        )
    return root


def _broadcast_async(leaf, root, name, process_set) -> Handle:
    staged = _arrays.stage(leaf, "broadcast", reduce=False, with_output=True)
    handle = _collectives.broadcast_async(
        staged.array,
        root,
        name=_named("broadcast", name),
        process_set=process_set,
        output=staged.output,
        dtype_names=_arrays.framework_dtypes([leaf]),
    )
    return handle.add_conversion(staged.back)


def _one(tensor, what: str):
    leaves, _ = _arrays.flatten(tensor, what)
    if len(leaves) != 1:
        raise ArgumentError(f"hvdlite.jax.{what}: takes one array, got a pytree.")
    return leaves[0]


def broadcast_async(
    tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Handle:
    """Start copying the global rank *root_rank*'s *tensor* to every rank of the
    set (every rank passes an array of the same shape and dtype).

    Returns:
        A handle; ``synchronize(handle)`` returns a new array holding the
        root's values, on the input's device.
    """
    leaf = _one(tensor, "broadcast_async")
    refuse_traced([leaf], "broadcast_async", _NO_HANDLES)
    _check_set(process_set, "broadcast_async")
    return _broadcast_async(
        leaf, _root(root_rank, process_set, "broadcast_async"), name, process_set
    )


def broadcast(
    tensor, root_rank: int, name: str | None = None, process_set: ProcessSet = global_process_set
) -> jax.Array:
    """Copy the global rank *root_rank*'s *tensor* to every rank; eagerly or inside jit.

    Returns:
        A new array holding the root's values (for a pytree of parameters
            use :func:`hvdlite.jax.broadcast_parameters`).
    """
    leaf = _one(tensor, "broadcast")
    _check_set(process_set, "broadcast")
    root = _root(root_rank, process_set, "broadcast")
    if _arrays.is_traced([leaf]):
        _arrays.check_dtype(leaf.dtype, "broadcast")
        return _traced.broadcast(leaf, root, name, process_set)
    return _now(_broadcast_async, leaf, root, name, process_set)


# ---------------------------------------------------------------------- alltoall
def _splits(splits) -> list[int] | None:
    if splits is None:
        return None
    values = np.asarray(splits)
    if values.dtype.kind not in "iu" and values.size:
        raise ArgumentError(
            f"hvdlite.jax.alltoall: splits must hold integers, got {values.dtype}; pass "
            "e.g. jnp.array(splits, dtype=jnp.int32)."
        )
    return [int(s) for s in values.reshape(-1)]


def alltoall_async(
    tensor,
    splits: Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Handle:
    """Start sending dim-0 slices of *tensor* to the ranks and receiving theirs.

    Arguments:
        splits: how many rows go to each member of *process_set*, in set order
            (ints summing to dim 0); None splits dim 0 evenly.

    Returns:
        A handle; ``synchronize(handle)`` returns ``(output, received_splits)``:
        a new array on the input's device with the rows every member sent here,
        in rank order, and an int32 array of how many came from each.
    """
    leaf = _one(tensor, "alltoall_async")
    refuse_traced([leaf], "alltoall_async", _NO_HANDLES)
    _check_set(process_set, "alltoall_async")
    if leaf.ndim == 0:
        raise ArgumentError("hvdlite.jax.alltoall_async: the array needs at least one dimension.")
    staged = _arrays.stage(leaf, "alltoall", reduce=False, with_output=False)
    handle = _collectives.alltoall_async(
        staged.array,
        _splits(splits),
        name=_named("alltoall", name),
        process_set=process_set,
        dtype_names=_arrays.framework_dtypes([leaf]),
    )

    def convert(result):
        output, received = result
        return staged.back(output), jax.numpy.asarray(np.asarray(received, dtype=np.int32))

    return handle.add_conversion(convert)


def alltoall(
    tensor,
    splits: Sequence[int] | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Send dim-0 slices of *tensor* to the ranks and receive theirs.

    Inside ``jax.jit`` only even splits (``splits=None``) with the same dim 0
    on every rank: the traced program must know its output shape.

    Returns:
        ``output`` where *splits* is None, else ``(output, received_splits)``
            (see :func:`alltoall_async`).
    """
    leaf = _one(tensor, "alltoall")
    if _arrays.is_traced([leaf]):
        _check_set(process_set, "alltoall")
        if splits is not None:
            raise ArgumentError(
                "hvdlite.jax.alltoall inside jax.jit: splits= would make the output shape "
                "depend on the other ranks; use splits=None (even splits, the same dim 0 "
                "on every rank), or call alltoall outside the jitted function."
            )
        if leaf.ndim == 0:
            raise ArgumentError("hvdlite.jax.alltoall: the array needs at least one dimension.")
        _arrays.check_dtype(leaf.dtype, "alltoall")
        return _traced.alltoall(leaf, name, process_set)
    output, received = _now(alltoall_async, leaf, splits, name, process_set)
    return output if splits is None else (output, received)


# ----------------------------------------------------------------- reducescatter
def _reducescatter_args(op, prescale_factor, postscale_factor, process_set, leaves, what):
    _check_set(process_set, what)
    rop = resolve_op(op, None)
    if rop == Adasum:
        raise ArgumentError(f"hvdlite.jax.{what}: op=Adasum is not supported; use Average or Sum.")
    _check_rows(leaves, what)
    return rop, *_scales(prescale_factor, postscale_factor)


def _reducescatter_async(leaves, treedef, grouped, name, rop, pre, post, compression, process_set):
    sent, contexts = _compress(leaves, compression)
    staged = [_arrays.stage(x, "reducescatter", reduce=True, with_output=False) for x in sent]
    kwargs = dict(
        name=_named("reducescatter", name),
        op=rop,
        prescale_factor=pre,
        postscale_factor=post,
        process_set=process_set,
        dtype_names=_arrays.framework_dtypes(sent),
    )
    arrays = [s.array for s in staged]
    if grouped:
        handle = _collectives.grouped_reducescatter_async(arrays, **kwargs)
    else:
        handle = _collectives.reducescatter_async(arrays[0], **kwargs)

    def convert(result):
        results = result if grouped else [result]
        out = [s.back(r) for s, r in zip(staged, results, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, _decompress(out, contexts, compression))

    return handle.add_conversion(convert)


def _reducescatter(tensor, name, compression, op, process_set, pre, post, grouped, what, wait):
    leaves, treedef = _arrays.flatten(tensor, what)
    if not grouped and len(leaves) != 1:
        raise ArgumentError(
            f"hvdlite.jax.{what}: takes one array; use grouped_reducescatter for a list."
        )
    rop, pre, post = _reducescatter_args(op, pre, post, process_set, leaves, what)
    if _arrays.is_traced(leaves):
        if not wait:
            refuse_traced(leaves, what, _NO_HANDLES)
        for x in leaves:
            _arrays.check_dtype(x.dtype, what)
        sent, contexts = _compress(leaves, compression)
        out = _traced.reducescatter(sent, rop, pre, post, name, process_set)
        return jax.tree_util.tree_unflatten(treedef, _decompress(out, contexts, compression))
    args = (leaves, treedef, grouped, name, rop, pre, post, compression, process_set)
    return _now(_reducescatter_async, *args) if wait else _reducescatter_async(*args)


def reducescatter_async(
    tensor,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start reducing *tensor* over the ranks, each keeping one dim-0 shard
    (op: Average or Sum).

    Returns:
        A handle; ``synchronize(handle)`` returns this rank's shard: the i-th
        member of the set gets the i-th block of rows, as even as possible (the
        first ``rows % size`` members get one row more).
    """
    return _reducescatter(
        tensor, name, compression, op, process_set, prescale_factor, postscale_factor,
        False, "reducescatter_async", wait=False,
    )  # fmt: skip


def reducescatter(
    tensor,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> jax.Array:
    """Reduce *tensor* over the ranks and keep this rank's dim-0 shard (see
    :func:`reducescatter_async`); eagerly or inside jit.

    Returns:
        This rank's shard, a new array on the input's device.
    """
    return _reducescatter(
        tensor, name, compression, op, process_set, prescale_factor, postscale_factor,
        False, "reducescatter", wait=True,
    )  # fmt: skip


def grouped_reducescatter_async(
    tensors,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Handle:
    """Start a reducescatter of each array of a list (or pytree), as one unit.

    Returns:
        A handle; ``synchronize(handle)`` returns this rank's shards in the
        structure of *tensors*.
    """
    return _reducescatter(
        tensors, name, compression, op, process_set, prescale_factor, postscale_factor,
        True, "grouped_reducescatter_async", wait=False,
    )  # fmt: skip


def grouped_reducescatter(
    tensors,
    name: str | None = None,
    compression: type[Compressor] = NoneCompressor,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Any:
    """Reducescatter each array of a list (or pytree), as one unit.

    Returns:
        This rank's shards in the structure of *tensors*.
    """
    return _reducescatter(
        tensors, name, compression, op, process_set, prescale_factor, postscale_factor,
        True, "grouped_reducescatter", wait=True,
    )  # fmt: skip


# ---------------------------------------------------------------- join, barrier
def join(device: int = -1) -> int:
    """This rank has no more data: it contributes zeros to the other ranks'
    allreduces until every rank has joined (eager only).

    Returns:
        The global rank that joined last, the same on every rank.
    """
    return _collectives.join(device)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Block until every rank of *process_set* has called barrier() (eager only)."""
    _collectives.barrier(process_set=process_set)
