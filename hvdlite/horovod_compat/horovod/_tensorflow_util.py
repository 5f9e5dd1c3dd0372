"""``horovod.tensorflow.util``: what libraries and Horovod's tests take from it."""

from __future__ import annotations

__all__ = ["_executing_eagerly"]


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (not inside a graph being built)."""
    import tensorflow as tf

    return tf.executing_eagerly()
