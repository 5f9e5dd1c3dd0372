"""A Chrome-trace (chrome://tracing, Perfetto) timeline of the collectives rank 0 runs.

Each batch appears as one slice per tensor name, on a row per name, from the
start to the end of its execution; with ``mark_cycles`` every batch also gets an
instant event.  Written by the engine thread only; ``close()`` ends the JSON.

Bounded over long runs: automatic names (``allreduce.noname.17``) share one row
per operation, and past :data:`MAX_ROWS` rows further names share one last
row.  A write that fails (a full disk) turns the timeline off with one
warning; the job goes on.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from .messages import Kind

__all__ = ["Timeline", "MAX_ROWS"]

log = logging.getLogger("hvdlite")

#: Rows (one per tensor name) a timeline draws at most.
MAX_ROWS = 4096
_OVERFLOW_ROW = "(more names)"


class Timeline:
    def __init__(self, path: str, mark_cycles: bool = False):
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._file.write("[\n")
        self._mark = mark_cycles
        self._t0 = time.perf_counter()
        self._tids: dict[str, int] = {}
        self._lock = threading.Lock()
        self._started: float = 0.0

    def _us(self) -> float:
        return (time.perf_counter() - self._t0) * 1e6

    def _tid(self, name: str) -> int:
        auto = name.find(".noname.")
        row = name if auto < 0 else name[:auto + len(".noname")]
        tid = self._tids.get(row)
        if tid is None:
            if len(self._tids) >= MAX_ROWS - 1:
                row = _OVERFLOW_ROW
                tid = self._tids.get(row)
        if tid is None:
            tid = self._tids[row] = len(self._tids) + 1
            self._emit({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                        "args": {"name": row}})
        return tid

    @property
    def rows(self) -> int:
        return len(self._tids)

    def _emit(self, event: dict) -> None:
        if self._file is not None:
            try:
                self._file.write(json.dumps(event) + ",\n")
            except OSError as exc:
                self._give_up(exc)

    def _give_up(self, exc: OSError) -> None:
        """A write failed: stop writing (one warning), never fail the engine."""
        log.warning("hvdlite: the timeline could not be written (%s); it is off from now on, "
                    "and the file ends where the failed write began.", exc)
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None

    def start_batch(self, batch) -> None:
        with self._lock:
            self._started = self._us()
            if self._mark:
                self._emit({"name": "CYCLE", "ph": "i", "s": "g", "pid": 0, "tid": 0,
                            "ts": self._started})

    def end_batch(self, batch) -> None:
        with self._lock:
            end = self._us()
            fused = len(batch)
            for response in batch:
                p = response.params
                self._emit({"name": Kind(p.kind).name, "ph": "X", "pid": 0,
                            "tid": self._tid(p.name), "ts": self._started,
                            "dur": end - self._started,
                            "args": {"fused": fused, "shapes": [list(s) for s in p.shapes],
                                     "dtypes": list(p.dtypes)}})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.write(json.dumps({"name": "end", "ph": "i", "s": "g", "pid": 0,
                                                 "tid": 0, "ts": self._us()}) + "\n]\n")
                    self._file.close()
                except OSError as exc:
                    self._give_up(exc)
                self._file = None
