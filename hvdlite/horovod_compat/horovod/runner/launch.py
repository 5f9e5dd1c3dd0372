"""``horovod.runner.launch``: horovodrun's entry point, as ``hvdrun --as-horovod``."""

from __future__ import annotations

import sys

__all__ = ["run_commandline"]


def run_commandline() -> None:
    """horovodrun: hvdrun with ``--as-horovod`` and this command line; exits with its status."""
    from hvdlite.runner.cli import main

    sys.exit(main(["--as-horovod", *sys.argv[1:]]))


if __name__ == "__main__":
    run_commandline()
