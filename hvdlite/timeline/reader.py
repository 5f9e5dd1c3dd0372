"""Reading a timeline back, including one cut off by a killed job.

:func:`load` accepts Chrome's JSON array format (with or without its closing
``]``, and with a partial last event, as Perfetto does) and the object format
(``{"traceEvents": [...]}``).  :class:`Trace` indexes the events the summary
and the plot need: tracks by id, slices by phase.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from . import schema as s

__all__ = ["load", "Trace"]


def load(path) -> list[dict]:
    """Every complete event of the trace at *path* (ValueError if it is no trace)."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = _events_before_the_cut(text, path)
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: not a Chrome trace (neither a JSON array nor an object with traceEvents)"
        )
    return [event for event in data if isinstance(event, dict)]


def _events_before_the_cut(text: str, path) -> list:
    """The events of an array whose tail is missing: decode one value at a time and
    stop at the first that does not parse (the cut)."""
    start = text.find("[")
    if start < 0 or text[:start].strip() not in ("", '{"traceEvents":'):
        raise ValueError(f"{path}: not a Chrome trace (no JSON array of events)")
    decoder = json.JSONDecoder()
    events = []
    i, n = start + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return events
        try:
            event, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return events
        events.append(event)


class Trace:
    """A loaded timeline: tracks, and slices grouped by phase (``cat``)."""

    def __init__(self, events: list[dict]):
        self.events = events
        self.tracks: dict[int, str] = {}
        self.slices: dict[str, list[dict]] = defaultdict(list)
        self.reports: list[dict] = []
        for event in events:
            ph = event.get("ph")
            if ph == "X":
                self.slices[event.get("cat", "")].append(event)
            elif ph == "i" and event.get("cat") == s.REPORT:
                self.reports.append(event)
            elif ph == "M" and event.get("name") == "thread_name":
                self.tracks[event.get("tid")] = event.get("args", {}).get("name", "")

    @classmethod
    def load(cls, path) -> Trace:
        return cls(load(path))

    def track(self, event: dict) -> str:
        """The tensor name (track name) of *event*."""
        tid = event.get("tid")
        return self.tracks.get(tid, f"track {tid}")

    def phase_slices(self):
        """(phase, slice) for every slice of a tensor phase, in file order."""
        for phase in s.PHASES:
            for event in self.slices.get(phase, ()):
                yield phase, event
