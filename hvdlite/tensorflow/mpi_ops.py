"""TensorFlow collectives with gradients, on the hvdlite engine.

The ops here are Horovod's ``horovod.tensorflow.mpi_ops``: raw collectives (no
compression, no ``tf.IndexedSlices``), usable eagerly and inside
``tf.function``, each with a gradient registered through ``tf.custom_gradient``:

==========================  ==================================================
op                          gradient (Horovod's rules)
==========================  ==================================================
allreduce (Sum, Average)    the same allreduce of the upstream gradient
allreduce (Min, Max)        Sum-allreduce of the upstream gradient, kept where
                            this rank's input equals the result (+)
allreduce (Product)         Sum-allreduce of the upstream gradient * y / x (+)
allgather                   this rank's rows of an Average-allreduce
broadcast                   Average-allreduce on the root, zeros elsewhere
alltoall                    alltoall back with the received splits
reducescatter               allgather, times the set size for Sum (not divided
                            for Average) and times the pre/postscale factors
==========================  ==================================================

Cross-rank contract: every member of ``process_set`` must call the same
collectives in the same order with matching dtypes and shapes (first
dimension excepted for allgather/alltoall); gradients are collectives too, so
every member must also differentiate through them.  Each rank gets the result
the op's docstring states.  As Horovod's ops, a mismatch across ranks raises
``tf.errors.FailedPreconditionError`` (eagerly also a ``HorovodInternalError``)
and a bad argument ``tf.errors.InvalidArgumentError`` (also a ``ValueError``),
eagerly and in graphs; see :mod:`hvdlite.tensorflow._errors`.

Arguments shared by the collectives (each function lists only its own):

- *tensor* / *tensors*: anything ``tf.convert_to_tensor`` takes (uint8, int8,
  uint16, int16, int32, int64, float16, bfloat16, float32, float64 or bool),
  or a list of them for the ``grouped_*`` forms, which make one engine
  submission (one graph node) for the whole list.
- *name*: the name the ranks agree on.  None: eagerly the op's next automatic
  name, in a graph ``Horovod<Op>_<k>`` counted per graph at trace time; a
  given name is prefixed with the current name scope.
- *ignore_name_scope*: True leaves the name scope out of a given *name*
  (graphs only; eagerly names are used as given).
- *process_set*: a registered :class:`~hvdlite.process_sets.ProcessSet`; only
  its members call, and ranks (``root_rank``) are global ranks.
- *op*, *prescale_factor*, *postscale_factor* (the underscored reductions
  ``_allreduce``, ``_reducescatter`` and their grouped forms): a
  :class:`~hvdlite.ops.ReduceOp` (Sum by default), and factors that multiply
  every input before the reduction and the result after it.

Collective results are new tensors of the input's dtype: eagerly a GPU
input's result stays on the GPU where the device path is on (see
:mod:`hvdlite.tensorflow._device`), else it is on the host; in a graph the op
is a ``tf.numpy_function`` node whose unknown dimensions are None.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from hvdlite import basics as _basics  # noqa: F401  (Horovod's mpi_ops._basics, for its tests)
from hvdlite import collectives as _collectives
from hvdlite import handles as _handles
from hvdlite.basics import local_rank, local_size, rank
from hvdlite.common import *  # noqa: F403 - Horovod's mpi_ops re-exports the basics too
from hvdlite.ops import Average, Max, Min, Product, Sum
from hvdlite.process_sets import ProcessSet, global_process_set

from . import _bridge
from ._errors import ArgumentError

if TYPE_CHECKING:  # annotations only (postponed by the __future__ import)
    from collections.abc import Sequence

    from hvdlite.ops import ReduceOp

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = [
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "join",
    "barrier",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    "handle_average_backwards_compatibility",
    "check_num_rank_power_of_2",
]


def handle_average_backwards_compatibility(op: ReduceOp | None, average: bool | None) -> ReduceOp:
    """Resolve Horovod's deprecated ``average=`` against ``op=``; local, no collective.

    Arguments:
        op: the reduction asked for, or None.
        average: the deprecated boolean spelling (True = Average, False = Sum),
            or None; giving it warns (DeprecationWarning), giving both raises
            ValueError.

    Returns:
        *op* if given, else the op *average* names, else Average.
    """
    if op is not None:
        if average is not None:
            raise ValueError(
                "The op parameter supersedes average. Please provide only one of them."
            )
        return op
    if average is not None:
        import warnings

        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be "
            "removed in a future version",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether *num_rank* is a power of two (Adasum's requirement); local.

    Arguments:
        num_rank: a number of ranks.

    Returns:
        True for 1, 2, 4, 8, ...; False otherwise (0 and negatives included).
    """
    return num_rank > 0 and (num_rank & (num_rank - 1)) == 0


