"""``horovod.runner``: ``run`` (``horovod.run``) is hvdlite's; ``launch`` is horovodrun's
entry point as ``hvdrun --as-horovod``."""

from __future__ import annotations

__all__ = ["run"]


def __getattr__(name: str):
    if name == "run":  # loaded on first use, as hvdlite.runner does
        from hvdlite.runner import run

        return run
    raise AttributeError(f"module 'horovod.runner' has no attribute {name!r}")
