"""``horovod``, served by hvdlite (``hvdrun --as-horovod``; see :mod:`hvdlite.horovod_compat`).

Only ``hvdrun --as-horovod`` puts this package on a path.  Importing it puts a
finder first on ``sys.meta_path`` that answers for ``horovod.*``:

- ``horovod.torch``, ``horovod.tensorflow`` (with ``horovod.tensorflow.keras``)
  and ``horovod.keras``, and every submodule hvdlite has under them
  (``horovod.torch.elastic``, ``horovod.tensorflow.keras.callbacks``, ...) are
  hvdlite's modules themselves: ``horovod.torch is hvdlite.torch``;
- ``horovod.common.exceptions``, ``.basics``, ``.process_sets`` and ``.elastic``
  are hvdlite's ``exceptions``, ``basics``, ``process_sets`` and ``elastic``;
- ``horovod.tensorflow.util`` is made here (``_executing_eagerly``);
- the rest of ``horovod.common`` and ``horovod.runner`` (``horovod.run``, ``horovod.runner.launch``,
  the helpers libraries and Horovod's tests import) are the files of this package;
- a module of Horovod's that hvdlite does not have (:data:`MISSING`) is a
  ModuleNotFoundError naming what is missing; a name Horovod does not have
  either is not found, as usual.

``__version__`` is the Horovod release whose API hvdlite mirrors (libraries
compare it); hvdlite's own is ``__hvdlite_version__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

from hvdlite.horovod_compat import HOROVOD_VERSION
from hvdlite.version import __version__ as __hvdlite_version__

__all__ = ["run", "__version__"]

__version__ = HOROVOD_VERSION
__hvdlite_stands_in__ = True  # hvdlite.init() says once that hvdlite stands in for Horovod

# horovod.X -> hvdlite.X for these packages and everything under them.
_TREES = {
    "horovod.torch": "hvdlite.torch",
    "horovod.tensorflow": "hvdlite.tensorflow",
    "horovod.keras": "hvdlite.keras",
}
# Single modules served by an hvdlite module (or a module of this package).
_MODULES = {
    "horovod.common.exceptions": "hvdlite.exceptions",
    "horovod.common.basics": "hvdlite.basics",
    "horovod.common.process_sets": "hvdlite.process_sets",
    "horovod.common.elastic": "hvdlite.elastic",
    "horovod.tensorflow.util": "horovod._tensorflow_util",
}
_ONLY_HOROVOD = "run the program under a real Horovod (horovodrun, without hvdrun --as-horovod)"
#: Horovod's modules that hvdlite does not have (each name and everything under it),
#: with what is missing and what to do.
MISSING = {
    "horovod.spark": "Horovod's Spark integration (horovod.spark.run, the estimators)",
    "horovod.ray": "Horovod's Ray integration (RayExecutor, elastic Ray jobs)",
    "horovod.mxnet": "an MXNet adapter",
    "horovod.data": "Horovod's data service",
    "horovod.tensorflow.data": "Horovod's tf.data service (compute workers)",
    "horovod.tensorflow.gradient_aggregation": (
        "Horovod's internal gradient-aggregation helper: use "
        "DistributedOptimizer(backward_passes_per_step=N)"
    ),
    "horovod.tensorflow.gradient_aggregation_eager": (
        "Horovod's internal gradient-aggregation helper: use "
        "DistributedOptimizer(backward_passes_per_step=N)"
    ),
    "horovod.torch.mpi_lib": "Horovod's compiled library (hvdlite is pure Python)",
    "horovod.torch.mpi_lib_v2": "Horovod's compiled library (hvdlite is pure Python)",
    "horovod.tensorflow.mpi_lib": "Horovod's compiled library (hvdlite is pure Python)",
    "horovod.common.common": "Horovod's compiled library (hvdlite is pure Python)",
}
for _name in (
    "gloo_run",
    "mpi_run",
    "js_run",
    "driver",
    "task",
    "task_fn",
    "http",
    "elastic",
    "gloo",
    "common.service",
):
    MISSING[f"horovod.runner.{_name}"] = (
        f"horovodrun's internals (horovod.runner.{_name}); hvdlite has horovod.run "
        "and horovod.runner.launch, and its launcher is hvdrun"
    )


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def missing_error(fullname: str, what: str) -> ModuleNotFoundError:
    """The error for *fullname*, one of Horovod's modules that hvdlite has not."""
    return ModuleNotFoundError(
        f"No module named {fullname!r}: hvdlite stands in for Horovod here (hvdrun "
        f"--as-horovod) and has no {what}. hvdlite serves horovod.torch, "
        "horovod.tensorflow (with .keras), horovod.keras, horovod.common and horovod.run; "
        f"for the rest, {_ONLY_HOROVOD}.",
        name=fullname,
    )


def _target(fullname: str) -> str | None:
    """The module that serves *fullname*, or None when this package's files do."""
    if fullname in _MODULES:
        return _MODULES[fullname]
    for tree, hvdlite_name in _TREES.items():
        if _under(fullname, tree):
            return hvdlite_name + fullname[len(tree) :]
    return None


class _Served(importlib.abc.Loader):
    """Loads an alias: the module already imported under its own name."""

    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module) -> None:
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Answers for ``horovod.*`` (see the module docstring)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        for package, what in MISSING.items():
            if _under(fullname, package):
                raise missing_error(fullname, what)
        serving = _target(fullname)
        if serving is None:
            return importlib.machinery.PathFinder.find_spec(fullname, path)
        try:
            module = importlib.import_module(serving)
        except ModuleNotFoundError as exc:
            if exc.name == serving:  # hvdlite has no such module: neither does Horovod
                return None
            raise  # a module it needs is missing (torch, tensorflow): say that one
        return importlib.util.spec_from_loader(
            fullname, _Served(module), is_package=hasattr(module, "__path__")
        )


if __name__ == "horovod" and not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def __getattr__(name: str):
    if name == "run":  # horovod.run: a function on every rank of a new job
        from hvdlite.runner import run

        return run
    raise AttributeError(f"module 'horovod' has no attribute {name!r}")
