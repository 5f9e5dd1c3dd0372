"""``horovod.common.util``: the helpers that libraries and Horovod's tests use."""

from __future__ import annotations

import contextlib
import os

from hvdlite.basics import (
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    mpi_built,
    nccl_built,
    rocm_built,
)

__all__ = [
    "ccl_built",
    "cuda_built",
    "ddl_built",
    "env",
    "extension_available",
    "gloo_built",
    "mpi_built",
    "nccl_built",
    "rocm_built",
]

_FRAMEWORKS = {"torch": "torch", "tensorflow": "tensorflow", "keras": "keras"}


class _Cache(dict):
    """Horovod's memo of extension checks; its tests clear it."""


_cache = _Cache()


def extension_available(ext_base_name: str, verbose: bool = False) -> bool:
    """Whether hvdlite can serve ``horovod.<ext_base_name>`` here: the framework is
    installed (hvdlite has no compiled extension to check)."""
    import importlib.util

    module = _FRAMEWORKS.get(ext_base_name)
    return module is not None and importlib.util.find_spec(module) is not None


@contextlib.contextmanager
def env(**values):
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
