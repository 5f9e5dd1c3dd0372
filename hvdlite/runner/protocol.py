"""The one-line status messages a task wrapper sends to hvdrun through stderr.

Each rank's wrapper writes a line ``<marker> <json>`` when its command starts
(``start``), when the command reports that it begins and has finished starting
MPI (``mpi-begin``, ``mpi-ready``: see ``hvdlite/start_report.py``, which writes
to the pipe named by ``$HVDLITE_START_FD``), every few seconds while it runs
when hvdrun asks for it (``alive``: how hvdrun tells a host that stopped
answering from one that is busy), and when it ends (``exit``).
The line travels with the rank's ordinary stderr, through mpiexec's (or
srun's) output forwarding, so it reaches hvdrun from any host without a shared
file system or an extra network port.  The MPI launcher may
put a rank prefix in front of it (``[1] ``, ``[1,1]<stderr>:``, ``1: ``); the
decoder looks for the marker anywhere in the line.  hvdrun removes these lines
from what it prints.

The marker holds a random per-job token, which hvdrun makes up and hands to
every wrapper in ``$HVDLITE_JOB_TOKEN`` (the wrapper does not pass it on to the
rank's command).  :func:`decode` accepts a line only with this job's token and
only when every field has the type and range the wrapper writes; anything else
-- an old or foreign marker, bad JSON, a rank out of range -- is ordinary
output, never an error.

Standard library only: the task wrapper imports it as a plain file.
"""

from __future__ import annotations

import json
import math
import secrets

__all__ = [
    "MARKER",
    "MAX_LINE_CHARS",
    "TOKEN_VARIABLE",
    "START_FD_VARIABLE",
    "new_token",
    "beat_interval",
    "marker",
    "encode",
    "decode",
]

MARKER = "@@hvdlite-task"  # what every status line starts with, whatever its token
MAX_LINE_CHARS = 300  # each tail line in an exit message is cut to this length
TOKEN_VARIABLE = "HVDLITE_JOB_TOKEN"
START_FD_VARIABLE = "HVDLITE_START_FD"  # hvdlite/start_report.py reads the same name


def _is_int(value) -> bool:
    return type(value) is int  # bool is not an int here


def _is_str(value) -> bool:
    return isinstance(value, str)


def _is_time(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _is_lines(value) -> bool:
    return isinstance(value, list) and all(isinstance(line, str) for line in value)


# Each event's fields and what a valid value is (a missing field reads as None);
# other fields are ignored.
_FIELDS = {
    "start": {"host": _is_str, "pid": _is_int, "size": lambda v: _is_int(v) and v >= 1},
    "mpi-begin": {"host": _is_str},
    "mpi-ready": {"host": _is_str},
    "alive": {"host": _is_str},
    "exit": {
        "host": _is_str,
        "code": lambda v: _is_int(v) and 0 <= v < 256,
        "signal": lambda v: v is None or (_is_int(v) and v > 0),
        "signame": lambda v: v is None or _is_str(v),
        "stopped": lambda v: isinstance(v, bool),
        "frozen": lambda v: v is None or (_is_time(v) and v >= 0),
        "time": _is_time,
        "tail": _is_lines,
    },
}


_BEATS_PER_TIMEOUT = 6  # a rank is silent only once this many alive lines went missing


def beat_interval(silent_timeout: float) -> float:
    """How often (seconds) the task wrappers say ``alive`` when hvdrun takes a rank
    not heard from for *silent_timeout* seconds as cut off."""
    return max(silent_timeout / _BEATS_PER_TIMEOUT, 0.5)


def new_token() -> str:
    """A fresh job token: 16 hex digits."""
    return secrets.token_hex(8)


def marker(token: str) -> str:
    """The marker of the job whose token is *token*."""
    return f"{MARKER}-{token}@@"


def encode(message: dict, token: str) -> bytes:
    """The wire form of *message*: one line, ASCII-only, ending in a newline."""
    return (
        marker(token) + " " + json.dumps(message, ensure_ascii=True, separators=(",", ":")) + "\n"
    ).encode("ascii")


def _valid(message: dict, size: int | None) -> bool:
    event = message.get("event")
    fields = _FIELDS.get(event) if isinstance(event, str) else None
    rank = message.get("rank")
    if fields is None or not _is_int(rank) or rank < 0 or (size is not None and rank >= size):
        return False
    return all(check(message.get(name)) for name, check in fields.items())


def decode(line: str, token: str, size: int | None = None) -> dict | None:
    """The status message in *line*, or None when it is ordinary output.

    A message counts only with this job's *token* and valid fields; with *size*
    (the job's number of ranks) its rank must also be below *size*.
    """
    at = line.find(marker(token))
    if at < 0:
        return None
    try:
        message = json.loads(line[at + len(marker(token)) :])
    except (ValueError, RecursionError):
        return None
    return message if isinstance(message, dict) and _valid(message, size) else None
