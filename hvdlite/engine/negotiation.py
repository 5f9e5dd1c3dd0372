"""A cycle's negotiation of new names: gather the requests at rank 0, broadcast its answer.

Runs when some rank has requests the response cache cannot answer (new names,
changed parameters, a joined rank) or wants a stall check.  Collective over the
engine's control communicator: every rank sends its requests (and, for a stall
check, how long each of its pending names has waited); rank 0's
:class:`~hvdlite.engine.coordinator.Coordinator` decides, and every rank gets
the same ordered list of responses.

The gather brings rank 0 N x T requests, and rank 0 spends about 1.7 us on each
(docs/SCALING.md): past a few hundred ranks a cold cycle costs more than a
step.  Most cold cycles (a training loop's first step, a job without the
response cache) see every rank send the same list, so first one small
AND-allreduce of a digest of each rank's list (and its complement: all equal
exactly when the two ANDs together cover every bit) says whether they did.
If so, and rank 0 can decide them alone
(:meth:`~hvdlite.engine.coordinator.Coordinator.decides_alone`; otherwise it
spoils its digest), rank 0 answers its own list and the gather is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

from .coordinator import Coordinator
from .messages import Response

__all__ = ["negotiate", "Negotiator", "WaitingStacks"]

log = logging.getLogger("hvdlite")


#: Frames from files under this directory are hvdlite's own: a stack shows the
#: user's frames, then where hvdlite was entered.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WaitingStacks:
    """On a stall check, where this rank's waiting code is: for each thread that
    submitted a collective still pending after the warning time, its Python stack
    now, logged once per collective (a later check names only new ones)."""

    def __init__(self, rank: int):
        self._rank = rank
        self._told: set[tuple] = set()  # (key, submitted) of entries already shown

    def log(self, pending: dict, older_than: float) -> None:
        now = time.monotonic()
        waiting = {
            (key, e.submitted): e for key, e in pending.items() if now - e.submitted >= older_than
        }
        self._told &= waiting.keys()  # forget what finished
        new = [e for mark, e in waiting.items() if mark not in self._told]
        if not new:
            return
        self._told |= waiting.keys()
        by_thread: dict[int, list] = {}
        for entry in new:
            by_thread.setdefault(entry.thread, []).append(entry)
        frames = sys._current_frames()
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, entries in by_thread.items():
            waited = ", ".join(
                f"{e.params.name!r} ({now - e.submitted:.1f} s)" for e in entries[:5]
            )
            more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
            frame = frames.get(ident)
            where = "has ended" if frame is None else "is now at:\n" + _user_stack(frame)
            log.warning(
                "hvdlite stall: rank %d waits on %s%s; thread %r, which submitted them, %s",
                self._rank,
                waited,
                more,
                names.get(ident, ident),
                where,
            )


def _user_stack(frame) -> str:
    """The stack of *frame*, outermost first, cut after the first hvdlite frame."""
    summary = traceback.extract_stack(frame)
    for i, item in enumerate(summary):
        if item.filename.startswith(_PACKAGE_DIR + os.sep):
            summary = summary[: i + 1]
            break
    return "".join(traceback.format_list(summary)).rstrip()


def negotiate(
    comm,
    uncached: list,
    pending: dict,
    coordinator,
    stall,
    stall_clock,
    timeline,
    stacks: WaitingStacks | None = None,
) -> list[Response]:
    """Collective: this rank's *uncached* entries (marked sent) against every rank's.

    *pending*: this rank's in-flight entries by key (reported when *stall*, and
    where *stacks* is given, the stacks of the threads waiting on them logged);
    *coordinator*: rank 0's Coordinator (None elsewhere); *stall_clock*: the
    engine's StallClock; *timeline*: the timeline or None."""
    requests = [e.params for e in uncached]
    for e in uncached:
        e.sent = True
    if not stall and comm.Get_size() > 1:
        alone = coordinator is None or (timeline is None and coordinator.decides_alone(requests))
        if _everyone_sent(comm, requests, spoil=not alone):
            return comm.bcast(
                coordinator.process_unanimous(requests) if coordinator is not None else None, root=0
            )
    now = time.monotonic()
    waiting = [(key, now - e.submitted) for key, e in pending.items()] if stall else None
    if stall and stacks is not None:
        stacks.log(pending, stall_clock.warn_seconds)
    gathered = comm.gather((requests, waiting), root=0)
    responses = None
    if coordinator is not None:
        if timeline is not None:
            timeline.reports(gathered)  # the instant each rank's requests reached rank 0
        responses = coordinator.process((rank, item[0]) for rank, item in enumerate(gathered))
        if stall:
            report, errors = coordinator.stall_report(
                {r: item[1] or [] for r, item in enumerate(gathered)},
                stall_clock.warn_seconds,
                stall_clock.fail_seconds,
            )
            gap = stall_clock.report_due(report, coordinator.stalled_ranks)
            if gap is not None:
                log.warning("%s\nRepeated while the stall lasts, next in %.0f s.", report, gap)
            responses += errors
    return comm.bcast(responses, root=0)


class Negotiator:
    """The engine's side of negotiation: rank 0's coordinator, the stall clock,
    and whether this rank wants a stall check in the next cycle.

    Collective at construction (each rank's host name is gathered to rank 0, which
    names hosts in its stall reports) and in :meth:`negotiate`."""

    def __init__(self, comm, members, check_order: bool, stall_clock):
        self.comm = comm
        rank = comm.Get_rank()
        hosts = comm.gather(MPI.Get_processor_name(), root=0)
        self.coordinator = (
            Coordinator(comm.Get_size(), members, check_order, hosts) if rank == 0 else None
        )
        self.stall_clock = stall_clock
        self._stacks = WaitingStacks(rank)  # where waiting threads are, at a stall
        self._wanted = False

    def want_stall_check(self, pending: dict) -> bool:
        """While waiting: note a stall check that is due (True then)."""
        if self.stall_clock.due(pending):
            self._wanted = True
        return self._wanted

    def take_stall_check(self, pending: dict) -> bool:
        """At a cycle's start: whether this rank asks for a stall check now."""
        stall = self._wanted or self.stall_clock.due(pending)
        self._wanted = False
        return stall

    def negotiate(self, uncached: list, pending: dict, stall: bool, timeline) -> list[Response]:
        """Collective: :func:`negotiate` with the engine's parts."""
        return negotiate(
            self.comm,
            uncached,
            pending,
            self.coordinator,
            stall,
            self.stall_clock,
            timeline,
            self._stacks,
        )


_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def _everyone_sent(comm, requests: list, spoil: bool) -> bool:
    """Collective: True when every rank passed equal *requests* and none *spoil*-ed."""
    # repr, not pickle: a pickle's bytes depend on which equal strings are one object.
    digest = int.from_bytes(
        hashlib.blake2b(repr(requests).encode(), digest_size=8).digest(), "little"
    )
    if spoil:
        digest ^= 1  # differs from the digest of the same list on every other rank
    vector = np.array([digest, digest ^ 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    comm.Allreduce(MPI.IN_PLACE, vector, MPI.BAND)
    return (vector[0] | vector[1]) == _ALL_ONES
