"""Keras on JAX: not supported yet; the place where that support goes.

Keras' JAX backend trains through stateless functions (``stateless_apply``
inside a jitted step), which need ``hvdlite.jax``'s collectives inside the
trace.  Until then :data:`BACKEND` refuses, naming the fix, when a
``DistributedOptimizer`` is made (on every rank: each one constructs it).
"""

from __future__ import annotations

from ._backend import UnsupportedBackend

__all__ = ["BACKEND"]

BACKEND = UnsupportedBackend("jax", " yet (hvdlite.keras trains on TensorFlow and PyTorch)")
