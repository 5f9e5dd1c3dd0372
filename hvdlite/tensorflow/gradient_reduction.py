"""Reduce a step's gradients across ranks in one submission.

:class:`GradientReducer` is shared by ``DistributedGradientTape`` and the Keras
``DistributedOptimizer``.  For one call it

1. densifies ``tf.IndexedSlices`` when ``sparse_as_dense`` (else allgathers them),
2. compresses the dense gradients,
3. hands every gradient of the step to the engine at once: one allreduce per
   group (a single group unless ``groups`` says otherwise; a group of one dtype
   travels as one contiguous buffer, see :meth:`GradientReducer._submit`) and
   one grouped allgather for the sparse ones, all submitted before any is
   awaited; inside a ``tf.function`` this is a single graph node, whose small
   gradients of a group and wire dtype enter it packed into one flat tensor
   (Sum/Average only, see :mod:`hvdlite.tensorflow.packing`; a whole group is
   packed into one buffer by this adapter only where the set reduces through
   MPI, see :meth:`GradientReducer._plans`),
4. decompresses and, for sparse Average, divides by the set size.

With ``op=Average`` and ``gradient_predivide_factor=f`` the result is
``sum(g) / size`` (Horovod scales by ``1/f`` before the sum and ``f/size``
after it; a packed group applies the product of both once, before the sum).

Cross-rank contract: every member of the process set reduces the same list
of gradients (same dtypes and shapes, ``None`` in the same places) in the same
order; every member gets the same reduced gradients.  Ranks outside the set
get their gradients back unchanged, as in Horovod.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hvdlite import basics as _basics
from hvdlite._optimizer_args import local_layer_list, normalize_groups, split_groups
from hvdlite import collectives as _collectives
from hvdlite import handles as _handles

from . import _bridge
from .compression import Compression
from .mpi_ops import Adasum, Average, Sum, global_process_set
from .packing import PACK_BYTES, Packing

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = [
    "GradientReducer",
    "LocalSources",
    "local_layer_list",
    "normalize_groups",
    "reduce_with_local",
    "scale_local",
]


class LocalSources:
    """Variables whose gradients stay rank-local (PartialDistributed*)."""

    def __init__(self):
        self._keep = []
        self._ids = set()

    def add(self, var) -> None:
        self._keep.append(var)
        self._ids.add(id(var))
        inner = getattr(var, "value", None)  # a Keras 3 variable's tf.Variable
        if isinstance(inner, tf.Variable):
            self._ids.add(id(inner))

    def __contains__(self, var) -> bool:
        return id(var) in self._ids

    def __len__(self) -> int:
        return len(self._keep)


class GradientReducer:
    """Callable ``reducer(grads, variables) -> reduced grads`` (see module docstring)."""

    def __init__(
        self,
        name="DistributedGradientTape",
        compression=Compression.none,
        sparse_as_dense=False,
        op=Average,
        gradient_predivide_factor=1.0,
        groups=None,
        process_set=global_process_set,
    ):
        if gradient_predivide_factor != 1.0 and op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        if op not in (Average, Sum, Adasum):
            raise ValueError(
                f"hvdlite: gradients can be reduced with Average, Sum or Adasum, not {op!r}."
            )
        self.name = name
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        self.groups = groups
        self.process_set = process_set
        if op == Average:
            self.prescale = 1.0 / gradient_predivide_factor
            self.postscale = gradient_predivide_factor
        else:
            self.prescale = self.postscale = 1.0

    # -- grouping -------------------------------------------------------------
    def _dense_groups(self, dense_positions, grads, variables):
        return split_groups(dense_positions, self.groups, variables)

    # -- the reduction ----------------------------------------------------------
    @_no_autograph
    def __call__(self, grads, variables=None, use_generic_names=False):
        grads = list(grads)
        ps = self.process_set
        if not ps.included() or ps.size() == 1:
            return grads
        if self.sparse_as_dense:
            grads = [
                tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads
            ]
        dense = [
            i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)
        ]
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        if not dense and not sparse:
            return grads
        if sparse and self.op == Adasum:
            raise NotImplementedError(
                "The Adasum reduction does not support sparse gradients; pass sparse_as_dense=True."
            )

        with tf.name_scope(f"{self.name}_Allreduce"):
            compressed, ctxs = {}, {}
            for i in dense:
                compressed[i], ctxs[i] = self.compression.compress(tf.convert_to_tensor(grads[i]))
            wire, dtypes = [], []
            as_is = any(
                compressed[i].dtype in (tf.float16, tf.bfloat16) for i in dense
            ) and _basics.halves_cross_as_16_bits(ps)
            for i in dense:
                dtypes.append(compressed[i].dtype)
                wire.append(_bridge.to_wire(compressed[i], reduce=True, halves_as_is=as_is))
            for i in sparse:
                wire.append(_bridge.to_wire(grads[i].values, reduce=False))
                wire.append(grads[i].indices)
            for w in wire:
                _bridge.check_dtype(w.dtype, "gradient allreduce")
            for i in dense:
                if not compressed[i].dtype.is_floating:
                    raise ValueError(
                        f"hvdlite: gradient {i} has dtype "
                        f"{compressed[i].dtype.name}; gradients must be "
                        "floating point."
                    )

            # the framework dtype of each wire tensor, for the ranks to compare where
            # the wire hides it (bfloat16 or float16 widened to float32)
            kinds = [d.name for d in dtypes] + [
                d.name for i in sparse for d in (grads[i].values.dtype, grads[i].indices.dtype)
            ]
            position = {i: k for k, i in enumerate(dense)}
            dense_groups = [
                [position[i] for i in g] for g in self._dense_groups(dense, grads, variables) if g
            ]
            # In a graph, small gradients of a group travel as one flat tensor.
            packable = self.op in (Average, Sum) and not tf.executing_eagerly()
            packing = Packing(wire[: len(dense)], dense_groups, PACK_BYTES if packable else 0)
            dense_wire, dense_groups = packing.pack(wire[: len(dense)], dense_groups)
            kinds = packing.packed_names(kinds[: len(dense)]) + kinds[len(dense) :]
            base = self._base_name(wire, use_generic_names)
            outs = self._submit(
                dense_wire + wire[len(dense) :], dense_groups, len(dense_wire), base, kinds
            )
            outs = packing.unpack(outs[: len(dense_wire)]) + outs[len(dense_wire) :]

            result = list(grads)
            for k, i in enumerate(dense):
                out = _bridge.from_wire(outs[k], dtypes[k], reduce=True)
                result[i] = self.compression.decompress(out, ctxs[i])
            for j, i in enumerate(sparse):
                values = _bridge.from_wire(
                    outs[len(dense) + 2 * j], grads[i].values.dtype, reduce=False
                )
                indices = outs[len(dense) + 2 * j + 1]
                if self.op == Average:
                    values = values / tf.cast(ps.size(), values.dtype)
                result[i] = tf.IndexedSlices(values, indices, dense_shape=grads[i].dense_shape)
        return result

    def _base_name(self, wire, use_generic_names):
        if tf.executing_eagerly():
            return None
        if use_generic_names:
            return _bridge.op_name("GroupedAllreduce", wire, "grad", ignore_name_scope=False)
        return _bridge.op_name("GroupedAllreduce", wire, None)

    def _plans(self, wire, dense_groups):
        """Per group: ("flat", members) when it should travel as one contiguous buffer,
        else ("each", members).

        Flat needs one dtype, static shapes and Sum/Average, and pays off only where
        the set reduces through MPI: packing spares the engine its fusion-buffer
        copies.  The shared-memory path reads each gradient where it is and writes
        each output directly, so there the pack would be one more pass over the data.
        Nor float16 or bfloat16 (on their 16-bit wire across nodes): the engine
        scales them in float32, where the flat pack would scale in 16 bits.
        """
        if _basics.allreduce_uses_shared_memory(self.process_set):
            return [("each", members) for members in dense_groups]
        plans = []
        for members in dense_groups:
            ws = [wire[m] for m in members]
            flat = (
                self.op in (Average, Sum)
                and len({w.dtype for w in ws}) == 1
                and ws[0].dtype not in (tf.float16, tf.bfloat16)
                and all(w.shape.is_fully_defined() for w in ws)
            )
            plans.append(("flat" if flat else "each", members))
        return plans

    def _submit(self, wire, dense_groups, n_dense, base, kinds):
        """Submit every group (and the sparse parts), then wait: one numpy call.

        A "flat" group is packed by this adapter into one buffer, scaled on the
        way in (the Average's 1/size and the predivide factors folded into one
        multiply) and summed in place by a single-tensor allreduce, so the engine
        neither copies it into its fusion buffer nor back out; the numpy
        function returns its members as views of that buffer.  In a graph every
        buffer is a fresh array each run (TensorFlow adopts the outputs of a
        numpy function without a copy, see :func:`_bridge.fresh_output`).
        *kinds*: the TensorFlow dtype name of each wire tensor (a packed one's
        members' joined by "+"), sent as dtype names where the wire hides one.
        """
        ps, op, pre, post = self.process_set, self.op, self.prescale, self.postscale
        plans = self._plans(wire, dense_groups)
        scale = pre * post / (ps.size() if op == Average else 1)
        n_sparse = len(wire) - n_dense
        buffer = np.empty if tf.executing_eagerly() else _bridge.fresh_output

        def fn(*arrays, outputs=None):
            with _collectives.waiting_caller():  # waited on below, by this thread
                handles, views = submit(arrays)
            results = []
            flat_views = iter(views)
            for (kind, _), handle in zip(plans, handles, strict=False):
                out = _handles.synchronize(handle)
                # A flat group returns its members as views of the one buffer:
                # TensorFlow adopts (aligned) or copies each one; no tf.split copies again.
                results.extend(next(flat_views) if kind == "flat" else out)
            if n_sparse:
                results.extend(_handles.synchronize(handles[-1]))
            return results

        def submit(arrays):
            handles = []
            views = []  # per flat group: its members' slices of the flat buffer
            for g, (kind, members) in enumerate(plans):
                name = None if base is None else f"{base}.{g}"
                if kind == "flat":
                    parts = [arrays[m].reshape(-1) for m in members]
                    flat = buffer((sum(p.size for p in parts),), parts[0].dtype)
                    offset = 0
                    member_views = []
                    for m, part in zip(members, parts, strict=True):
                        view = flat[offset : offset + part.size]
                        offset += part.size
                        if scale != 1.0:
                            np.multiply(part, scale, out=view, casting="unsafe")
                        else:
                            np.copyto(view, part)
                        member_views.append(view.reshape(arrays[m].shape))
                    handles.append(
                        _collectives.allreduce_async(
                            flat,
                            op=Sum,
                            name=name,
                            process_set=ps,
                            output=flat,
                            dtype_names=_names(["+".join(kinds[m] for m in members)], [flat]),
                        )
                    )
                    views.append(member_views)
                else:
                    outs = [buffer(arrays[m].shape, arrays[m].dtype) for m in members]
                    handles.append(
                        _collectives.grouped_allreduce_async(
                            [arrays[m] for m in members],
                            op=op,
                            prescale_factor=pre,
                            postscale_factor=post,
                            process_set=ps,
                            name=name,
                            outputs=outs,
                            dtype_names=_names(
                                [kinds[m] for m in members], [arrays[m] for m in members]
                            ),
                        )
                    )
            if n_sparse:
                handles.append(
                    _collectives.grouped_allgather_async(
                        list(arrays[n_dense:]),
                        process_set=ps,
                        name=None if base is None else f"{base}.sparse",
                        dtype_names=_names(kinds[n_dense:], arrays[n_dense:]),
                    )
                )
            return handles, views

        dtypes, shapes = [], []
        for _, members in plans:
            dtypes += [wire[m].dtype for m in members]
            shapes += [wire[m].shape for m in members]
        for w in wire[n_dense:]:
            dtypes.append(w.dtype)
            shapes.append(tf.TensorShape([None]).concatenate(w.shape[1:]))
        outs = _bridge.run(fn, wire, dtypes, shapes, base)

        # Back to one output per input: dense positions first, then the sparse parts.
        dense_out = [None] * n_dense
        k = 0
        for _, members in plans:
            for m in members:
                dense_out[m] = outs[k]
                k += 1
        return dense_out + list(outs[k:])


def _names(kinds, arrays) -> tuple:
    """*kinds* (framework dtype names; a packed tensor's joined by "+") for the
    engine to compare where one of them is not the dtype of its numpy *array*;
    () where the engine sees them."""
    if all(
        part == a.dtype.name for k, a in zip(kinds, arrays, strict=True) for part in k.split("+")
    ):
        return ()
    return tuple(kinds)


def scale_local(grads, variables, local: LocalSources, size):
    """Horovod's ``scale_local_gradients``: divide rank-local gradients by the set size."""
    out = []
    for g, v in zip(grads, variables, strict=True):
        if g is None or v not in local:
            out.append(g)
        elif isinstance(g, tf.IndexedSlices):
            out.append(
                tf.IndexedSlices(g.values / tf.cast(size, g.values.dtype), g.indices, g.dense_shape)
            )
        else:
            out.append(g / tf.cast(size, g.dtype))
    return out


def reduce_with_local(
    reducer: GradientReducer,
    grads,
    variables,
    local: LocalSources,
    scale_local_gradients: bool,
    use_generic_names=False,
):
    """Reduce the non-local gradients; scale the local ones if asked (Horovod semantics)."""
    grads = list(grads)
    variables = list(variables) if variables is not None else None
    if variables is None or not len(local):
        return reducer(grads, variables, use_generic_names)
    shared = [i for i, v in enumerate(variables) if v not in local]
    reduced = reducer([grads[i] for i in shared], [variables[i] for i in shared], use_generic_names)
    out = list(grads)
    for i, g in zip(shared, reduced, strict=True):
        out[i] = g
    if scale_local_gradients and reducer.process_set.included():
        out = scale_local(out, variables, local, reducer.process_set.size())
    return out
