"""The coordinator: rank 0's table of requests, and its decisions.

Ranks send requests for names the response cache cannot settle.  The
coordinator records which ranks asked for which name; when every rank of the
name's process set has asked (joined ranks excepted, for the kinds they can
take part in), it checks that the requests agree and emits one response: run
it, or an error naming the field that differed and each rank's value (marked
``MISMATCH``, which the ranks raise as :class:`~hvdlite.exceptions.MismatchError`).
A kind that joined ranks cannot take part in fails as soon as it is asked for
while a member of its set has joined, on whichever ranks asked.  A rank that
leaves join() before it returned sends ``LEAVE_PARAMS`` and is no longer
counted as joined.

This module is pure logic (no MPI), so it is unit-tested directly.  Cross-rank
contract: only rank 0 holds a Coordinator; its response list is broadcast and
executed by every rank in order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from .messages import (
    CACHEABLE,
    JOIN_KEY,
    JOIN_PARAMS,
    JOINABLE,
    LEAVE_PARAMS,
    MISMATCH,
    RESPONSE_ERROR,
    RESPONSE_OK,
    Kind,
    Params,
    Response,
    describe,
    field_label,
)
from .order_check import OrderCheck
from .rank_ranges import describe_ranks, rank_ranges

__all__ = ["Coordinator", "StallClock", "check_agreement"]

_CHECKED_FIELDS = (
    "kind",
    "device",
    "dtypes",
    "framework_dtypes",
    "shapes",
    "op",
    "root",
    "prescale",
    "postscale",
    "extra",
)


def _value(p: Params, field: str):
    if field == "framework_dtypes" and not p.framework_dtypes:  # the engine's dtypes are its own
        return tuple(np.dtype(d).name for d in p.dtypes)
    return getattr(p, field)


def check_agreement(name: str, per_rank: Mapping[int, Params]) -> str | None:
    """None if all ranks' requests agree, else a message naming what differed where."""
    ranks = sorted(per_rank)
    first = per_rank[ranks[0]]
    for field in _CHECKED_FIELDS:
        values = {r: _value(per_rank[r], field) for r in ranks}
        if len(set(values.values())) == 1:
            continue
        by_value: dict = {}
        for r, v in values.items():
            by_value.setdefault(v, []).append(r)
        parts = "; ".join(
            f"{describe_ranks(rs)}: {describe(field, v)}" for v, rs in by_value.items()
        )
        kind = Kind(first.kind).name.lower() if field != "kind" else "collective"
        return (
            f"Mismatched {field_label(field)} for {kind} {name!r}: {parts}. "
            f"Every rank of the process set must submit {name!r} with the same "
            f"{field_label(field)}."
        )
    return None


