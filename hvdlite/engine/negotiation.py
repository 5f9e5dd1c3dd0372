"""A cycle's negotiation of new names: gather the requests at rank 0, broadcast its answer.

Runs when some rank has requests the response cache cannot answer (new names,
changed parameters, a joined rank) or wants a stall check.  Collective over the
engine's control communicator: every rank sends its requests (and, for a stall
check, how long each of its pending names has waited); rank 0's
:class:`~hvdlite.engine.coordinator.Coordinator` decides, and every rank gets
the same ordered list of responses.
"""

from __future__ import annotations

import logging
import time

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
