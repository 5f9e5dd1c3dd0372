"""The plans of all-cached cycles, kept while the response cache is unchanged.

A training loop readies the same cache bits step after step (its gradients,
perhaps a loss it averages every step), so each set of ready bits gets its
fusion plan once: the batches, the executor's runners of them and, where the
plan's first batch is a shared-memory allreduce of one chunk, its stager (see
:mod:`hvdlite.engine.transports.shm`'s staged allreduce).  A plan is looked up by its
ready bits and the cache's version; any other version drops every plan.

Cross-rank contract: the engine makes and looks up plans only from globally
agreed facts (the ready bits of the status exchange, the cache version), so
every rank holds the same plans, made in the same cycles (making runners can
be collective: :meth:`~hvdlite.engine.executor.MPIExecutor.runners`).
:meth:`PlanCache.peek` is the exception, local and without effect on what is
held.  Pure Python, no MPI.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Plan", "PlanCache"]


class Plan(NamedTuple):
    """One cached cycle's work, ready to run again."""

    batches: list  # lists of Responses, as plan_batches made them
    runners: list[Callable[[], None]]  # one per batch (MPIExecutor.runners)
    stager: object | None  # an executor _Stager where the plan can run staged


class PlanCache:
    """Plans by ready bits, for one response-cache version at a time."""

    __slots__ = ("limit", "_plans", "_version")

    def __init__(self, limit: int = 16):
        self.limit = limit
        self._plans: dict[int, Plan] = {}
        self._version = None

    def get(self, ready: int, version) -> Plan | None:
        """The plan of *ready* at cache *version*; a new version drops every plan."""
        if version != self._version:
            self._plans.clear()
            self._version = version
            return None
        return self._plans.get(ready)

    def peek(self, ready: int, version) -> Plan | None:
        """As :meth:`get`, without dropping anything: for one rank's own guesses."""
        return self._plans.get(ready) if version == self._version else None

    def add(self, ready: int, plan: Plan) -> Plan:
        """Keep *plan* for *ready* (at the version of the last :meth:`get`); past
        ``limit`` plans every plan is dropped first (a loop needs only a few)."""
        if len(self._plans) >= self.limit:
            self._plans.clear()
        self._plans[ready] = plan
        return plan

    def clear(self) -> None:
        self._plans.clear()
        self._version = None

    def __len__(self) -> int:
        return len(self._plans)
