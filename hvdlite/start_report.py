"""Tell hvdrun's task wrapper how far this rank has got in starting MPI.

hvdrun's ``--start-timeout`` bounds the launch: every rank's process must be
running, and, for a program that calls ``hvdlite.init()``, MPI must be up on
every rank.  A launch whose MPI start never finishes (a network module stuck
connecting, a host that froze after its process started) would otherwise sit
silent until someone kills it.

The task wrapper hands its command a pipe's write end and names it in
``$HVDLITE_START_FD`` as ``FD:INODE`` (the descriptor and the pipe's inode, so
that a descriptor number inherited from elsewhere, which may be another pipe
by now, is never written to).  ``init()`` writes ``begin`` before it initializes MPI
and ``ready`` once MPI is up (only ``ready`` when the program had initialized MPI
itself), then closes the pipe.  The wrapper turns each word into a status line
for hvdrun (see ``hvdlite/runner/protocol.py``).

Outside hvdrun (no variable, or a descriptor that is not that pipe) nothing
happens.  The variable is removed from this process's environment on first use,
so that processes this rank starts never write to a descriptor number that may
by then mean something else.  Standard library only.
"""

from __future__ import annotations

import os
import stat

__all__ = ["START_FD_VARIABLE", "begin", "ready"]

START_FD_VARIABLE = "HVDLITE_START_FD"  # the same name as hvdlite/runner/protocol.py's

_fd: int | None = None
_taken = False


def _pipe() -> int | None:
    """This rank's report descriptor, taken from the environment once; None without one."""
    global _fd, _taken
    if _taken:
        return _fd
    _taken = True
    value = os.environ.pop(START_FD_VARIABLE, "")
    try:
        fd_text, _, inode = value.partition(":")
        fd = int(fd_text)
        found = os.fstat(fd)
        if not stat.S_ISFIFO(found.st_mode) or found.st_ino != int(inode):
            return None
    except (ValueError, OSError):
        return None
    _fd = fd
    return _fd


def _say(word: bytes, last: bool) -> None:
    global _fd
    fd = _pipe()
    if fd is None:
        return
    try:
        os.write(fd, word + b"\n")
    except OSError:
        pass
    if last:
        try:
            os.close(fd)
        except OSError:
            pass
        _fd = None


def begin() -> None:
    """This rank is about to initialize MPI."""
    _say(b"begin", last=False)


def ready() -> None:
    """MPI is up on this rank; the report is complete."""
    _say(b"ready", last=True)
