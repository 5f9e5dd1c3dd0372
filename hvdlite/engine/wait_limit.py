"""How long this rank waits for the others: ``HVDLITE_COLLECTIVE_TIMEOUT``.

A rank that is alive but not taking part (stopped, stuck in code that holds
the GIL, deadlocked in the user's program) would otherwise keep its peers
waiting forever.  With a limit set, every wait of the engine on other ranks is
bounded: the status exchange, the doorbells, the shared-memory barrier, a
collective this rank submitted that others have not, and one engine step as a
waiting caller sees it.  A wait that outlasts the limit raises
:class:`~hvdlite.exceptions.CollectiveTimeoutError`; the engine then ends the
whole job, since the ranks can no longer agree on what ran.

Cross-rank contract: none; the limit is per rank and may differ between ranks
(each rank bounds its own waits).  Pure Python, no MPI: unit-tested directly.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ..exceptions import CollectiveTimeoutError

__all__ = ["WaitLimit"]

#: How often the pending collectives are looked over (their ages change slowly).
_PENDING_LOOK = 0.5


class WaitLimit:
    """The limit of one rank's waits on the others (``seconds`` 0 or None: no limit)."""

    def __init__(
        self, seconds: float | None, rank: int, clock: Callable[[], float] = time.monotonic
    ):
        self.seconds = seconds or None
        self.rank = rank
        self._clock = clock
        self._next_look = 0.0

    def error(self, what: str) -> CollectiveTimeoutError:
        """The error for a wait on *what* that outlasted the limit."""
        return CollectiveTimeoutError(
            f"hvdlite: rank {self.rank} waited more than {self.seconds:g} s for the other "
            f"ranks {what} (HVDLITE_COLLECTIVE_TIMEOUT={self.seconds:g}). A peer is alive "
            "but not taking part: stopped, stuck in code that holds the GIL, deadlocked, or "
            "calling different collectives. The job ends now; raise the limit if a rank "
            "legitimately works alone for that long."
        )

    def check_pending(self, pending: Mapping) -> None:
        """Raise if an entry of *pending* (by key, each with a ``submitted`` monotonic
        time) has waited longer than the limit; looks at most every half second."""
        if self.seconds is None or not pending:
            return
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + _PENDING_LOOK
        key, entry = min(pending.items(), key=lambda item: item[1].submitted)
        if now - entry.submitted > self.seconds:
            raise self.error(
                f"to submit collective {key[1]!r} (process set {key[0]}); the "
                "stall warning in rank 0's log names the ranks that did not"
            )
