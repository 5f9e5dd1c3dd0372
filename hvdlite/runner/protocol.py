"""The one-line status messages a task wrapper sends to hvdrun through stderr.

Each rank's wrapper writes a line ``<MARKER> <json>`` when its command starts
and when it ends.  The line travels with the rank's ordinary stderr, through
mpiexec's (or srun's) output forwarding, so it reaches hvdrun from any host
without a shared file system or an extra network port.  The MPI launcher may
put a rank prefix in front of it (``[1] ``, ``[1,1]<stderr>:``, ``1: ``); the
decoder looks for the marker anywhere in the line.  hvdrun removes these lines
from what it prints.

Standard library only: the task wrapper imports it as a plain file.
"""

from __future__ import annotations

import json

__all__ = ["MARKER", "MAX_LINE_CHARS", "encode", "decode"]

MARKER = "@@hvdlite-task@@"
MAX_LINE_CHARS = 300  # each tail line in an exit message is cut to this length


def encode(message: dict) -> bytes:
    """The wire form of *message*: one line, ASCII-only, ending in a newline."""
    return (MARKER + " " + json.dumps(message, ensure_ascii=True, separators=(",", ":"))
            + "\n").encode("ascii")


def decode(line: str) -> dict | None:
    """The message carried by *line*, or None when it is ordinary output."""
    at = line.find(MARKER)
    if at < 0:
        return None
    try:
        message = json.loads(line[at + len(MARKER):])
    except ValueError:
        return None
    return message if isinstance(message, dict) and "event" in message else None
