"""Running a cycle's agreed responses: fused into batches, a cached plan reused.

Every rank runs the same responses in the same order (the status exchange and
the coordinator made them the same), so the batches, and the collectives in
them, match across ranks.  A cycle that runs only cached responses reuses the
plan made the first time the same bits were ready (:mod:`hvdlite.engine.plans`),
with a runner per batch and, where the first batch can be, a stager that copies
this rank's part into shared memory before the status exchange.  Control
responses (join, process sets) and error responses go back to the engine.
"""

from __future__ import annotations

from collections.abc import Callable

from .fusion import plan_batches
from .messages import CACHEABLE, RESPONSE_ERROR, RESPONSE_OK, Kind, Response
from .plans import Plan, PlanCache

__all__ = ["Execution"]

#: Kinds whose responses carry no tensors: the engine itself answers them.
_CONTROL = frozenset({int(Kind.JOIN), int(Kind.ADD_PROCESS_SET), int(Kind.REMOVE_PROCESS_SET)})


class Execution:
    """Runs batches through the host *executor* (which hands device batches on).

    *control(response)*: the engine's handling of an error or control response;
    *tuning*: autotune's link (it measures the batches on rank 0), or None."""

    def __init__(
        self,
        executor,
        bits,
        threshold: int,
        router,
        timeline,
        tuning,
        control: Callable[[Response], None],
    ):
        self.executor = executor
        self._bits = bits
        self._threshold = threshold
        self._router = router
        self.timeline = timeline  # the engine's, while one is recorded (it may change)
        self._tuning = tuning
        self._control = control
        self._plans = PlanCache()  # the plans of all-cached cycles

    def stage(self) -> bool:
        """Before the status exchange: stage the first batch of the cached plan
        whose ready bits are exactly the bits this rank waits on, where that plan
        has a stager (True when staged).  Every rank's answer goes into the
        exchange."""
        if self.timeline is not None:
            return False
        bits = self._bits
        plan = self._plans.peek(bits.hit_mask, bits.cache.version)
        return plan is not None and plan.stager is not None and plan.stager.stage()

    def run_cached(self, ready: int, ready_bits: list[int], staged: bool) -> None:
        """Run the cached responses of *ready_bits* (the bits of *ready*,
        ascending) by their plan, made here on every rank the first time these
        bits are ready at this cache version.  *staged*: every rank staged this
        plan's first batch before this cycle's exchange."""
        cache = self._bits.cache
        plan = self._plans.get(ready, cache.version)
        if plan is None:  # (then nothing staged it: a changed version drops staged plans)
            staged = False
            batches = plan_batches([cache.get(bit) for bit in ready_bits], self._threshold)
            executor = self.executor
            plan = self._plans.add(
                ready, Plan(batches, executor.runners(batches), executor.stager(batches))
            )
        if self.timeline is not None:
            self._run_batches(plan.batches)
            return
        self.executor.timeline = None
        runners = plan.runners
        if staged and plan.stager is not None:
            plan.stager.run()  # the first batch
            runners = runners[1:]
        for run in runners:
            run()
        if self._tuning is not None:
            self._tuning.observe(plan.batches)

    def run_ready(self, ready: int, responses: list[Response], staged: bool) -> None:
        """Run what this cycle decided: the cached responses of the *ready* bits
        (by their plan when nothing was negotiated; *staged*: every rank staged
        it), then the coordinator's *responses*."""
        bits = self._bits
        if ready:
            ready_bits = bits.take_ready(ready)
            if responses:
                self.run([bits.cache.get(bit) for bit in ready_bits] + responses)
            else:
                self.run_cached(ready, ready_bits, staged)
        elif responses:
            self.run(responses)

    def remember(self, responses: list[Response], members) -> list:
        """Give each OK cacheable response of the coordinator's a cache bit (every
        rank alike); the entries of the bits this evicted, for the coordinator."""
        evicted = []
        for response in responses:
            if response.status == RESPONSE_OK and response.params.kind in CACHEABLE:
                entry = self._bits.put(response, members(response.key[0], ()))
                if entry is not None:
                    evicted.append(entry)
        return evicted

    def run(self, responses: list[Response]) -> None:
        """Run *responses* (negotiated this cycle, or some cached ones with them)."""
        self._run_batches(plan_batches(responses, self._threshold))

    def _run_batches(self, batches: list[list[Response]]) -> None:
        tl = self.executor.timeline = self.timeline
        for batch in batches:
            first = batch[0]
            if first.status == RESPONSE_ERROR or first.params.kind in _CONTROL:
                self._control(first)
            elif tl is None:
                self.executor.run_batch(batch)
            else:
                tl.batch_began()
                self.executor.run_batch(batch)
                tl.batch_ended(batch)
        if self._tuning is not None:
            self._tuning.observe(batches)  # rank 0 measures; a no-op elsewhere and once settled

    def apply_setting(self, setting) -> None:
        """Autotune: fuse and route by *setting* from this cycle on (every rank
        in the same cycle, so every member of a set picks the same path)."""
        self._threshold = setting.fusion_threshold
        self._plans.clear()
        self.executor.use_router(
            self._router.variant(setting.shared_memory_allreduce, setting.hierarchical_allreduce)
        )
