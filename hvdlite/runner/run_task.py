"""What every rank runs for :func:`hvdlite.runner.run`: ``python -m hvdlite.runner.run_task DIR``.

``DIR`` (made by the caller, see :mod:`.runfunc`) holds ``function.pkl``, the
pickled ``(func, args, kwargs)``.  Each rank loads it, calls
``func(*args, **kwargs)`` and leaves what happened in ``DIR`` under its rank
(from the launcher's variables, see :mod:`.rankenv`; MPI is not initialised
for that):

- ``result.<rank>.pkl``: the pickled return value (cloudpickle when installed);
- ``error.<rank>.json``: when the function raised, or its value cannot be
  pickled: rank, host, exception type and message, the formatted traceback and
  the time.  The traceback also goes to stderr, so hvdrun's failure report
  shows it, and the rank exits with code 1 without ``MPI_Finalize``, which
  would wait for peers that may be waiting for this rank.

Each file is written under a temporary name and renamed, so the caller never
reads half a file.  Nothing goes to stdout but the function's own output.  In
an elastic job (``hvdlite.run`` with elastic arguments) the files of launch
``N`` go to ``DIR/launch.<N>/`` (:func:`launch_directory`): the caller reads
the last launch's.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import time
import traceback
from pathlib import Path

from ..elastic.layout import GENERATION_VARIABLE
from . import rankenv

__all__ = ["main", "FUNCTION_FILE", "result_file", "error_file", "launch_directory"]

FUNCTION_FILE = "function.pkl"


def result_file(directory: Path, rank: int) -> Path:
    return directory / f"result.{rank}.pkl"


def error_file(directory: Path, rank: int) -> Path:
    return directory / f"error.{rank}.json"


def launch_directory(directory: Path, environ=None) -> Path:
    """Where this rank leaves its files: *directory*, or ``launch.<N>`` in it when this
    is launch N of an elastic job (hvdrun's ``HVDLITE_ELASTIC_GENERATION``)."""
    generation = (os.environ if environ is None else environ).get(GENERATION_VARIABLE)
    return directory if generation is None else directory / f"launch.{int(generation)}"


def _write(path: Path, data: bytes) -> None:
    """*data* as *path*, whole: written to a new owner-only file beside it (a link
    there is never followed), then renamed over it."""
    partial = path.with_name(path.name + ".partial")
    try:
        partial.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(
        partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600
    )
    with open(fd, "wb") as handle:
        handle.write(data)
    os.replace(partial, path)


def _dumps(value: object) -> bytes:
    try:
        import cloudpickle
    except ImportError:
        return pickle.dumps(value)
    return cloudpickle.dumps(value)


def _fail(directory: Path, rank: int, exc: BaseException, what: str, own_frames: int = 0) -> int:
    """Report *exc* in DIR and on stderr, then end this rank with code 1.

    *own_frames*: how many of the traceback's first frames are this module's
    (left out: the user's traceback starts in the user's function)."""
    tb = exc.__traceback__
    for _ in range(own_frames):
        tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    report = {
        "rank": rank,
        "host": socket.gethostname(),
        "type": type(exc).__name__,
        "message": str(exc),
        "what": what,
        "traceback": text,
        "time": time.time(),
    }
    _write(error_file(directory, rank), json.dumps(report).encode())
    sys.stderr.write(f"hvdlite.run: rank {rank}: {what}:\n{text}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # not sys.exit: MPI_Finalize at exit would wait for the other ranks


def main(argv: list[str] | None = None) -> int:
    """Run the function in ``DIR`` (``argv[0]``) for this rank; 0 when it returned."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m hvdlite.runner.run_task DIR\n")
        return 2
    directory = Path(argv[0])
    where = launch_directory(directory)
    where.mkdir(exist_ok=True)
    who = rankenv.from_environ()
    rank = who.rank if who is not None else 0
    try:
        func, args, kwargs = pickle.loads((directory / FUNCTION_FILE).read_bytes())
    except BaseException as exc:  # noqa: BLE001 - any failure here is reported the same way
        return _fail(where, rank, exc, f"cannot load the function from {directory}")
    try:
        value = func(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt too
        name = getattr(func, "__qualname__", repr(func))
        return _fail(where, rank, exc, f"{name}() raised {type(exc).__name__}", own_frames=1)
    try:
        data = _dumps(value)
    except BaseException as exc:  # noqa: BLE001
        return _fail(
            where, rank, exc, f"cannot pickle the value it returned ({type(value).__name__})"
        )
    _write(result_file(where, rank), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
