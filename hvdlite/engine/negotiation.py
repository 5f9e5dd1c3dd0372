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
import time

import numpy as np
from mpi4py import MPI

from .messages import Response

__all__ = ["negotiate"]

log = logging.getLogger("hvdlite")


def negotiate(comm, uncached: list, pending: dict, coordinator, stall, stall_clock,
              timeline) -> list[Response]:
    """Collective: this rank's *uncached* entries (marked sent) against every rank's.

    *pending*: this rank's in-flight entries by key (reported when *stall*);
    *coordinator*: rank 0's Coordinator (None elsewhere); *stall_clock*: the
    engine's StallClock; *timeline*: the timeline or None."""
    requests = [e.params for e in uncached]
    for e in uncached:
        e.sent = True
    if not stall and comm.Get_size() > 1:
        alone = coordinator is None or (timeline is None and coordinator.decides_alone(requests))
        if _everyone_sent(comm, requests, spoil=not alone):
            return comm.bcast(coordinator.process_unanimous(requests)
                              if coordinator is not None else None, root=0)
    now = time.monotonic()
    waiting = [(key, now - e.submitted) for key, e in pending.items()] if stall else None
    gathered = comm.gather((requests, waiting), root=0)
    responses = None
    if coordinator is not None:
        if timeline is not None:
            timeline.reports(gathered)  # the instant each rank's requests reached rank 0
        responses = coordinator.process((rank, item[0]) for rank, item in enumerate(gathered))
        if stall:
            report, errors = coordinator.stall_report(
                {r: item[1] or [] for r, item in enumerate(gathered)},
                stall_clock.warn_seconds, stall_clock.fail_seconds)
            if report:
                log.warning(report)
            responses += errors
    return comm.bcast(responses, root=0)


_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


def _everyone_sent(comm, requests: list, spoil: bool) -> bool:
    """Collective: True when every rank passed equal *requests* and none *spoil*-ed."""
    # repr, not pickle: a pickle's bytes depend on which equal strings are one object.
    digest = int.from_bytes(hashlib.blake2b(repr(requests).encode(), digest_size=8).digest(),
                            "little")
    if spoil:
        digest ^= 1  # differs from the digest of the same list on every other rank
    vector = np.array([digest, digest ^ 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    comm.Allreduce(MPI.IN_PLACE, vector, MPI.BAND)
    return (vector[0] | vector[1]) == _ALL_ONES
