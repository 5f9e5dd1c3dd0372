"""The names every framework module re-exports, listed once (Horovod's common basics).

``hvdlite.torch``, ``hvdlite.tensorflow`` (and its ``mpi_ops`` and ``keras``),
``hvdlite.keras`` and ``hvdlite.jax`` each offer ``hvd.init()``, ``hvd.rank()``,
the reduce ops, the process sets and ``HorovodInternalError`` as Horovod's
framework modules do.  They take them from here with ``from hvdlite.common
import *`` and splice :data:`__all__` into their own, so a name added here
reaches every adapter.  The objects are the engine's own (``hvd.init is
hvdlite.init``); nothing here imports a framework.

The basics (``init`` ... ``stop_timeline``) are :mod:`hvdlite.basics`'s
``__all__``; this module adds the reduce ops, the process sets and the error.
Importing it imports numpy (through :mod:`hvdlite.dynamic_sets`), so the
light top-level ``hvdlite`` package does not.

Cross-rank contract: each name's own (``init()`` is collective; rank queries
are local).
"""

from __future__ import annotations

from .basics import *  # noqa: F403 - the basics, named once in basics.__all__
from .basics import __all__ as _BASICS
from .dynamic_sets import add_process_set, remove_process_set
from .exceptions import HorovodInternalError
from .ops import HANDLES
from .ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 - HANDLES names them
from .process_sets import ProcessSet, global_process_set

__all__ = [
    *_BASICS,
    *HANDLES,
    "ProcessSet",
    "global_process_set",
    "add_process_set",
    "remove_process_set",
    "HorovodInternalError",
]
