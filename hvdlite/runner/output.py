"""What hvdrun passes on of the launcher's output: each rank's traceback in one piece,
and without the launcher's notice about a failure hvdrun reports itself.

:class:`OutputOrder` takes the launcher's output one whole line at a time (each
with its rank prefix, see :func:`~.report.split_rank`) and returns the lines to
pass on now:

- A rank's uncaught exception arrives as one write per line, and when several
  ranks fail together their lines interleave.  From a line
  ``Traceback (most recent call last):`` on, a rank's lines are held until the
  line that names the exception (the first that does not start with white
  space), then passed on together, so each traceback reads as one block.  A
  block is let go early, as it is, after ``HOLD_SECONDS`` or ``HOLD_LINES``
  lines (a rank that stopped halfway, or something that only looks like one).
- MPICH's mpiexec prints a banner when a rank ends badly ("BAD TERMINATION OF
  ONE OF YOUR APPLICATION PROCESSES ... YOU CAN IGNORE THE BELOW CLEANUP
  MESSAGES") and three lines after it ("YOUR APPLICATION TERMINATED WITH THE
  EXIT STRING ...").  hvdrun's own report names the failed rank, its exit and
  its last lines, so those lines are left out and counted
  (:attr:`OutputOrder.notices_left_out`); the report says so.

Everything else passes at once and unchanged.  Pure logic with an injectable
clock: the caller asks for :meth:`OutputOrder.due` lines now and then, and for
:meth:`OutputOrder.flush` at the end.  Standard library only.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from .report import split_rank

__all__ = ["OutputOrder", "HOLD_SECONDS", "HOLD_LINES"]

HOLD_SECONDS = 1.0
HOLD_LINES = 500
_TRACEBACK = "Traceback (most recent call last):"
_RULE = re.compile(r"^=+$")
_BANNER_START = "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES"
_AFTER_BANNER = (
    "YOUR APPLICATION TERMINATED WITH THE EXIT STRING:",
    "This typically refers to a problem with your application.",
    "Please see the FAQ page for debugging suggestions",
)


class _Block:
    __slots__ = ("lines", "since")

    def __init__(self, first: bytes, since: float) -> None:
        self.lines = [first]
        self.since = since


class OutputOrder:
    """Decides, line by line, what hvdrun passes on and when (see the module doc)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[int, _Block] = {}  # rank -> its traceback so far
        # The launcher's lines that may open its banner (a blank line, a '====' rule).
        self._opening: list[bytes] = []
        self._opening_since = 0.0
        self._in_banner = False
        self.notices_left_out = 0  # MPICH failure banners dropped
        self.lines_left_out = 0  # their lines

    def line(self, raw: bytes, text: str) -> list[bytes]:
        """*raw*: one whole line as read (with its newline); *text*: it decoded."""
        rank, body = split_rank(text.rstrip("\r\n"))
        if rank is None:
            return self._launcher_line(raw, body)
        out = self._release_opening()
        block = self._held.get(rank)
        if block is None:
            if body.startswith(_TRACEBACK):
                self._held[rank] = _Block(raw, self._clock())
                return out
            return out + [raw]
        block.lines.append(raw)
        ends = bool(body) and not body[0].isspace() and not body.startswith(_TRACEBACK)
        if ends or len(block.lines) >= HOLD_LINES:
            del self._held[rank]
            out += block.lines
        return out

    def due(self) -> list[bytes]:
        """Lines held for longer than ``HOLD_SECONDS``, to pass on now."""
        now = self._clock()
        out = []
        if self._opening and now - self._opening_since >= HOLD_SECONDS:
            out += self._release_opening()
        for rank, block in list(self._held.items()):
            if now - block.since >= HOLD_SECONDS:
                del self._held[rank]
                out += block.lines
        return out

    def flush(self) -> list[bytes]:
        """Everything still held (the output has ended)."""
        out = self._release_opening()
        for block in self._held.values():
            out += block.lines
        self._held.clear()
        return out

    def _launcher_line(self, raw: bytes, text: str) -> list[bytes]:
        if text.startswith(_AFTER_BANNER):
            self.lines_left_out += 1
            return []
        if self._in_banner:
            if text.startswith("="):  # its lines, up to its closing rule
                self._in_banner = not _RULE.match(text)
                self.lines_left_out += 1
                return []
            self._in_banner = False
        if (
            text.startswith(_BANNER_START)
            and self._opening
            and _RULE.match(self._opening[-1].decode("utf-8", "replace").strip())
        ):
            self.lines_left_out += len(self._opening) + 1
            self._opening.clear()
            self._in_banner = True
            self.notices_left_out += 1
            return []
        opens = not text.strip() or (_RULE.match(text) and len(text) >= 20)
        if opens and len(self._opening) < 2 and not (self._opening and not text.strip()):
            if not self._opening:
                self._opening_since = self._clock()
            self._opening.append(raw)
            return []
        out = self._release_opening()
        if opens:
            self._opening_since = self._clock()
            self._opening.append(raw)
            return out
        return out + [raw]

    def _release_opening(self) -> list[bytes]:
        out, self._opening = self._opening, []
        return out
