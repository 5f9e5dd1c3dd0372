"""``hvdlite.keras``: the module for ``import horovod.keras as hvd`` users, on Keras 3.

Horovod has two Keras modules, ``horovod.keras`` (standalone Keras) and
``horovod.tensorflow.keras`` (``tf.keras``); with Keras 3 they are the same
thing, so this module is :mod:`hvdlite.tensorflow.keras` under the other name:
the same objects (``hvdlite.keras.DistributedOptimizer is
hvdlite.tensorflow.keras.DistributedOptimizer``), the callbacks in
:mod:`hvdlite.keras.callbacks`, and ``load_model``.  Switch with
``import hvdlite.keras as hvd``.

Cross-rank contract: as for :mod:`hvdlite.tensorflow.keras`.
"""

from __future__ import annotations

import importlib as _importlib

from hvdlite.tensorflow.keras import *  # noqa: F403 - the whole public API, re-exported
from hvdlite.tensorflow.keras import __all__  # noqa: F401

# This package's own callbacks module (the star import brought the other one's).
callbacks = _importlib.import_module(__name__ + ".callbacks")
elastic = _importlib.import_module(__name__ + ".elastic")