class Coordinator:
    """Rank 0's negotiation state across cycles."""

    def __init__(
        self,
        world_size: int,
        members: Callable[[int], frozenset | None],
        check_order: bool = False,
        hosts: list[str] | None = None,
    ):
        self.world_size = world_size
        self.hosts = hosts  # host name of each rank, for the reports (None: not known)
        self._members = members
        self.order = OrderCheck(members) if check_order else None  # HVDLITE_CHECK_ORDER
        # Names some member of their set has asked for and others have not yet: a
        # name leaves when it is decided, cancelled as stalled, or its set is removed.
        self._table: dict[tuple, dict[int, Params]] = {}
        self.joined: list[int] = []  # ranks in the order they joined
        self._world: frozenset | None = None  # every rank, once decides_alone needs it
        self.stalled_ranks: frozenset = frozenset()  # the missing ranks of the last report

    def pending_names(self) -> dict[tuple, list[int]]:
        return {key: sorted(reqs) for key, reqs in self._table.items()}

    def process(self, gathered: Iterable[tuple[int, list[Params]]]) -> list[Response]:
        """Record the new requests of each rank; return the responses now decided."""
        newly_joined = []
        order_errors: list[Response] = []
        for rank, requests in gathered:
            for p in requests:
                if p.kind == Kind.JOIN:
                    if p == LEAVE_PARAMS:  # this rank left join() before it returned
                        if rank in newly_joined:
                            newly_joined.remove(rank)
                        if rank in self.joined:
                            self.joined.remove(rank)
                    elif rank not in self.joined and rank not in newly_joined:
                        newly_joined.append(rank)
                    continue
                if self.order is not None:
                    errors = self.order.observe(rank, p, frozenset(self.joined + newly_joined))
                    if errors:
                        for error in errors:
                            self._table.pop(error.key, None)
                        order_errors += errors
                        continue
                self._table.setdefault(p.key, {})[rank] = p
        # Several ranks joining in one cycle: the highest rank counts as the last.
        self.joined.extend(sorted(newly_joined))

        responses: list[Response] = order_errors
        joined = frozenset(self.joined)
        for key in list(self._table):
            per_rank = self._table[key]
            response = self._decide(key, per_rank, joined)
            if response is not None:
                responses.append(response)
                del self._table[key]
        if len(self.joined) == self.world_size:
            last = self.joined[-1]
            self.joined = []
            if self.order is not None:
                self.order.reset()  # the ranks' sequences differed by design until here
            responses.append(Response(RESPONSE_OK, JOIN_PARAMS, JOIN_KEY, value=last))
        return responses

    def _decide(self, key, per_rank: dict[int, Params], joined: frozenset) -> Response | None:
        set_id, name = key
        members = self._members(set_id)
        if members is None:
            return Response(
                RESPONSE_ERROR,
                None,
                key,
                f"Process set {set_id} of {name!r} is not registered (was it removed?).",
            )
        outsiders = sorted(set(per_rank) - members)
        if outsiders:
            return Response(
                RESPONSE_ERROR,
                None,
                key,
                f"Ranks [{rank_ranges(outsiders)}] submitted {name!r} to process "
                f"set {set_id}, which they are not members of.",
            )
        submitted = set(per_rank)
        kind = next(iter(per_rank.values())).kind
        joined_members = members & joined
        if joined_members and kind not in JOINABLE:
            # Fails at once, on the ranks that submitted it, without waiting for the
            # other members: they may never submit this name.  An automatic name
            # counts calls, and a joined rank skipped this call, so from here on
            # the members' names of one call may differ (rank A's second unnamed
            # allgather is rank B's first); each rank's own call fails all the same.
            return Response(
                RESPONSE_ERROR,
                None,
                key,
                f"{Kind(kind).name.lower()} {name!r} cannot run while ranks "
                f"{sorted(joined_members)} have called join(); only allreduce "
                "(Adasum included) runs while a rank has joined, as in Horovod.",
                MISMATCH,
            )
        if not (members - joined) <= submitted:
            return None
        error = check_agreement(name, per_rank)
        if error is not None:
            return Response(RESPONSE_ERROR, None, key, error, MISMATCH)
        params = per_rank[min(per_rank)]
        if params.kind == Kind.BROADCAST and params.root in joined:
            return Response(
                RESPONSE_ERROR,
                None,
                key,
                f"broadcast {name!r}: root rank {params.root} has joined.",
                MISMATCH,
            )
        return Response(RESPONSE_OK, params, key)

    def decides_alone(self, requests: list[Params]) -> bool:
        """Whether *requests*, were they every rank's requests of this cycle, could be
        decided without the other ranks' copies (:meth:`process_unanimous`): no rank
        has joined, and each is a collective of the global set that no rank asked
        for before.  Identical requests from every member then agree by construction."""
        if self.joined or self.order is not None:  # the order check counts every request
            return False
        world = self._world
        if world is None:
            world = self._world = frozenset(range(self.world_size))
        return all(
            p.kind in CACHEABLE and p.key not in self._table and self._members(p.set_id) == world
            for p in requests
        )

    def process_unanimous(self, requests: list[Params]) -> list[Response]:
        """The responses to *requests*, sent alike by every rank this cycle (checked by
        the caller, with :meth:`decides_alone` true): what :meth:`process` would
        answer to N copies of them, in O(len(requests)) instead of O(N x len)."""
        return [Response(RESPONSE_OK, p, p.key) for p in requests]

    def stall_report(
        self, pending: Mapping[int, list[tuple[tuple, float]]], warn_after: float, fail_after: float
    ) -> tuple[str, list[Response]]:
        """From each rank's pending (key, age) list: a warning text and error responses.

        A name is stalled when some member of its process set has waited longer
        than *warn_after* seconds while other members have not submitted it.
        Past *fail_after* (> 0) seconds the name fails on every rank.
        """
        holders: dict[tuple, dict[int, float]] = {}
        for rank, items in pending.items():
            for key, age in items:
                holders.setdefault(key, {})[rank] = age
        joined = frozenset(self.joined)
        missing_by_rank: dict[int, list[str]] = {}
        errors: list[Response] = []
        for key, ages in sorted(holders.items(), key=lambda kv: kv[0]):
            members = self._members(key[0]) or frozenset()
            missing = sorted(members - set(ages) - joined)
            oldest = max(ages.values())
            if not missing or oldest < warn_after:
                continue
            for r in missing:
                missing_by_rank.setdefault(r, []).append(key[1])
            if fail_after > 0 and oldest >= fail_after:
                errors.append(
                    Response(
                        RESPONSE_ERROR,
                        None,
                        key,
                        f"Stalled collective {key[1]!r} cancelled after {oldest:.0f} s: ranks "
                        f"[{rank_ranges(ages)}] submitted it, ranks [{rank_ranges(missing)}]"
                        f"{self._on_hosts(missing)} never did. Make every rank of the process "
                        "set call the same "
                        "collectives with the same names.",
                    )
                )
                self._table.pop(key, None)
        self.stalled_ranks = frozenset(missing_by_rank)
        if not missing_by_rank:
            return "", errors
        lines = [
            "One or more collectives were submitted by a subset of ranks and have been waiting "
            f"for the remaining ranks for more than {warn_after:.0f} seconds. This may mean "
            "that different ranks run different collectives, or in a different order, or that "
            "a rank is much slower. Missing ranks:"
        ]
        # Ranks missing the same names share a line ("ranks 3-31: [...]"): at many
        # ranks the report stays as long as the number of distinct lists.
        by_names: dict[tuple, list[int]] = {}
        for r in sorted(missing_by_rank):
            by_names.setdefault(tuple(missing_by_rank[r]), []).append(r)
        for names, ranks in by_names.items():
            shown = ", ".join(names[:10]) + (
                f" (and {len(names) - 10} more)" if len(names) > 10 else ""
            )
            lines.append(f"  {describe_ranks(ranks)}{self._on_hosts(ranks)}: [{shown}]")
        lines.append(STALL_HINT)
        return "\n".join(lines), errors

    def _on_hosts(self, ranks: list[int]) -> str:
        """`` (on h3)``, `` (on h2, h3)``: where *ranks* run, for a report ("" unknown)."""
        if not self.hosts:
            return ""
        names = list(dict.fromkeys(self.hosts[r] for r in ranks if r < len(self.hosts)))
        shown = ", ".join(names[:_HOSTS_SHOWN])
        if len(names) > _HOSTS_SHOWN:
            shown += f" and {len(names) - _HOSTS_SHOWN} more hosts"
        return f" (on {shown})"


