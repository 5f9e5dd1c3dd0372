"""Horovod programs unchanged: what ``hvdrun --as-horovod`` puts on the ranks' path.

This directory holds a package named ``horovod`` (``horovod/`` here).  With
``--as-horovod`` hvdrun puts the directory first on every rank's ``PYTHONPATH``
(:func:`rank_environment`), in the variables it hands the launcher, so that it
reaches ranks on other hosts too; ``import horovod.torch as hvd`` in a rank then
gives ``hvdlite.torch`` -- the same module object -- and so on for
``horovod.tensorflow`` (and ``.keras``), ``horovod.keras``, ``horovod.common``
and ``horovod.run``.  What hvdlite lacks (Spark, Ray, MXNet, the data service,
Horovod's compiled libraries) raises a ModuleNotFoundError that names it
(:data:`horovod.MISSING`).  ``docs/horovod-programs.md`` is the user's guide.

Without the flag nothing here is on any path: ``import horovod`` finds a real
Horovod or fails as it always did.  hvdlite's own modules never import
``horovod``; :func:`hvdlite.init` only looks whether the ``horovod`` module a
program loaded is this one (``__hvdlite_stands_in__``), to say so once.

Standard library only: hvdrun imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PATH", "HOROVOD_VERSION", "rank_environment"]

#: The directory to put first on a rank's PYTHONPATH; it holds the ``horovod`` package.
PATH = str(Path(__file__).resolve().parent)

#: The Horovod release whose public API hvdlite mirrors: ``horovod.__version__``.
HOROVOD_VERSION = "0.28.1"


def rank_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that make ``import horovod`` give hvdlite in a process started
    with *environ*: its PYTHONPATH with :data:`PATH` in front (once)."""
    old = [entry for entry in environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return {"PYTHONPATH": os.pathsep.join([PATH, *(entry for entry in old if entry != PATH)])}
