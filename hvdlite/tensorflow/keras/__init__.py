"""hvdlite for Keras 3 (TensorFlow backend) — Horovod's ``horovod.tensorflow.keras``.

Switch with ``import hvdlite.tensorflow.keras as hvd``.  Provides the basics,
:func:`DistributedOptimizer` (works with ``model.compile``/``model.fit`` and
custom loops), the callbacks in :mod:`hvdlite.tensorflow.keras.callbacks`,
value-level collectives and :func:`load_model`.

Cross-rank contract: as for :mod:`hvdlite.tensorflow` — every rank runs the
same program: the same model, optimizer wrapper and callbacks, the same number
of steps.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from .. import reductions as _reductions
from .. import mpi_ops as _ops
from ..compression import Compression
from ..mpi_ops import (  # noqa: F401  (re-exported basics)
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    ProcessSet,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ..functions import allgather_object, broadcast_object, broadcast_object_fn  # noqa: F401
from ..sync_batch_norm import SyncBatchNormalization  # noqa: F401
from . import callbacks  # noqa: F401
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer, make_distributed
from . import elastic  # noqa: F401  (hvd.elastic.KerasState and its callbacks)

from ...basics import COMMON_NAMES

__all__ = [
    *COMMON_NAMES,
    "HorovodInternalError",
    "Compression",
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "broadcast_global_variables",
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "load_model",
    "callbacks",
    "SyncBatchNormalization",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "elastic",
]


def broadcast_global_variables(root_rank):
    """TF1-only in Horovod; with Keras 3 use
    ``callbacks.BroadcastGlobalVariablesCallback`` or
    ``hvdlite.tensorflow.broadcast_variables(model.variables, root_rank)``."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support eager execution. Please use "
        "`hvd.broadcast_variables(<model/optimizer variables>)` or "
        "`hvd.callbacks.BroadcastGlobalVariablesCallback(0)` instead."
    )


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """Reduce a tensor-compatible value across all ranks (default op Average)."""
    return _reductions.allreduce(
        tf.convert_to_tensor(value),
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        name=name,
    )


def allgather(value, name=None):
    """Concatenate a tensor-compatible value along dim 0 across all ranks."""
    return _ops.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value, root_rank, name=None):
    """Every rank gets ``root_rank``'s value."""
    return _ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value, name=None, op=Average):
    """Reduce a value across ranks; each rank gets its block of dim-0 rows."""
    return _reductions.reducescatter(tf.convert_to_tensor(value), name=name, op=op)


def load_model(
    filepath,
    custom_optimizers=None,
    custom_objects=None,
    compression=Compression.none,
    legacy_opts=False,
):
    """Load a saved Keras model and make its optimizer a DistributedOptimizer.

    The optimizer keeps its loaded state (it is converted in place).
    ``custom_optimizers``: optimizer classes the file may name;
    ``custom_objects``: as for ``keras.models.load_model``.  ``legacy_opts``
    (Horovod: load into ``tf.keras.optimizers.legacy`` classes) is accepted and
    changes nothing: Keras 3 has one family of optimizers.
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer) and not hasattr(optimizer, "_hvd"):
        make_distributed(optimizer, compression=compression, in_place=True)
    return model
