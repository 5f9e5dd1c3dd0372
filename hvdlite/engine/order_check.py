"""HVDLITE_CHECK_ORDER: ranks that call collectives in different orders, named at once.

Horovod's contract lets ranks submit the names of one step in any order, but
every rank of a process set must submit the same collectives.  A rank that
takes another code path (an extra unnamed allreduce, an allgather where the
others broadcast) otherwise shows as a stall after the stall inspector's
warning time, naming names but not the cause.  With the check on, every
request goes to the coordinator (the response cache is bypassed), and rank 0
numbers each rank's requests per process set in the order that rank submitted
them.  The first position where two ranks' collectives differ (name or kind)
fails both collectives on every rank that submitted them, with a message
naming the set, the position, the two ranks and their two collectives; a rank
that submits either name later gets the same error at once (until a completed
join starts the counts afresh).

Joins: while a rank of a set has joined, the others' allreduces are not counted
(the joined rank skips them by design), and a completed join starts every
count afresh.  Several threads that submit to one set concurrently have no
order to compare: use the check with one submitting thread per set.
"""

from __future__ import annotations

from collections.abc import Callable

from .messages import MISMATCH, RESPONSE_ERROR, Kind, Params, Response

__all__ = ["OrderCheck"]


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


class OrderCheck:
    """Rank 0's record of each rank's sequence of requests, per process set.

    *members(set_id)*: the set's global ranks (or None once removed)."""

    def __init__(self, members: Callable[[int], frozenset | None]):
        self._members = members
        self._counts: dict[tuple[int, int], int] = {}  # (set id, rank) -> requests counted
        # (set id, position) -> [first rank, its params, how many ranks matched it]
        self._seen: dict[tuple[int, int], list] = {}
        self._diverged: dict[tuple, str] = {}  # key -> the message it fails with
        self._stopped: set[int] = set()  # sets past their first difference: not counted

    def reset(self) -> None:
        """Every count starts afresh (a join completed on every rank)."""
        self._counts.clear()
        self._seen.clear()
        self._stopped.clear()
        self._diverged.clear()

    def observe(self, rank: int, params: Params, joined: frozenset) -> list[Response]:
        """Count *rank*'s next request; error responses where it differs from another
        rank's collective at the same position (or names a collective that already
        did).  *joined*: the ranks inside join() now."""
        known = self._diverged.get(params.key)
        if known is not None:
            return [Response(RESPONSE_ERROR, None, params.key, known, MISMATCH)]
        set_id = params.set_id
        members = self._members(set_id) or frozenset()
        if set_id in self._stopped:
            return []  # every later position would differ too: the first one is named
        if params.kind == Kind.ALLREDUCE and members & joined:
            return []  # a joined rank skips it by design
        position = self._counts.get((set_id, rank), 0)
        self._counts[(set_id, rank)] = position + 1
        record = self._seen.get((set_id, position))
        if record is None:
            self._seen[(set_id, position)] = [rank, params, 1]
            return []
        first_rank, first, matched = record
        if (first.name, first.kind) == (params.name, params.kind):
            record[2] = matched + 1
            if record[2] >= len(members):
                del self._seen[(set_id, position)]
            return []
        message = (
            f"Ranks called collectives in different orders on process set {set_id}: the "
            f"{_ordinal(position + 1)} collective rank {first_rank} submitted there is "
            f"{Kind(first.kind).name.lower()} {first.name!r}, rank {rank}'s is "
            f"{Kind(params.kind).name.lower()} {params.name!r}. Every rank of a process set "
            "must call the same collectives (HVDLITE_CHECK_ORDER=1 compares their order; "
            "ranks that take different code paths, or call an unnamed collective only on "
            "some ranks, do this)."
        )
        self._stopped.add(set_id)
        self._diverged[first.key] = self._diverged[params.key] = message
        return [
            Response(RESPONSE_ERROR, None, first.key, message, MISMATCH),
            Response(RESPONSE_ERROR, None, params.key, message, MISMATCH),
        ]