def _zeros_if_none(grads, outputs):
    return [tf.zeros_like(y) if g is None else g for g, y in zip(grads, outputs, strict=True)]


# --- allreduce ---------------------------------------------------------------


def _halves_as_is(dtypes, scaling, process_set) -> bool:
    """Whether a reduction's float16 and bfloat16 tensors go to the engine as they
    are: where they cross nodes as 16 bits, and not a bfloat16 of a group that
    this adapter scales (it scales on a float32 wire)."""
    return (
        any(d in (tf.float16, tf.bfloat16) for d in dtypes)
        and not (scaling.here and tf.bfloat16 in dtypes)
        and _basics.halves_cross_as_16_bits(process_set)
    )


def _grouped_allreduce_nograd(tensors, name, op, prescale_factor, postscale_factor, process_set):
    dtypes = [t.dtype for t in tensors]
    scaling = _bridge.Scaling(dtypes, op, prescale_factor, postscale_factor, process_set.size())
    as_is = _halves_as_is(dtypes, scaling, process_set)
    wire = [
        scaling.before(_bridge.to_wire(t, reduce=True, halves_as_is=as_is), t.dtype)
        for t in tensors
    ]
    if name is None:
        name = _bridge.op_name("GroupedAllreduce", tensors, None)

    def fn(*arrays, outputs=None):
        return _collectives.grouped_allreduce(
            list(arrays),
            name=name,
            op=scaling.op,
            prescale_factor=scaling.pre,
            postscale_factor=scaling.post,
            process_set=process_set,
            outputs=outputs,
            dtype_names=_bridge.framework_dtypes(dtypes),
        )

    outs = _bridge.run(
        fn,
        wire,
        [w.dtype for w in wire],
        [w.shape for w in wire],
        name,
        outputs_like_inputs=len(wire),
    )
    return [
        _bridge.from_wire(scaling.after(o, d), d, reduce=True)
        for o, d in zip(outs, dtypes, strict=True)
    ]


def _reduce_backward(dys, xs, ys, op, prescale_factor, postscale_factor, process_set):
    if op in (Min, Max):
        summed = _grouped_allreduce_nograd(dys, None, Sum, 1.0, 1.0, process_set)
        return [
            s * tf.cast(tf.equal(x, y), s.dtype) for s, x, y in zip(summed, xs, ys, strict=True)
        ]
    if op == Product:
        summed = _grouped_allreduce_nograd(dys, None, Sum, 1.0, 1.0, process_set)
        return [tf.math.divide_no_nan(s * y, x) for s, x, y in zip(summed, xs, ys, strict=True)]
    return _grouped_allreduce_nograd(dys, None, op, prescale_factor, postscale_factor, process_set)


