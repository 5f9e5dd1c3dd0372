"""TF1 graph-mode API: ``tf.compat.v1.train.Optimizer`` wrapper and global-variable broadcast.

Horovod's ``horovod.tensorflow`` for ``tf.compat.v1`` graphs run by a
``Session`` (or ``MonitoredTrainingSession``):

* :class:`DistributedLegacyOptimizer` (what ``hvd.DistributedOptimizer``
  returns for a ``tf.compat.v1.train.Optimizer``): ``compute_gradients``
  reduces the wrapped optimizer's gradients across ranks in one grouped node
  (see :mod:`hvdlite.tensorflow.gradient_reduction`), ``apply_gradients``
  applies them with the wrapped optimizer, so ``minimize`` does both.  With
  ``backward_passes_per_step=n`` gradients accumulate locally (in local
  variables: run ``tf.compat.v1.local_variables_initializer()``, as a
  ``MonitoredSession`` does) and every n-th pass reduces and applies them; the
  other passes only advance the global step (Horovod's behaviour);
* :func:`broadcast_global_variables` and :class:`BroadcastGlobalVariablesHook`:
  give every rank ``root_rank``'s values of ``tf.compat.v1.global_variables()``.

Cross-rank contract: every rank builds the same graph and runs the same
training ops in the same order; every member of the process set then holds
the same reduced gradients.  Running the broadcast op is a collective too.
"""

from __future__ import annotations

import tensorflow as tf

from . import _bridge
from .compression import Compression
from .functions import broadcast_variables
from .gradient_reduction import GradientReducer
from .mpi_ops import Adasum, Average, global_process_set

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = [
    "DistributedLegacyOptimizer",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
]

_LegacyOptimizer = tf.compat.v1.train.Optimizer


def broadcast_global_variables(root_rank):
    """An op that assigns ``root_rank``'s values to every global variable
    (``tf.compat.v1.global_variables()``), for TF1 graphs.

    Eagerly there is no global-variable collection: raises RuntimeError naming
    :func:`~hvdlite.tensorflow.broadcast_variables`, as Horovod does.  Run the
    returned op once after the variables are initialised (the node is kept out
    of the chain of the graph's other collectives).
    """
    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. "
            "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead."
        )
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A ``SessionRunHook`` that broadcasts the global variables from
    ``root_rank`` once, right after the session is created (or restored from
    a checkpoint), so every rank starts from the same values.

    ``device`` places the broadcast op, as in Horovod.
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        if self.bcast_op is None or self.bcast_op.graph != tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord):
        session.run(self.bcast_op)


