"""``hvdlite.DistributedOptimizer``: one entry point for every framework.

It looks at the optimizer's class to pick the framework adapter, and imports
only that adapter: a framework the user has not imported is never imported
here (detection uses ``sys.modules`` and class module names only).
"""

from __future__ import annotations

import sys

__all__ = ["DistributedOptimizer"]

_KERAS_PREFIXES = ("keras.", "tf_keras.", "tensorflow.python.keras.", "tensorflow.keras.")


def _class_modules(obj) -> list[str]:
    return [getattr(cls, "__module__", "") or "" for cls in type(obj).__mro__]


def _is_torch_optimizer(obj) -> bool:
    torch = sys.modules.get("torch")
    optim = getattr(torch, "optim", None) if torch is not None else None
    base = getattr(optim, "Optimizer", None)
    return base is not None and isinstance(obj, base)


def _is_keras_optimizer(obj) -> bool:
    if not any(name in sys.modules for name in ("keras", "tf_keras", "tensorflow")):
        return False
    return any(m.startswith(_KERAS_PREFIXES) and ".optimizer" in m for m in _class_modules(obj))


def _is_tf1_optimizer(obj) -> bool:
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    base = getattr(getattr(getattr(tf, "compat", None), "v1", None), "train", None)
    base = getattr(base, "Optimizer", None)
    return base is not None and isinstance(obj, base)


def _is_optax_transformation(obj) -> bool:
    optax = sys.modules.get("optax")
    base = getattr(optax, "GradientTransformation", None) if optax is not None else None
    return base is not None and isinstance(obj, base)


def DistributedOptimizer(optimizer, *args, **kwargs):
    """Wrap *optimizer* with the data-parallel optimizer of its framework.

    A ``torch.optim.Optimizer`` goes to :func:`hvdlite.torch.DistributedOptimizer`,
    a Keras optimizer to :func:`hvdlite.keras.DistributedOptimizer` (on any Keras
    backend; on TensorFlow it is ``hvdlite.tensorflow.keras``'s), a
    ``tf.compat.v1.train.Optimizer`` to :func:`hvdlite.tensorflow.DistributedOptimizer`,
    an optax ``GradientTransformation`` to :func:`hvdlite.jax.DistributedOptimizer`;
    the remaining arguments are passed through unchanged.
    """
    if _is_torch_optimizer(optimizer):
        from hvdlite.torch import DistributedOptimizer as torch_distributed

        return torch_distributed(optimizer, *args, **kwargs)
    if _is_keras_optimizer(optimizer):
        from hvdlite.keras import DistributedOptimizer as keras_distributed

        return keras_distributed(optimizer, *args, **kwargs)
    if _is_tf1_optimizer(optimizer):
        from hvdlite.tensorflow import DistributedOptimizer as tf_distributed

        return tf_distributed(optimizer, *args, **kwargs)
    if _is_optax_transformation(optimizer):
        from hvdlite.jax import DistributedOptimizer as jax_distributed

        return jax_distributed(optimizer, *args, **kwargs)
    raise TypeError(
        f"hvdlite.DistributedOptimizer: unsupported optimizer type "
        f"{type(optimizer).__module__}.{type(optimizer).__qualname__}; supported are "
        f"torch.optim.Optimizer (hvdlite.torch.DistributedOptimizer), Keras "
        f"optimizers (hvdlite.keras.DistributedOptimizer), "
        f"tf.compat.v1.train.Optimizer (hvdlite.tensorflow.DistributedOptimizer) and optax "
        f"GradientTransformations (hvdlite.jax.DistributedOptimizer)"
    )