#: The most host names one line of a report lists.
_HOSTS_SHOWN = 8

#: The last lines of a stall warning: what to look at next.
STALL_HINT = (
    "What to check: every rank that waits has logged the Python stack of the code that "
    "submitted what it waits on ('hvdlite stall: rank N waits on ...'); for ranks on "
    "different code paths run with HVDLITE_CHECK_ORDER=1 (hvdrun --check-order), which "
    "fails at the first collective that differs; for a rank that is alive but stuck, "
    "HVDLITE_COLLECTIVE_TIMEOUT=SECONDS ends the job instead of waiting. (docs/hangs.md: "
    '"My job hangs")'
)
#: The longest gap between two repeats of the same stall warning.
REPORT_GAP_CAP = 600.0


class StallClock:
    """When a rank should ask for a stall check: it has work pending for longer than
    the warning time, looked at no more often than every few seconds.  On rank 0 it
    also spaces out the warning itself (:meth:`report_due`)."""

    def __init__(
        self,
        warn_seconds: float,
        fail_seconds: float,
        enabled: bool,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.warn_seconds = warn_seconds
        self.fail_seconds = fail_seconds
        self.enabled = enabled
        self._clock = clock
        self._next_look = clock() + min(warn_seconds, 5.0)
        self._last_report: frozenset | None = None  # the missing ranks last reported
        self._report_gap = 0.0
        self._next_report = 0.0

    def due(self, pending: Mapping) -> bool:
        """*pending*: this rank's entries by key (each with a ``submitted`` time)."""
        if not self.enabled or not pending:
            return False
        now = self._clock()
        if now < self._next_look:
            return False
        self._next_look = now + max(1.0, min(self.warn_seconds, 10.0) / 2)
        oldest = min(entry.submitted for entry in pending.values())
        return now - oldest >= self.warn_seconds

    def report_due(self, report: str, stalled: frozenset = frozenset()) -> float | None:
        """Whether to log *report* (rank 0's stall warning, "" when there is no stall)
        now.  A warning about other missing ranks (*stalled*) than the last one is due
        at once; one about the same ranks after the warning time, then after twice as
        long each time, up to ``REPORT_GAP_CAP`` seconds.  Returns the seconds until the
        next repeat when it is due, else None."""
        now = self._clock()
        if not report:
            self._last_report = None
            return None
        if stalled != self._last_report:
            self._last_report = stalled
            self._report_gap = max(self.warn_seconds, 1.0)
        elif now < self._next_report:
            return None
        else:
            self._report_gap = min(self._report_gap * 2, REPORT_GAP_CAP)
        self._next_report = now + self._report_gap
        return self._report_gap