class DistributedLegacyOptimizer(_LegacyOptimizer):
    """A ``tf.compat.v1.train.Optimizer`` whose gradients are reduced across ranks.

    Wraps ``optimizer`` (composition, as Horovod's ``_DistributedOptimizer``):
    slots, names and variables are the wrapped optimizer's.  Build it with
    :func:`hvdlite.tensorflow.DistributedOptimizer`.
    """

    def __init__(
        self,
        optimizer,
        name=None,
        use_locking=False,
        compression=Compression.none,
        sparse_as_dense=False,
        op=Average,
        gradient_predivide_factor=1.0,
        backward_passes_per_step=1,
        average_aggregated_gradients=False,
        groups=None,
        process_set=global_process_set,
    ):
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = GradientReducer(
            name, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
        )
        self._aggregation = None
        if backward_passes_per_step > 1:
            self._aggregation = _LocalAggregation(
                self._reducer,
                backward_passes_per_step,
                average_aggregated_gradients,
                sparse_as_dense,
            )

    @_no_autograph
    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's ``(gradient, variable)`` pairs, gradients
        reduced across the process set (one grouped node)."""
        pairs = list(self._optimizer.compute_gradients(*args, **kwargs))
        if not pairs:
            return pairs
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._aggregation is not None:
            reduced = self._aggregation.compute(grads, variables)
        else:
            reduced = self._reducer(grads, variables)
        return list(zip(reduced, variables, strict=True))

    @_no_autograph
    def apply_gradients(self, *args, **kwargs):
        """Apply (already reduced) gradients with the wrapped optimizer."""
        if self._aggregation is not None:
            return self._aggregation.apply(
                lambda: self._optimizer.apply_gradients(*args, **kwargs), args, kwargs
            )
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def make_legacy_distributed(
    optimizer,
    name=None,
    use_locking=False,
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    groups=None,
    process_set=global_process_set,
):
    """:class:`DistributedLegacyOptimizer` for ``optimizer``, after checking what
    hvdlite supports with TF1 optimizers."""
    if op == Adasum:
        raise ValueError(
            "op=Adasum with a tf.compat.v1 optimizer (Horovod's delta-model Adasum) is not "
            "supported by hvdlite; use hvd.DistributedGradientTape(tape, op=hvd.Adasum)."
        )
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    return DistributedLegacyOptimizer(
        optimizer,
        name=name,
        use_locking=use_locking,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
    )


class _LocalAggregation:
    """``backward_passes_per_step = n > 1`` for a TF1 optimizer, in a graph.

    Each ``compute_gradients`` pass adds its gradients to local accumulators
    and counts; the n-th pass reduces the sums (divided by n with
    ``average_aggregated_gradients``), clears them and resets the count to 0.
    ``apply_gradients`` applies only when the count is 0, i.e. right after a
    reduction; on the other passes it advances the global step, if there is
    one.  Every rank counts alike, so every rank reduces on the same pass.
    """

    def __init__(self, reducer, n, average, sparse_as_dense):
        self.reducer = reducer
        self.n = n
        self.average = average
        self.sparse_as_dense = sparse_as_dense
        self.counter = None

    def _local_variable(self, name, initial, dtype):
        return tf.compat.v1.Variable(
            initial,
            name=name,
            dtype=dtype,
            trainable=False,
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        )

    def compute(self, grads, variables):
        if tf.executing_eagerly():
            raise ValueError(
                "backward_passes_per_step > 1 with a tf.compat.v1 optimizer "
                "works in graph mode only; eagerly, use a Keras optimizer."
            )
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return list(grads)
        dense = []
        for i in present:
            g = grads[i]
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError(
                        "IndexedSlices are not supported when "
                        "backward_passes_per_step > 1 and sparse_as_dense is "
                        "False."
                    )
                g = tf.convert_to_tensor(g)
            dense.append(g)
        with tf.compat.v1.variable_scope(None, default_name="hvd_aggregation"):
            accumulators = [
                self._local_variable(f"aggregated_{k}", tf.zeros(g.shape, g.dtype), g.dtype)
                for k, g in enumerate(dense)
            ]
            self.counter = self._local_variable("counter", 0, tf.int32)
        adds = [acc.assign_add(g) for acc, g in zip(accumulators, dense, strict=True)]
        with tf.control_dependencies(adds):
            count = self.counter.assign_add(1)

        def reduce():
            sums = [acc.read_value() for acc in accumulators]
            if self.average:
                sums = [s / tf.cast(self.n, s.dtype) for s in sums]
            reduced = self.reducer(sums, [variables[i] for i in present])
            with tf.control_dependencies(reduced):
                clear = [acc.assign(tf.zeros_like(acc)) for acc in accumulators]
                clear.append(self.counter.assign(0))
            with tf.control_dependencies(clear):
                return [tf.identity(r) for r in reduced]

        def skip():
            return [tf.identity(g) for g in dense]

        with _bridge.chain_link() as link:  # the cond holds a collective: order it
            out = tf.cond(tf.equal(count, self.n), reduce, skip)
            out = out if isinstance(out, (list, tuple)) else [out]
            link.append(out[0].op)
        result = list(grads)
        for i, g in zip(present, out, strict=True):
            result[i] = g
        return result

    def apply(self, apply_fn, args, kwargs):
        if self.counter is None:
            raise ValueError(
                "Call compute_gradients (or minimize) before apply_gradients "
                "when backward_passes_per_step > 1."
            )
        grads_and_vars = args[0] if args else kwargs.get("grads_and_vars", ())
        grads = [
            g.values if isinstance(g, tf.IndexedSlices) else g
            for g, _ in grads_and_vars
            if g is not None
        ]

        def advance_step():
            step = tf.compat.v1.train.get_global_step()
            if step is None:
                return tf.no_op()
            return step.assign_add(1, read_value=False)

        def apply():
            with tf.control_dependencies([apply_fn()]):
                return tf.constant(True)

        def skip():
            with tf.control_dependencies([advance_step()]):
                return tf.constant(False)

        with tf.control_dependencies(grads):
            applied = tf.cond(tf.equal(self.counter.read_value(), 0), apply, skip)
        return applied.op
