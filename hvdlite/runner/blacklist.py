"""Hosts left out of an elastic job after a rank failed on them, for a cooldown or for good.

Horovod's ``--blacklist-cooldown-range MIN MAX``: the first failure on a host
leaves it out for MIN seconds, each further failure doubles that, up to MAX.
Without a range a host that failed stays out for the rest of the job.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

__all__ = ["Blacklist"]


@dataclasses.dataclass
class _Entry:
    failures: int
    until: float | None  # None: for the rest of the job
    reason: str


class Blacklist:
    """Which hosts to leave out now, and why (see the module doc)."""

    def __init__(
        self,
        cooldown_range: tuple[float, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        limit: int = 4096,
    ) -> None:
        if cooldown_range is not None:
            low, high = (float(v) for v in cooldown_range)
            if not 0 <= low <= high:
                raise ValueError(f"cooldown range ({low:g}, {high:g}): need 0 <= MIN <= MAX")
            cooldown_range = (low, high)
        self.cooldown_range = cooldown_range
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self.limit = limit  # hosts remembered; past it, those whose cooldown ended go first

    def add(self, host: str, reason: str) -> float | None:
        """Leave *host* out because of *reason*; returns the seconds it stays out (None: for
        good)."""
        entry = self._entries.get(host)
        failures = (entry.failures if entry else 0) + 1
        seconds = None
        if self.cooldown_range is not None:
            low, high = self.cooldown_range
            seconds = min(low * 2 ** (failures - 1), high)
        until = None if seconds is None else self._clock() + seconds
        self._entries.pop(host, None)
        self._entries[host] = _Entry(failures, until, reason)
        if len(self._entries) > self.limit:
            for name in [name for name in self._entries if not self.blocked(name)]:
                del self._entries[name]
                if len(self._entries) <= self.limit:
                    break
        return seconds

    def blocked(self, host: str) -> bool:
        entry = self._entries.get(host)
        return entry is not None and (entry.until is None or self._clock() < entry.until)

    def reason(self, host: str) -> str | None:
        """Why *host* is left out now, with how long; None when it is not."""
        if not self.blocked(host):
            return None
        entry = self._entries[host]
        if entry.until is None:
            return f"{entry.reason}; left out for the rest of the job"
        return f"{entry.reason}; left out for {max(entry.until - self._clock(), 0):.0f} s more"
