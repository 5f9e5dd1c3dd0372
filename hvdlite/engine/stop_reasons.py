"""Why the engine stops, in words for the user, and when it reports a stall.

The messages a rank's handles fail with when the engine stops (shut down here,
shut down by a peer, interrupted in a cycle), and the stall inspector's clock
from the knobs.  The same words on every rank for the same cause.
"""

from __future__ import annotations

from ..exceptions import CollectiveTimeoutError
from .coordinator import StallClock
from .wait_limit import WaitLimit

__all__ = [
    "SHUTDOWN_MESSAGE",
    "PEER_SHUTDOWN_MESSAGE",
    "StopReason",
    "interrupted_message",
    "stall_clock",
]

SHUTDOWN_MESSAGE = (
    "hvdlite has been shut down on this rank (hvd.shutdown()) before this collective "
    "completed; call hvd.init() again to run collectives."
)
PEER_SHUTDOWN_MESSAGE = (
    "hvdlite was shut down by another rank: its program ended (or called hvd.shutdown()) "
    "while this rank still had collectives to run, and they cannot complete without it. "
    "Every rank must run the same collectives before it exits; if that rank failed, its "
    "error is in the job's output."
)


def interrupted_message(exc: BaseException, rank: int, size: int) -> str:
    """Why the engine stopped when a Ctrl-C or exit broke a cycle on this rank."""
    return (
        f"hvdlite engine stopped on rank {rank}: {type(exc).__name__} arrived in the "
        "middle of an engine cycle, which cannot be finished. "
        + (
            "The other ranks wait inside it, so the job ends when this process exits or "
            "calls hvd.shutdown()."
            if size > 1
            else "Call hvd.shutdown() and hvd.init() to start again."
        )
    )


def stall_clock(config, limit: WaitLimit, size: int) -> StallClock:
    """The stall inspector's clock from the knobs: it warns before the wait limit ends
    the job, and never alone (one rank cannot stall)."""
    warn = config.stall_check_time_seconds
    if limit.seconds:  # warn (naming the missing ranks) before the limit ends the job
        warn = min(warn, limit.seconds / 2)
    return StallClock(
        warn,
        config.stall_shutdown_time_seconds,
        enabled=not config.stall_check_disable and size > 1,
    )


class StopReason:
    """Why this rank's engine stopped, in the words its handles fail with (empty
    while it runs, or after an orderly shutdown asked for here)."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.text = ""

    def message(self) -> str:
        return self.text or SHUTDOWN_MESSAGE

    def failed(self, exc: BaseException) -> str:
        # A wait that ran out is an answer about the job: its message says it all.
        self.text = (
            str(exc)
            if isinstance(exc, CollectiveTimeoutError)
            else f"hvdlite engine failed on rank {self.rank}: {exc!r}"
        )
        return self.text

    def interrupted(self, exc: BaseException) -> str:
        self.text = interrupted_message(exc, self.rank, self.size)
        return self.text

    def peer_shut_down(self) -> None:
        """Every rank agreed to stop, and not at this rank's asking."""
        if not self.text:
            self.text = PEER_SHUTDOWN_MESSAGE
