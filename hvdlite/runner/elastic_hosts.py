"""The hosts an elastic job may use now, in a stable order, and the ones it lost.

:class:`HostPool` asks its source (:mod:`.discovery`) and leaves out what the
:class:`~.blacklist.Blacklist` holds.  Hosts keep the order in which they
first appeared, so hosts that were there before keep the low ranks (rank 0
stays where it was while its host lasts).  A placement fills the hosts in that
order up to ``max_np`` ranks, as the MPI launchers place ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from .blacklist import Blacklist
from .hosts import Host, format_hosts, total_slots, used_hosts

__all__ = ["HostPool", "describe_change", "rank_host"]


class HostPool:
    """See the module doc.  *source* has ``discover()``, ``dynamic`` and ``label``."""

    def __init__(self, source, blacklist: Blacklist, max_np: int | None) -> None:
        self.source, self.blacklist, self.max_np = source, blacklist, max_np
        self._order: list[str] = []
        self.used: dict[str, int] = {}  # every host a launch used -> its slots then

    def available(self) -> list[Host]:
        """The usable hosts now (DiscoveryError when the source fails)."""
        found = [host for host in self.source.discover()
                 if not self.blacklist.blocked(host.name)]
        for host in found:
            if host.name not in self._order:
                self._order.append(host.name)
        by_name = {host.name: host for host in found}
        return [by_name[name] for name in self._order if name in by_name]

    def placement(self, hosts: Sequence[Host]) -> list[Host]:
        """The hosts (and slots on each) a launch on *hosts* uses."""
        total = total_slots(hosts)
        return used_hosts(hosts, total if self.max_np is None else min(total, self.max_np))

    def record(self, placement: Sequence[Host]) -> None:
        for host in placement:
            self.used[host.name] = host.slots

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
