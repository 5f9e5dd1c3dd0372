"""``python -m hvdlite.horovodrun``: horovodrun for programs written for Horovod.

The same as ``hvdrun --as-horovod``: every horovodrun flag, and in every rank
``import horovod`` gives hvdlite (see :mod:`hvdlite.horovod_compat`).  hvdlite
installs no ``horovodrun`` command, which would shadow a real Horovod's; where
scripts call ``horovodrun``, ``docs/horovod-programs.md`` shows a two-line one.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """hvdrun --as-horovod with *argv* (default ``sys.argv[1:]``); the exit status."""
    from .runner.cli import main as hvdrun

    return hvdrun(["--as-horovod", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
