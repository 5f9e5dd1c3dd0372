"""The timeline's own thread: drains the engine's records into the file.

It wakes every :data:`INTERVAL` seconds, turns what the engine queued into
lines (:class:`~hvdlite.timeline.events.TraceBuilder`) and writes them with
one ``write`` and a ``flush``, so the file on disk always ends at a line
boundary (a job killed between two flushes leaves a loadable file).  The
engine never waits for it: the queue is a bounded deque the engine only
appends to.

A write that fails (a full disk) turns the timeline off with one warning and
the job goes on; records arriving later are dropped.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["Writer", "INTERVAL"]

log = logging.getLogger("hvdlite")

#: Seconds between two drains of the queue.
INTERVAL = 0.1
#: Records turned into lines per write (the thread gives up the GIL at each write).
_CHUNK = 512


class Writer:
    def __init__(self, file, records, builder):
        self._file = file
        self._records = records  # collections.deque with a maxlen: the engine appends
        self._builder = builder
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one drain at a time (the thread, or close)
        self._warned_backlog = False
        self._write(builder.header())
        self._thread = threading.Thread(target=self._run, name="hvdlite-timeline", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._drain()

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

    def _write(self, text: str) -> None:
        if self._file is None:
            return
        try:
            self._file.write(text)
            self._file.flush()
        except OSError as exc:
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
        self._thread.join(timeout=30.0)
        self._drain()
        with self._lock:
            self._write(self._builder.footer(t))
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._give_up(str(exc))
                self._file = None
