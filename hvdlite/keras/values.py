"""Horovod's Keras value collectives (``hvd.allreduce(value)`` etc.) and object helpers.

A value is anything ``keras.ops.convert_to_numpy`` takes (a backend tensor, a
Keras variable, a numpy array, a number); it travels as a numpy array through
:mod:`hvdlite.collectives` and comes back as a tensor of the Keras backend
(``keras.ops.convert_to_tensor``), on its default device.  These are helpers
for occasional values (metrics, counters), not the gradient path.  On the
TensorFlow backend ``hvdlite.keras`` exports ``hvdlite.tensorflow.keras``'s
versions instead, which also work inside a ``tf.function``.

Cross-rank contract: :mod:`hvdlite.collectives`' (every rank calls each one
with matching dtypes and shapes, in the same order when unnamed).
"""

from __future__ import annotations

import numpy as np
from keras import ops

from hvdlite import collectives as _collectives
from hvdlite.objects import allgather_object, broadcast_object
from hvdlite.ops import Average
from hvdlite.process_sets import global_process_set

from ._select import current as _current_backend

__all__ = [
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "broadcast_global_variables",
]


def _array(value) -> np.ndarray:
    array = np.asarray(ops.convert_to_numpy(value))  # keeps a scalar 0-d
    return array if array.flags.c_contiguous else array.copy(order="C")


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=_current_backend().Compression.none,
):
    """Reduce a value across all ranks (default op Average).

    ``compression`` is accepted for Horovod compatibility and ignored: the
    value travels as it is.
    """
    return ops.convert_to_tensor(
        _collectives.allreduce(_array(value), average, name, op, prescale_factor, postscale_factor)
    )


def allgather(value, name=None):
    """Concatenate a value along dim 0 across all ranks."""
    return ops.convert_to_tensor(_collectives.allgather(_array(value), name))


def broadcast(value, root_rank, name=None):
    """Every rank gets ``root_rank``'s value."""
    return ops.convert_to_tensor(_collectives.broadcast(_array(value), root_rank, name))


def reducescatter(value, name=None, op=Average):
    """Reduce a value across ranks; each rank gets its block of dim-0 rows."""
    return ops.convert_to_tensor(_collectives.reducescatter(_array(value), name=name, op=op))


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod's helper)."""

    def _fn(obj):
        return broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)

    return _fn


def broadcast_global_variables(root_rank):
    """TF1-only in Horovod; with Keras 3 use ``callbacks.BroadcastGlobalVariablesCallback``."""
    raise RuntimeError(
        "hvd.broadcast_global_variables() does not support eager execution. Please use "
        "`hvd.callbacks.BroadcastGlobalVariablesCallback(0)` instead."
    )
