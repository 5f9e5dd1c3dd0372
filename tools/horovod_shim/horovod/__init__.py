"""A stand-in ``horovod`` package that serves hvdlite, for running Horovod's own suites.

``import horovod.torch as hvd`` gives ``hvdlite.torch``, ``horovod.tensorflow``
gives ``hvdlite.tensorflow``, and so on for every ``horovod.X`` that hvdlite
has.  A few helper modules that Horovod's tests import but that are not part of
Horovod's API (``horovod.tensorflow.util``, ``horovod.common.util``,
``horovod.runner.util.threads``, ``horovod.runner.common.util.env``) are provided
here with just what the tests use.
Only ``tools/horovod_suites.py`` puts this directory on ``sys.path``; hvdlite
itself never does.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
import threading
import types


def _tensorflow_util() -> types.ModuleType:
    import tensorflow as tf

    module = types.ModuleType("horovod.tensorflow.util")
    module._executing_eagerly = tf.executing_eagerly
    return module


def _common_util() -> types.ModuleType:
    from hvdlite import basics

    module = types.ModuleType("horovod.common.util")
    module.gloo_built = basics.gloo_built
    module.mpi_built = basics.mpi_built
    module.extension_available = lambda ext, verbose=False: ext in ("torch", "tensorflow")

    class _Cache(dict):
        def clear(self):  # the suite clears Horovod's memo of extension checks
            super().clear()

    module._cache = _Cache()
    module.env = _environment_override
    return module


@contextlib.contextmanager
def _environment_override(**values):
    """Set the given environment variables (None: leave alone) for the block, then put
    back what was there before."""
    values = {key: value for key, value in values.items() if value is not None}
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, before in saved.items():
            if before is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = before


def _runner_env() -> types.ModuleType:
    module = types.ModuleType("horovod.runner.common.util.env")

    def get_env_rank_and_size():
        """(rank, size) from the launcher's variables; (0, 1) outside a launcher."""
        for rank_name, size_name in (
            ("HOROVOD_RANK", "HOROVOD_SIZE"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
            ("PMI_RANK", "PMI_SIZE"),
        ):
            if rank_name in os.environ and size_name in os.environ:
                return int(os.environ[rank_name]), int(os.environ[size_name])
        return 0, 1

    module.get_env_rank_and_size = get_env_rank_and_size
    return module


def _runner_threads() -> types.ModuleType:
    module = types.ModuleType("horovod.runner.util.threads")

    def in_thread(target, args=(), name=None, daemon=True, silent=False):
        """Run *target* in a new daemon thread and return the thread."""
        thread = threading.Thread(target=target, args=args, name=name, daemon=daemon)
        thread.start()
        return thread

    module.in_thread = in_thread
    return module


def _package(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = []  # a package, so that its submodules can be imported
    return module


_MADE = {
    "horovod.tensorflow.util": _tensorflow_util,
    "horovod.common": lambda: _package("horovod.common"),
    "horovod.common.util": _common_util,
    "horovod.runner": lambda: _package("horovod.runner"),
    "horovod.runner.util": lambda: _package("horovod.runner.util"),
    "horovod.runner.util.threads": _runner_threads,
    "horovod.runner.common": lambda: _package("horovod.runner.common"),
    "horovod.runner.common.util": lambda: _package("horovod.runner.common.util"),
    "horovod.runner.common.util.env": _runner_env,
}


class _HvdliteAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``horovod.X`` as ``hvdlite.X`` (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("horovod."):
            return None
        if (
            fullname not in _MADE
            and importlib.util.find_spec("hvdlite" + fullname[len("horovod") :]) is None
        ):
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=True)

    def create_module(self, spec):
        make = _MADE.get(spec.name)
        if make is not None:
            return make()
        return importlib.import_module("hvdlite" + spec.name[len("horovod") :])

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _HvdliteAlias())
