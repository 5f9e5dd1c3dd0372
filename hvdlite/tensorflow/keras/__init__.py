"""hvdlite for Keras 3 (TensorFlow backend) — Horovod's ``horovod.tensorflow.keras``.

Switch with ``import hvdlite.tensorflow.keras as hvd``.  Provides the basics,
:func:`DistributedOptimizer` (works with ``model.compile``/``model.fit`` and
custom loops), the callbacks in :mod:`hvdlite.tensorflow.keras.callbacks`,
value-level collectives and :func:`load_model`.  The optimizer, callbacks,
elastic state and ``load_model`` are :mod:`hvdlite.keras`'s (one for every
Keras backend); this module adds TensorFlow's value collectives and
``SyncBatchNormalization``, and needs Keras on TensorFlow
(``KERAS_BACKEND=tensorflow``): on another backend importing it raises
ImportError pointing at :mod:`hvdlite.keras`.

Cross-rank contract: as for :mod:`hvdlite.tensorflow` — every rank runs the
same program: the same model, optimizer wrapper and callbacks, the same number
of steps.
"""

from __future__ import annotations

import keras

if keras.backend.backend() != "tensorflow":
    raise ImportError(
        "hvdlite.tensorflow.keras is Keras on TensorFlow, but Keras runs on "
        f"{keras.backend.backend()!r} (KERAS_BACKEND): use `import hvdlite.keras as hvd`, "
        "which works on the torch backend too, or set KERAS_BACKEND=tensorflow "
        "before keras is first imported"
    )

import tensorflow as tf  # noqa: E402

from hvdlite.common import *  # noqa: E402 - the basics every adapter re-exports, listed once
from hvdlite.common import __all__ as _common_names  # noqa: E402
from hvdlite.keras.saving import load_model  # noqa: E402
from hvdlite.ops import Average  # noqa: E402

from .. import reductions as _reductions
from .. import mpi_ops as _ops
from ..compression import Compression
from ..functions import allgather_object, broadcast_object, broadcast_object_fn  # noqa: F401
from ..sync_batch_norm import SyncBatchNormalization  # noqa: F401
from . import callbacks  # noqa: F401
from .optimizer import DistributedOptimizer, PartialDistributedOptimizer
from . import elastic  # noqa: F401  (hvd.elastic.KerasState and its callbacks)

__all__ = [
    *_common_names,
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
