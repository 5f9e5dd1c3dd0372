"""Which :class:`~hvdlite.keras._backend.KerasBackend` this process uses, read once.

Keras 3 fixes its backend when ``keras`` is first imported (``KERAS_BACKEND``
or ``~/.keras/keras.json``).  :func:`current` asks ``keras.backend.backend()``
once and imports only that backend's module:

- ``tensorflow`` -> :mod:`._backend_tensorflow` (``hvdlite.tensorflow``'s reduction);
- ``torch`` -> :mod:`._backend_torch` (``hvdlite.torch``'s grouped allreduce);
- ``jax`` -> :mod:`._backend_jax` (``hvdlite.jax``'s traced grouped allreduce);
- anything else (``numpy``, ``openvino``) -> an
  :class:`~hvdlite.keras._backend.UnsupportedBackend` naming the backends that work.

Adding a backend: a module with a ``BACKEND`` (a ``KerasBackend`` subclass
instance) and a branch here.
"""

from __future__ import annotations

import functools

from ._backend import KerasBackend, UnsupportedBackend

__all__ = ["current"]


@functools.cache
def current() -> KerasBackend:
    """The backend Keras runs on, as hvdlite's interface to it (local; the same on every call)."""
    import keras

    name = keras.backend.backend()
    if name == "tensorflow":
        from ._backend_tensorflow import BACKEND
    elif name == "torch":
        from ._backend_torch import BACKEND
    elif name == "jax":
        from ._backend_jax import BACKEND
    else:
        BACKEND = UnsupportedBackend(name)
    return BACKEND
