"""The timeline's own thread: drains the engine's records into the file.

It wakes when the engine finished a batch (:meth:`Writer.wake`, at most once
per :data:`MIN_GAP` seconds, so a busy engine's records are written in
chunks) and otherwise every :data:`INTERVAL` seconds, turns what the engine
queued into lines (:class:`~hvdlite.timeline.events.TraceBuilder`) and writes
them with a ``flush``: a collective's events are on disk a few milliseconds
after it completed.  The engine never waits for it: the queue is a bounded
deque the engine only appends to.

The file is a complete JSON array after every write, as Horovod's is: each
write ends with the closing ``]``, which the next write overwrites (a file
that cannot seek, a pipe, ends in ``,`` until it is closed).  A job killed in
the middle of a write leaves a cut array, which the reader (and Perfetto) load.

A write that fails (a full disk) turns the timeline off with one warning and
the job goes on; records arriving later are dropped.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["Writer", "INTERVAL", "MIN_GAP"]

log = logging.getLogger("hvdlite")

#: Seconds between two drains of the queue when nothing wakes the writer.
INTERVAL = 0.1
#: Seconds at least between two drains (records that arrive meanwhile wait for the next).
MIN_GAP = 0.01
_CLOSING = "\n]\n"  # what ends the array after each write
#: Records turned into lines per write (the thread gives up the GIL at each write).
_CHUNK = 512


class Writer:
    def __init__(self, file, records, builder):
        self._file = file
        self._records = records  # collections.deque with a maxlen: the engine appends
        self._builder = builder
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # one drain at a time (the thread, or close)
        self._warned_backlog = False
        try:
            seekable = file.seekable()
        except (OSError, ValueError):
            seekable = False
        # Where the closing "]" of the last write starts (None: nothing written yet, or a
        # file that cannot seek, which gets its "]" only when it is closed).
        self._closing_at: int | None = None
        self._seekable = seekable
        self._write(builder.header())
        self._thread = threading.Thread(target=self._run, name="hvdlite-timeline", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Write what is queued soon (the engine finished a batch); costs a flag check
        while the writer is already due."""
        if not self._wake.is_set():
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(INTERVAL)
            if self._stop.is_set():
                return
            self._wake.clear()
            self._drain()
            if self._stop.wait(MIN_GAP):
                return

    def _drain(self) -> None:
        with self._lock:
            records = self._records
            if not self._warned_backlog and records.maxlen and len(records) >= records.maxlen:
                self._warned_backlog = True
                log.warning(
                    "hvdlite: the timeline writer fell behind the engine; some of "
                    "its events were dropped."
                )
            add = self._builder.add
            while records:
                lines: list[str] = []
                for _ in range(_CHUNK):
                    try:
                        record = records.popleft()
                    except IndexError:
                        break
                    if self._file is None:
                        continue
                    try:
                        add(record, lines)
                    except Exception as exc:  # noqa: BLE001 - a bug here must not end the job
                        self._give_up(f"{type(exc).__name__}: {exc}")
                if lines:
                    self._write("".join(lines))

    def _write(self, text: str, last: bool = False) -> None:
        """Append *text* (whole lines, each event ending in ``,``; the footer when
        *last*) and leave the file a complete JSON array."""
        file = self._file
        if file is None:
            return
        try:
            if self._closing_at is not None:  # over the "]" the last write ended with
                file.seek(self._closing_at)
                text = ",\n" + text
            closing = self._seekable and not last
            if closing:  # one write, so that a reader rarely sees the file half-written
                text = text.removesuffix(",\n") + _CLOSING
            file.write(text)
            file.flush()
            if closing:  # a write-only text file's tell() is its byte offset
                self._closing_at = file.tell() - len(_CLOSING)
        except (OSError, ValueError) as exc:
            self._give_up(str(exc))

    def _give_up(self, why: str) -> None:
        """Stop writing (one warning); never fail the engine."""
        if self._file is None:
            return
        log.warning(
            "hvdlite: the timeline could not be written (%s); it is off from now on, "
            "and the file ends where the failed write began.",
            why,
        )
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None

    def close(self, t: float) -> None:
        """Drain, write the closing lines and close the file (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30.0)
        self._drain()
        with self._lock:
            self._write(self._builder.footer(t), last=True)
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._give_up(str(exc))
                self._file = None