@_no_autograph
def _grouped_allreduce(
    tensors,
    name=None,
    op=Sum,
    prescale_factor=1.0,
    postscale_factor=1.0,
    ignore_name_scope=False,
    process_set=global_process_set,
):
    """Differentiable grouped allreduce: one engine submission for the whole list.

    Every rank gets, per position, ``postscale * op(prescale * x_r over ranks)``.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        _bridge.check_dtype(t.dtype, "allreduce", op=op)
    _bridge.check_process_set(process_set, "allreduce")
    name = _bridge.op_name(
        "GroupedAllreduce" if len(tensors) > 1 else "Allreduce", tensors, name, ignore_name_scope
    )

    @tf.custom_gradient
    def _op(*xs):
        ys = _grouped_allreduce_nograd(
            list(xs), name, op, prescale_factor, postscale_factor, process_set
        )

        def grad(*dys):
            return _reduce_backward(
                _zeros_if_none(dys, ys), xs, ys, op, prescale_factor, postscale_factor, process_set
            )

        return ys, grad

    return list(_op(*tensors))


@_no_autograph
def _allreduce(
    tensor,
    name=None,
    op=Sum,
    prescale_factor=1.0,
    postscale_factor=1.0,
    ignore_name_scope=False,
    process_set=global_process_set,
):
    """Differentiable allreduce of one tensor (no compression; default op Sum)."""
    return _grouped_allreduce(
        [tensor],
        name=name,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
    )[0]


# --- allgather ---------------------------------------------------------------


def _grouped_allgather_nograd(tensors, name, process_set):
    dtypes = [t.dtype for t in tensors]
    wire = [_bridge.to_wire(t, reduce=False) for t in tensors]
    single = process_set.size() == 1
    if name is None:
        name = _bridge.op_name("GroupedAllgather", tensors, None)

    def fn(*arrays, outputs=None):
        return _collectives.grouped_allgather(
            list(arrays),
            name=name,
            process_set=process_set,
            dtype_names=_bridge.framework_dtypes(dtypes),
        )

    shapes = [w.shape if single else tf.TensorShape([None]).concatenate(w.shape[1:]) for w in wire]
    outs = _bridge.run(fn, wire, [w.dtype for w in wire], shapes, name)
    return [_bridge.from_wire(o, d, reduce=False) for o, d in zip(outs, dtypes, strict=True)]


@_no_autograph
def grouped_allgather(
    tensors: Sequence[tf.Tensor],
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> list[tf.Tensor]:
    """Allgather each tensor of a list, as one unit (see :func:`allgather`).

    Returns:
        A list of new tensors, the concatenation of each input in order, the
        same on every rank ([] for an empty list).
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    for t in tensors:
        _bridge.check_dtype(t.dtype, "allgather")
        if t.shape.rank == 0:
            raise ArgumentError(
                message="hvdlite allgather needs tensors of rank >= 1; "
                "reshape a scalar to [1] first."
            )
    _bridge.check_process_set(process_set, "allgather")
    name = _bridge.op_name(
        "GroupedAllgather" if len(tensors) > 1 else "Allgather", tensors, name, ignore_name_scope
    )

    @tf.custom_gradient
    def _op(*xs):
        ys = _grouped_allgather_nograd(list(xs), name, process_set)

        def grad(*dys):
            dys = _zeros_if_none(dys, ys)
            floating = [i for i, d in enumerate(dys) if d.dtype.is_floating]
            reduced = dict(
                zip(
                    floating,
                    _grouped_allreduce_nograd(
                        [dys[i] for i in floating], None, Average, 1.0, 1.0, process_set
                    ),
                    strict=True,
                )
            )
            firsts = tf.stack([tf.shape(x, out_type=tf.int32)[0] for x in xs])
            all_firsts = _grouped_allgather_nograd([firsts], None, process_set)[0]
            all_firsts = tf.reshape(all_firsts, [process_set.size(), len(xs)])
            me = process_set.rank()
            out = []
            for i, x in enumerate(xs):
                if i not in reduced:
                    out.append(None)
                    continue
                start = tf.reduce_sum(all_firsts[:me, i])
                out.append(
                    tf.slice(
                        reduced[i],
                        tf.concat([[start], tf.zeros([x.shape.rank - 1], tf.int32)], 0),
                        tf.shape(x),
                    )
                )
            return out

        return ys, grad

    return list(_op(*tensors))


