"""The hosts an elastic job may use now, in a stable order, and the ones it lost.

:class:`HostPool` asks its source (:mod:`.discovery`) and leaves out what the
:class:`~.blacklist.Blacklist` holds.  Hosts keep the order in which they
first appeared, so hosts that were there before keep the low ranks (rank 0
stays where it was while its host lasts).  A placement fills the hosts in that
order up to ``max_np`` ranks, as the MPI launchers place ranks.

:class:`FailureHistory` tells a rank's failure (relaunch on the same hosts)
from a host's (leave the host out): see :meth:`FailureHistory.judge`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence

from .blacklist import Blacklist
from .hosts import Host, format_hosts, total_slots, used_hosts

__all__ = [
    "HostPool",
    "FailureHistory",
    "describe_change",
    "rank_host",
    "ranks_on",
    "REPEAT_WINDOW_SECONDS",
]

# A host whose ranks fail twice within this many seconds (or within the cooldown
# range's MAX, when larger) is left out, though each failure alone was a rank's.
REPEAT_WINDOW_SECONDS = 300.0
# Host names remembered (order, hosts used): a source whose names churn (cloud
# instances) must not grow hvdrun's memory for the length of the job.
MAX_REMEMBERED_HOSTS = 4096


class HostPool:
    """See the module doc.  *source* has ``discover()``, ``dynamic`` and ``label``."""

    def __init__(
        self, source, blacklist: Blacklist, max_np: int | None, limit: int = MAX_REMEMBERED_HOSTS
    ) -> None:
        self.source, self.blacklist, self.max_np = source, blacklist, max_np
        self.limit = limit
        self._order: dict[str, None] = {}  # host names in the order they first came
        self.used: dict[str, int] = {}  # hosts launches used -> their slots then (latest last)

    def available(self) -> list[Host]:
        """The usable hosts now (DiscoveryError when the source fails)."""
        found = [host for host in self.source.discover() if not self.blacklist.blocked(host.name)]
        for host in found:
            self._order.setdefault(host.name)
        by_name = {host.name: host for host in found}
        if len(self._order) > self.limit:  # forget the oldest names not offered now
            for name in [name for name in self._order if name not in by_name]:
                if len(self._order) <= self.limit:
                    break
                del self._order[name]
        return [by_name[name] for name in self._order if name in by_name]

    def placement(self, hosts: Sequence[Host]) -> list[Host]:
        """The hosts (and slots on each) a launch on *hosts* uses."""
        total = total_slots(hosts)
        return used_hosts(hosts, total if self.max_np is None else min(total, self.max_np))

    def record(self, placement: Sequence[Host]) -> None:
        for host in placement:
            self.used.pop(host.name, None)
            self.used[host.name] = host.slots
        while len(self.used) > self.limit:
            del self.used[next(iter(self.used))]

    def lost(self, hosts_now: Sequence[Host]) -> list[str]:
        """``host (why)`` for each host an earlier launch used that is not usable now."""
        present = {host.name for host in hosts_now}
        lines = []
        for name in self.used:
            if name in present:
                continue
            why = self.blacklist.reason(name) or f"no longer offered by {self.source.label}"
            lines.append(f"{name} ({why})")
        return lines


def describe_change(before: Sequence[Host], after: Sequence[Host]) -> str:
    """``h1:2,h2:1 -> h1:2,h3:2`` with what came and went."""
    gone = sorted({h.name for h in before} - {h.name for h in after})
    came = sorted({h.name for h in after} - {h.name for h in before})
    parts = []
    if came:
        parts.append("new " + ", ".join(came))
    if gone:
        parts.append("gone " + ", ".join(gone))
    detail = f" ({'; '.join(parts)})" if parts else ""
    return f"{format_hosts(before) or 'none'} -> {format_hosts(after) or 'none'}{detail}"


def rank_host(placement: Sequence[Host], rank: int) -> str | None:
    """The host of *rank* in *placement* (ranks fill the hosts in order)."""
    first = 0
    for host in placement:
        if first <= rank < first + host.slots:
            return host.name
        first += host.slots
    return None


def ranks_on(placement: Sequence[Host], host: str) -> list[int]:
    """The ranks a launch on *placement* puts on *host*."""
    first, ranks = 0, []
    for entry in placement:
        if entry.name == host:
            ranks += range(first, first + entry.slots)
        first += entry.slots
    return ranks


class FailureHistory:
    """Recent rank failures per host, to leave a host out only on evidence about the host.

    A rank that ended with a non-zero status on a host whose other ranks were
    healthy and which can still be reached failed as a *process* (a crash, an
    out-of-memory kill): the job is relaunched on the same hosts.  The host is
    left out only when (:meth:`judge`) every rank on it (two or more) failed
    together (each reported a non-zero status before hvdrun stopped it), when it
    cannot be reached, or when its ranks fail again within *window* seconds.  A
    rank that reported no exit at all is no evidence either way: the launcher
    may have killed it while cleaning up.  At most *limit* hosts are
    remembered (the oldest failures are forgotten first).
    """

    def __init__(
        self,
        window: float = REPEAT_WINDOW_SECONDS,
        limit: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window, self.limit, self._clock = window, limit, clock
        self._last: dict[str, float] = {}  # host -> time of its last process failure

    def judge(
        self,
        host: str,
        placed: Collection[int],
        failed: Collection[int],
        unreachable: Callable[[str], str | None],
    ) -> str | None:
        """Why the failure of the ranks *failed* (unprompted) is *host*'s, or None when it
        is a process failure.  *placed*: the ranks on *host*; *unreachable(host)*: why
        the host cannot be reached, None when it can."""
        now = self._clock()
        for name, when in list(self._last.items()):
            if now - when > self.window:
                del self._last[name]
        placed = set(placed)
        if len(placed) > 1 and placed <= set(failed):
            return f"all {len(placed)} ranks on it failed at once"
        why = unreachable(host)
        if why is not None:
            return f"it cannot be reached ({why})"
        if host in self._last:
            since = now - self._last.pop(host)
            return f"its ranks failed again {since:.0f} s after the previous failure there"
        self._last[host] = now
        while len(self._last) > self.limit:
            del self._last[next(iter(self._last))]
        return None
