"""Keras 3 ``DistributedOptimizer`` (``hvdlite.tensorflow.keras``'s names for it).

The optimizer is one for every Keras backend: :mod:`hvdlite.keras.optimizer`.
"""

from __future__ import annotations

from hvdlite.keras.optimizer import (  # noqa: F401
    DistributedOptimizer,
    PartialDistributedOptimizer,
    make_distributed,
)

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "make_distributed"]
