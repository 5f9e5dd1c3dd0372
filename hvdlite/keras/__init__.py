"""``hvdlite.keras``: Horovod's Keras API on Keras 3, on the TensorFlow, PyTorch or JAX backend.

Switch with ``import hvdlite.keras as hvd`` (Horovod's ``horovod.keras``; on
the TensorFlow backend ``hvdlite.tensorflow.keras`` is the same module under
its other name).  Keras picks its backend when it is first imported
(``KERAS_BACKEND=tensorflow|torch|jax``); hvdlite reads it once
(:mod:`._select`) and talks to it through one interface
(:class:`._backend.KerasBackend`):

- :mod:`.optimizer` -- ``DistributedOptimizer`` (and the partial one): reduces
  a step's gradients in one grouped submission, through ``hvdlite.tensorflow``
  on TensorFlow, ``hvdlite.torch`` on PyTorch and ``hvdlite.jax`` on JAX
  (inside the jitted train step);
- :mod:`.callbacks`, :mod:`.elastic` -- Horovod's callbacks and the elastic
  ``KerasState``;
- :mod:`.saving` -- ``load_model``; :mod:`.values` -- the value collectives.

On the TensorFlow backend this module exports exactly
``hvdlite.tensorflow.keras``'s names and objects (``SyncBatchNormalization``
and graph-capable value collectives included).  On the torch
and JAX backends it imports no TensorFlow; what needs TensorFlow
(``SyncBatchNormalization``) is absent and says so.

Cross-rank contract: every rank runs the same program on the same Keras
backend: the same model, optimizer wrapper and callbacks, the same number
of steps.
"""

from __future__ import annotations

import importlib as _importlib

from hvdlite.common import *  # the basics every adapter re-exports, listed once
from hvdlite.common import __all__ as _common_names

from ._select import current as _current_backend
from .optimizer import Compression, DistributedOptimizer, PartialDistributedOptimizer
from .saving import load_model

callbacks = _importlib.import_module(__name__ + ".callbacks")
elastic = _importlib.import_module(__name__ + ".elastic")

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

#: On TensorFlow, these are ``hvdlite.tensorflow.keras``'s (tf tensors, graph-capable).
_TENSORFLOW_NAMES = (
    "allreduce",
    "allgather",
    "broadcast",
    "reducescatter",
    "SyncBatchNormalization",
    "broadcast_object",
    "broadcast_object_fn",
    "allgather_object",
    "broadcast_global_variables",
)

if _current_backend().name == "tensorflow":

    def __getattr__(name: str):
        # Loaded on first use, so that hvdlite.tensorflow.keras (which imports
        # this package's modules) can be imported before or after this one.
        if name in _TENSORFLOW_NAMES:
            value = getattr(_importlib.import_module("hvdlite.tensorflow.keras"), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

else:
    from .values import (  # noqa: F401
        allgather,
        allgather_object,
        allreduce,
        broadcast,
        broadcast_global_variables,
        broadcast_object,
        broadcast_object_fn,
        reducescatter,
    )

    __all__.remove("SyncBatchNormalization")

    def __getattr__(name: str):
        if name == "SyncBatchNormalization":
            raise AttributeError(
                "hvdlite.keras.SyncBatchNormalization is a TensorFlow layer and Keras runs "
                f"on {_current_backend().name!r}: set KERAS_BACKEND=tensorflow to use it"
            )
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