@_no_autograph
def allgather(
    tensor: tf.Tensor,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Concatenate every member's *tensor* (rank >= 1) along dim 0, in rank order.

    Dim 0 may differ between ranks; the other dimensions must agree.

    Returns:
        A new tensor of shape ``[sum of every member's dim 0, *rest]``, the
        same on every rank.
    """
    return grouped_allgather(
        [tensor], name=name, ignore_name_scope=ignore_name_scope, process_set=process_set
    )[0]


# --- broadcast ---------------------------------------------------------------


def _broadcast_group_nograd(tensors, root_rank, name, process_set, ordered=True):
    """Broadcast many tensors from ``root_rank`` as one graph node / one wait."""
    dtypes = [t.dtype for t in tensors]
    wire = [_bridge.to_wire(t, reduce=False) for t in tensors]
    if name is None:
        name = _bridge.op_name("Broadcast", tensors, None)

    def fn(*arrays, outputs=None):
        handles = [
            _collectives.broadcast_async(
                a,
                root_rank,
                name=None if name is None else (name if len(arrays) == 1 else f"{name}.{i}"),
                process_set=process_set,
                output=None if outputs is None else outputs[i],
                dtype_names=_bridge.framework_dtypes([dtypes[i]]),
            )
            for i, a in enumerate(arrays)
        ]
        return [_handles.synchronize(h) for h in handles]

    outs = _bridge.run(
        fn,
        wire,
        [w.dtype for w in wire],
        [w.shape for w in wire],
        name,
        outputs_like_inputs=len(wire),
        ordered=ordered,
    )
    return [_bridge.from_wire(o, d, reduce=False) for o, d in zip(outs, dtypes, strict=True)]


def _check_root(root_rank, process_set, what):
    _bridge.check_process_set(process_set, what)
    if root_rank not in process_set.ranks:
        raise ArgumentError(
            message=f"hvdlite {what}: root_rank {root_rank} is not a "
            f"member of process set {process_set.ranks}."
        )


@_no_autograph
def broadcast(
    tensor: tf.Tensor,
    root_rank: int,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor:
    """Copy *root_rank*'s *tensor* to every member of *process_set*.

    Arguments:
        root_rank: the global rank whose value every rank receives; a member
            of *process_set*.  Every member passes a tensor of the same shape
            and dtype.

    Returns:
        A new tensor holding the root's value (a copy on the root too).
    """
    tensor = tf.convert_to_tensor(tensor)
    _bridge.check_dtype(tensor.dtype, "broadcast")
    _check_root(root_rank, process_set, "broadcast")
    name = _bridge.op_name("Broadcast", [tensor], name, ignore_name_scope)

    @tf.custom_gradient
    def _op(x):
        y = _broadcast_group_nograd([x], root_rank, name, process_set)[0]

        def grad(dy):
            if not dy.dtype.is_floating:
                return None
            dy = _grouped_allreduce_nograd([dy], None, Average, 1.0, 1.0, process_set)[0]
            return dy if rank() == root_rank else dy * 0

        return y, grad

    return _op(tensor)


@_no_autograph
def broadcast_(
    variables: tf.Variable | Sequence[tf.Variable],
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor | list[tf.Tensor]:
    """In-place broadcast: assign *root_rank*'s values to *variables* on every rank.

    One submission for all variables.  In a ``tf.compat.v1`` graph the node
    stays out of the chain of collectives (it is meant to be run on its own,
    to initialise).

    Arguments:
        variables: a ``tf.Variable`` or a list of them (anything with
            ``assign``), the same shapes and dtypes on every member; each is
            overwritten with the root's value.
        root_rank: as for :func:`broadcast`.

    Returns:
        The updated values, a tensor per variable (a list when given a list;
        [] for an empty one); in a graph they are read after the assignments.
    """
    single = not isinstance(variables, (list, tuple))
    variables = [variables] if single else list(variables)
    if not variables:
        return []
    values = [tf.convert_to_tensor(v) for v in variables]
    for v in values:
        _bridge.check_dtype(v.dtype, "broadcast_")
    _check_root(root_rank, process_set, "broadcast_")
    name = _bridge.op_name("BroadcastInplace", values, name)
    new = _broadcast_group_nograd(values, root_rank, name, process_set, ordered=False)
    if tf.executing_eagerly():
        for var, value in zip(variables, new, strict=True):
            var.assign(value)
        out = [tf.convert_to_tensor(var) for var in variables]
    else:
        assigns = [var.assign(value) for var, value in zip(variables, new, strict=True)]
        with tf.control_dependencies(assigns):
            out = [_read(var) for var in variables]
    return out[0] if single else out


def _read(var):
    """The variable's value, read where it is called (after the current control deps)."""
    reader = getattr(var, "read_value", None)
    return reader() if reader is not None else tf.identity(tf.convert_to_tensor(var))


# --- alltoall ----------------------------------------------------------------


@_no_autograph
def alltoall(
    tensor: tf.Tensor,
    splits: Sequence[int] | tf.Tensor | None = None,
    name: str | None = None,
    ignore_name_scope: bool = False,
    process_set: ProcessSet = global_process_set,
) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Send dim-0 slices of *tensor* to the members and receive theirs.

    Arguments:
        splits: how many rows go to each member of *process_set*, in set order
            (ints summing to dim 0, cast to int32); None splits dim 0 evenly
            (the set size must divide it).

    Returns:
        The received rows, a new tensor in rank order; with *splits* given,
        ``(received, received_splits)``, the second an int32 tensor of shape
        ``[set size]`` saying how many rows came from each member.
    """
    tensor = tf.convert_to_tensor(tensor)
    _bridge.check_dtype(tensor.dtype, "alltoall")
    _bridge.check_process_set(process_set, "alltoall")
    if splits is not None:
        splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
    name = _bridge.op_name("Alltoall", [tensor], name, ignore_name_scope)
    n = process_set.size()

    def forward(x, s, name):
        wire = _bridge.to_wire(x, reduce=False)

        def fn(array, *rest, outputs=None):
            out, received = _collectives.alltoall_async(
                array,
                splits=rest[0] if rest else None,
                name=name,
                process_set=process_set,
                dtype_names=_bridge.framework_dtypes([x.dtype]),
            ).result()
            return [out, np.asarray(received, dtype=np.int32)]

        inputs = [wire] if s is None else [wire, s]
        out, received = _bridge.run(
            fn,
            inputs,
            [wire.dtype, tf.int32],
            [tf.TensorShape([None]).concatenate(wire.shape[1:]), tf.TensorShape([n])],
            name,
        )
        return _bridge.from_wire(out, x.dtype, reduce=False), received

    @tf.custom_gradient
    def _op(x):
        y, received = forward(x, splits, name)

        def grad(dy, _unused=None):
            if dy is None:
                dy = tf.zeros_like(y)
            if not dy.dtype.is_floating:
                return None
            back, _ = forward(dy, received, _bridge.op_name("Alltoall", [dy], None))
            return back

        return (y, received), grad

    out, received = _op(tensor)
    return out if splits is None else (out, received)


# --- reducescatter -----------------------------------------------------------


def _grouped_reducescatter_nograd(
    tensors, name, op, prescale_factor, postscale_factor, process_set
):
    dtypes = [t.dtype for t in tensors]
    scaling = _bridge.Scaling(dtypes, op, prescale_factor, postscale_factor, process_set.size())
    as_is = _halves_as_is(dtypes, scaling, process_set)
    wire = [
        scaling.before(_bridge.to_wire(t, reduce=True, halves_as_is=as_is), t.dtype)
        for t in tensors
    ]
    if name is None:
        name = _bridge.op_name("GroupedReducescatter", tensors, None)

    def fn(*arrays, outputs=None):
        return _collectives.grouped_reducescatter(
            list(arrays),
            name=name,
            op=scaling.op,
            prescale_factor=scaling.pre,
            postscale_factor=scaling.post,
            process_set=process_set,
            dtype_names=_bridge.framework_dtypes(dtypes),
        )

    shapes = [tf.TensorShape([None]).concatenate(w.shape[1:]) for w in wire]
    outs = _bridge.run(fn, wire, [w.dtype for w in wire], shapes, name)
    return [
        _bridge.from_wire(scaling.after(o, d), d, reduce=True)
        for o, d in zip(outs, dtypes, strict=True)
    ]


@_no_autograph
def _grouped_reducescatter(
    tensors,
    name=None,
    op=Sum,
    ignore_name_scope=False,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Differentiable grouped reduce-scatter along dim 0 (uneven splits allowed).

    Member i of the set gets the i-th block of rows of the reduction; the first
    ``d0 % size`` members get one extra row.
    """
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not tensors:
        return []
    if op not in (Sum, Average):
        raise ArgumentError(message="hvdlite reducescatter supports op=Sum and op=Average only.")
    for t in tensors:
        _bridge.check_dtype(t.dtype, "reducescatter", op=op)
        if t.shape.rank == 0:
            raise ArgumentError(message="hvdlite reducescatter needs tensors of rank >= 1.")
    _bridge.check_process_set(process_set, "reducescatter")
    name = _bridge.op_name(
        "GroupedReducescatter" if len(tensors) > 1 else "Reducescatter",
        tensors,
        name,
        ignore_name_scope,
    )

    @tf.custom_gradient
    def _op(*xs):
        ys = _grouped_reducescatter_nograd(
            list(xs), name, op, prescale_factor, postscale_factor, process_set
        )

        def grad(*dys):
            # Horovod's rule, not the per-rank derivative: Sum multiplies by the
            # set size, Average does not divide; the scale factors multiply.
            dys = _zeros_if_none(dys, ys)
            scale = float(prescale_factor) * float(postscale_factor)
            if op == Sum:
                scale *= process_set.size()
            if scale != 1.0:
                dys = [d * tf.cast(scale, d.dtype) for d in dys]
            return _grouped_allgather_nograd(dys, None, process_set)

        return ys, grad

    return list(_op(*tensors))


@_no_autograph
def _reducescatter(
    tensor,
    name=None,
    op=Sum,
    ignore_name_scope=False,
    process_set=global_process_set,
    prescale_factor=1.0,
    postscale_factor=1.0,
):
    """Differentiable reduce-scatter of one tensor (no compression; default op Sum)."""
    return _grouped_reducescatter(
        [tensor],
        name=name,
        op=op,
        ignore_name_scope=ignore_name_scope,
        process_set=process_set,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )[0]


# --- join, barrier, graph-time basics ----------------------------------------


def _scalar_op(fn, name, dtype=tf.int32, collective=False):
    if tf.executing_eagerly() and not collective:
        return tf.constant(fn(), dtype=dtype)
    return _bridge.run(
        lambda outputs=None: [np.asarray(fn(), dtype=dtype.as_numpy_dtype)],
        [],
        [dtype],
        [tf.TensorShape([])],
        name,
        collective=collective,
    )[0]


@_no_autograph
def join() -> tf.Tensor:
    """This rank has no more data: until every rank has joined, it contributes
    zeros to the others' allreduces; every rank calls it once it is done.

    Returns:
        An int32 scalar tensor: the global rank that joined last, the same on
        every rank.
    """
    return _scalar_op(_collectives.join, "HorovodJoin", collective=True)


@_no_autograph
def barrier(process_set: ProcessSet = global_process_set) -> tf.Tensor | None:
    """Block until every member of *process_set* has reached the barrier.

    Returns:
        Eagerly None; in a graph an int32 scalar tensor (0) that runs the
        barrier, for control dependencies.
    """
    _bridge.check_process_set(process_set, "barrier")

    def fn():
        _collectives.barrier(process_set=process_set)
        return 0

    out = _scalar_op(fn, "HorovodBarrier", collective=True)
    return None if tf.executing_eagerly() else out


@_no_autograph
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks in a process set, read when the op runs; local.

    Arguments:
        process_set_id: the set's id (0: the global set).
        name: the graph op's name (default ``HorovodSize``); the same applies
            to the other ``*_op`` functions.

    Returns:
        An int32 scalar tensor.
    """
    return _scalar_op(
        lambda: _bridge.process_set_by_id(process_set_id).size(), name or "HorovodSize"
    )


@_no_autograph
def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this node, read when the op runs; local.

    Returns:
        An int32 scalar tensor.
    """
    return _scalar_op(local_size, name or "HorovodLocalSize")


@_no_autograph
def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's global rank, read when the op runs; local.

    Returns:
        An int32 scalar tensor.
    """
    return _scalar_op(rank, name or "HorovodRank")


@_no_autograph
def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its node, read when the op runs; local.

    Returns:
        An int32 scalar tensor.
    """
    return _scalar_op(local_rank, name or "HorovodLocalRank")


@_no_autograph
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """Whether this rank is a member of a process set, read when the op runs; local.

    Arguments:
        process_set_id: the set's id (0: the global set).

    Returns:
        An int32 scalar tensor: 1 for a member, else 0.
    """
    return _scalar_op(
        lambda: int(_bridge.process_set_by_id(process_set_id).included()),
        name or "HorovodProcessSetIncluded",
    )
