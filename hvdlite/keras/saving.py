"""``load_model``: a saved Keras model whose optimizer comes back distributed.

Local (no collective): every rank may load its own copy; the optimizer is
made a ``DistributedOptimizer`` in place, keeping its loaded state.
"""

from __future__ import annotations

import keras

from .optimizer import Compression, make_distributed

__all__ = ["load_model"]


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
