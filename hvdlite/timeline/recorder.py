"""What the engine calls: :class:`Timeline`, which records and never formats.

Every method here runs on the thread that takes the engine's step (the engine
thread, or a caller that drives it) and does no more than read the clock and
append a tuple to a bounded queue; a :class:`~hvdlite.timeline.writer.Writer`
thread turns the tuples into trace lines.  The engine holds ``None`` while the
timeline is off, so off costs one ``is None`` check per instrumentation point.

The training thread records too: :meth:`Timeline.span` (a step's backward pass
and its ``synchronize()``, from :class:`~hvdlite.timeline.steps.StepSpans`) is
one more append to the same queue, which is safe from any thread.

Cross-rank contract: none.  Only rank 0 records (its coordinator sees every
rank's reports); a timeline never sends or waits on anything, and one that
cannot be written turns itself off without failing the job.
"""

from __future__ import annotations

import collections
import threading
import time

from ..util.safe_files import open_for_writing
from . import schema
from .events import MAX_ROWS, TraceBuilder
from .writer import Writer

__all__ = ["Timeline", "MAX_ROWS", "BACKLOG", "clock"]

#: Records that may wait for the writer; past this the oldest are dropped (with
#: one warning), so a stalled disk cannot grow the process.
BACKLOG = 1 << 16

_clock = time.monotonic  # the clock of Entry.submitted
#: The clock of every time a record carries (seconds); the training thread's spans too.
clock = _clock


class Timeline:
    """Rank 0's timeline file: opened here (``OSError`` if it cannot be), written
    by its own thread, ended by :meth:`close`."""

    def __init__(self, path: str, mark_cycles: bool = False):
        file = open_for_writing(path, encoding="utf-8")  # the writer closes it
        self.path = path
        self.mark_cycles = bool(mark_cycles)
        self._records: collections.deque = collections.deque(maxlen=BACKLOG)
        self._builder = TraceBuilder(_clock(), self.mark_cycles)
        self._writer = Writer(file, self._records, self._builder)
        self._close_lock = threading.Lock()
        # The batch being executed (engine thread): [start, (phase, time), ...].
        self._marks: list | None = None
        self._path = None
        self._finish: float | None = None

    @property
    def rows(self) -> int:
        """Tracks drawn so far (bounded by :data:`MAX_ROWS`)."""
        return self._builder.rows

    # -------------------------------------------------------- engine thread
    def cycle_began(self, number: int, new_entries) -> None:
        """A cycle started and took *new_entries* (this rank's submissions)."""
        append = self._records.append
        if self.mark_cycles:
            append((schema.R_CYCLE, _clock(), number))
        if new_entries:
            append((schema.R_SUBMIT, [(e.key, e.submitted, e.params.kind) for e in new_entries]))

    def reports(self, gathered) -> None:
        """The coordinator received every rank's requests (``gathered[rank][0]``)."""
        self._records.append((schema.R_REPORTS, _clock(), gathered))

    def decided(self) -> None:
        """This cycle's responses are known on this rank; execution follows."""
        self._records.append((schema.R_DECIDED, _clock()))

    def batch_began(self) -> None:
        self._marks = [_clock()]
        self._path = None
        self._finish = None

    def via(self, path) -> None:
        """The batch moves its data on *path* (a Transport, or its name)."""
        self._path = path

    def phase(self, phase: str) -> None:
        """*phase* (a :mod:`~hvdlite.timeline.schema` phase) of the batch starts now.
        The batch's first phase is taken to start with the batch."""
        marks = self._marks
        if marks is not None and (len(marks) == 1 or marks[-1][0] != phase):
            marks.append((phase, _clock()))

    def finishing(self) -> None:
        """The batch's handles are being completed (its callbacks run from here)."""
        if self._marks is not None and self._finish is None:
            self._finish = _clock()

    def batch_ended(self, batch) -> None:
        marks = self._marks
        if marks is not None:
            self._records.append((schema.R_BATCH, batch, self._path, marks, self._finish, _clock()))
            self._marks = None
            self._writer.wake()

    # --------------------------------------------------------- any thread
    def span(self, phase: str, start: float, end: float, step: int) -> None:
        """A training step's *phase* (:data:`~hvdlite.timeline.schema.STEP_PHASES`)
        ran from *start* to *end* (:data:`clock` times); *step* counts from 1."""
        self._records.append((schema.R_SPAN, phase, start, end, step))

    def close(self) -> None:
        """Write what is queued and end the JSON; later records are dropped."""
        with self._close_lock:
            self._writer.close(_clock())
