"""hvdlite for TensorFlow 2 — Horovod's ``horovod.tensorflow`` API on the hvdlite engine.

Switch with ``import hvdlite.tensorflow as hvd`` in place of
``import horovod.tensorflow as hvd``.

Layering (dependencies point downwards only)::

    keras/ (DistributedOptimizer,     legacy (TF1 optimizer,    gradient_tape,
            callbacks)                 global-variable bcast)    sync_batch_norm
                 \\                            |                    /
                  gradient_reduction (one grouped submission per step)
                                  |
          reductions (compression, IndexedSlices)   functions (objects, variables)
                                  |
                 mpi_ops (collectives + gradients, graph-time basics)
                                  |
     _bridge (eager call or one tf.numpy_function node; graph order)   _errors
                                  |
                     hvdlite engine (numpy arrays, MPI)

Every collective works eagerly, inside ``tf.function`` and in ``tf.compat.v1``
graphs.  Errors take Horovod's TensorFlow classes: a mismatch across ranks
raises ``tf.errors.FailedPreconditionError``, a bad argument
``tf.errors.InvalidArgumentError``.  Cross-rank contract, as in Horovod: every
member of a process set calls the same collectives in the same order with
matching dtypes and shapes.
"""

from __future__ import annotations

from hvdlite.common import *  # the basics every adapter re-exports, listed once
from hvdlite.common import __all__ as _common_names
from hvdlite.exceptions import HostsUpdatedInterrupt
from hvdlite.ops import Adasum, Average
from hvdlite.process_sets import global_process_set

from .compression import Compression
from .functions import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables
from .gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from .legacy import BroadcastGlobalVariablesHook, broadcast_global_variables
from .mpi_ops import (  # Horovod exposes the underscored ops too
    _allreduce,
    _grouped_allreduce,
    _grouped_reducescatter,
    _reducescatter,
    allgather,
    alltoall,
    barrier,
    broadcast,
    broadcast_,
    check_num_rank_power_of_2,
    grouped_allgather,
    handle_average_backwards_compatibility,
    join,
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from .reductions import allreduce, grouped_allreduce, grouped_reducescatter, reducescatter

from . import elastic  # noqa: E402 - hvd.elastic.run, TensorFlowKerasState


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here: Horovod's ``horovod.tensorflow`` exposes
    this private helper, and scripts (its own tests among them) call it as
    ``hvd._executing_eagerly()``."""
    import tensorflow as tf

    return tf.executing_eagerly()


__all__ = [
    *_common_names,
    "HostsUpdatedInterrupt",
    # collectives
    "allreduce",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "broadcast_",
    "alltoall",
    "reducescatter",
    "grouped_reducescatter",
    "join",
    "barrier",
    "size_op",
    "local_size_op",
    "rank_op",
    "local_rank_op",
    "process_set_included_op",
    # helpers and training
    "Compression",
    "broadcast_variables",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "DistributedGradientTape",
    "PartialDistributedGradientTape",
    "DistributedOptimizer",
    "SyncBatchNormalization",
    "broadcast_global_variables",
    "BroadcastGlobalVariablesHook",
]


def DistributedOptimizer(
    optimizer,
    name=None,
    use_locking=False,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    backward_passes_per_step=1,
    op=Average,
    gradient_predivide_factor=1.0,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
    shard_optimizer_state=False,
):
    """Horovod's ``hvd.DistributedOptimizer`` for TensorFlow.

    A ``tf.compat.v1.train.Optimizer`` (TF1 graphs, ``minimize`` /
    ``compute_gradients`` / ``apply_gradients``) is wrapped by
    :class:`~hvdlite.tensorflow.legacy.DistributedLegacyOptimizer`; a Keras 3
    optimizer by :func:`hvdlite.tensorflow.keras.DistributedOptimizer` (same
    arguments).  Anything else raises ValueError.  ``shard_optimizer_state=True``
    is refused for both, naming why (torch only).
    """
    import tensorflow as tf

    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from .._optimizer_args import refuse_sharding

        refuse_sharding("tensorflow", shard_optimizer_state)
        from .gradient_reduction import normalize_groups
        from .legacy import make_legacy_distributed

        return make_legacy_distributed(
            optimizer,
            name=name,
            use_locking=use_locking,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            backward_passes_per_step=backward_passes_per_step,
            op=op,
            gradient_predivide_factor=gradient_predivide_factor,
            average_aggregated_gradients=average_aggregated_gradients,
            groups=normalize_groups(num_groups, groups),
            process_set=process_set,
        )
    import keras

    if isinstance(optimizer, keras.optimizers.Optimizer):
        if op == Adasum:
            raise ValueError("op == Adasum is not supported yet with Keras")
        from .keras import DistributedOptimizer as _keras_distributed_optimizer

        return _keras_distributed_optimizer(
            optimizer,
            name=name,
            compression=compression,
            sparse_as_dense=sparse_as_dense,
            gradient_predivide_factor=gradient_predivide_factor,
            op=op,
            backward_passes_per_step=backward_passes_per_step,
            average_aggregated_gradients=average_aggregated_gradients,
            num_groups=num_groups,
            groups=groups,
            process_set=process_set,
            scale_local_gradients=scale_local_gradients,
            shard_optimizer_state=shard_optimizer_state,
        )
    raise ValueError(
        "Provided optimizer doesn't inherit from either legacy TensorFlow or Keras optimizer: "
        f"{type(optimizer).__name__}. hvdlite supports tf.compat.v1.train.Optimizer and "
        "Keras 3 optimizers (keras.optimizers.*); for custom training loops use "
        "hvdlite.tensorflow.DistributedGradientTape."
    )


def __getattr__(name):
    if name == "SyncBatchNormalization":  # imports keras: only when asked for
        from .sync_batch_norm import SyncBatchNormalization

        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
