"""The engine: the cycle that negotiates and runs collectives, wired to MPI.

Framework threads call :meth:`Engine.submit`; a :class:`~hvdlite.driver.Driver`
runs *cycles* on the engine's thread, or on a caller that waits on a handle.
A cycle, on every rank at once over the engine's private copy of the world
communicator:

1. take newly submitted entries from the :class:`~hvdlite.submissions.Inbox`;
   look each up in the response cache (:class:`~hvdlite.cache_bits.CacheBits`):
   a hit waits on its bit, changed parameters invalidate the bit, a miss
   becomes a request for the coordinator;
2. one non-blocking bitwise-AND allreduce of the status vector
   (:mod:`hvdlite.status`): flags, the cache bits every rank is ready for,
   invalidations and, right after a wait, which ranks rang the doorbell.
   Just before it, a rank whose waiting cache bits are exactly those of a
   cached plan (:mod:`hvdlite.plans`) copies that plan's first batch into
   shared memory where the plan allows it (a *staged* allreduce, see
   :mod:`hvdlite.shm`); when the exchange says every rank did and that every
   bit any rank waits on is ready, every rank staged the plan now due, and the
   exchange has been its first barrier;
3. if any rank has requests (or a stall check is due): gather them to rank 0,
   whose :class:`~hvdlite.coordinator.Coordinator` answers with a response
   list that is broadcast;
4. run cached responses that every rank is ready for, then the coordinator's
   responses, fused into batches (identical on every rank) by the executor;
   complete the handles.

All process sets negotiate through this one global cycle, and every rank runs
the same responses in the same order (skipping sets it is not in), so the
blocking data collectives of different sets can never deadlock each other.

Idle cost: after a cycle that needs no follow-up anywhere (work that is not
ready on every rank needs none: the rank that completes it will submit), every
rank stops cycling and waits (see :class:`~hvdlite.driver.Driver` for how
often it looks); the first rank with new work rings the
:class:`~hvdlite.doorbell.Doorbell` and cycling resumes.  A training step that
submits its gradients in one burst therefore costs one cycle, and one doorbell
(or, where some rank's engine thread overlaps the framework's compute, one
empty follow-up cycle, which lets a loop of synchronous calls go on without
doorbells).  No MPI call
spins for long while a peer is slow: the status allreduce is non-blocking and
tested with a :class:`~hvdlite.backoff.Backoff`.
"""

from __future__ import annotations

import logging
import time

from mpi4py import MPI

from .backoff import Backoff
from .cache_bits import CacheBits
from .coordinator import Coordinator, StallClock
from .doorbell import Doorbell
from .driver import Driver, State
from .exceptions import HorovodInternalError, MismatchError
from .executor import MPIExecutor
from .fusion import plan_batches
from .messages import (
    CACHEABLE, JOIN_KEY, LEAVE_PARAMS, MISMATCH, RESPONSE_ERROR, RESPONSE_OK, Kind, Response,
)
from .plans import Plan, PlanCache
from .process_sets import ProcessSet
from .response_cache import ResponseCache
from .status import Codec, Flag, Layout, alone
from .submissions import Entry, Inbox
from .runtime import abort_job
from .wait_limit import WaitLimit

__all__ = ["Engine"]

log = logging.getLogger("hvdlite")

_JOIN = int(Kind.JOIN)
#: Without overlap, the engine thread starts negotiating asynchronous work itself
#: after this many seconds, so work that nobody waits on still completes.
_LAZY_START = 0.02
#: The status allreduce: peers in step arrive within microseconds, so a waiter
#: first looks in a loop that yields the core (long for a caller blocked on a
#: handle, short on the engine thread, beside the framework's compute), then
#: sleeps between looks, so a slow peer never costs this rank a core.
_STATUS_WAIT_CALLER = Backoff(floor=0.00002, cap=0.001, ratio=0.5, spin=0.005)
_STATUS_WAIT_THREAD = Backoff(floor=0.00002, cap=0.001, ratio=0.5, spin=0.0002)
_SHUTDOWN_MESSAGE = (
    "hvdlite has been shut down. This was caused by shutdown() on this or another "
    "rank, or an exception on another rank; call hvd.init() again to restart."
)


class Engine:
    """The per-process engine (see the module docstring for the cycle)."""

    def __init__(self, world, config, sets, planner, timeline=None, hierarchical=None,
                 overlap=True, core=None, tuning=None):
        self.sets = sets
        self.comm = world.Dup()  # control traffic only: status, gather/bcast, doorbells
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeline = timeline
        self.overlap = overlap
        # Whether some rank's engine thread has a core of its own: the same on every
        # rank.  It decides whether a cycle that ran work is followed by another (see
        # cycle(); so ranks wait together) and whether the framework adapters start
        # reductions while the framework still computes.
        self.overlap_anywhere = (overlap if self.size == 1
                                 else self.comm.allreduce(overlap, op=MPI.LOR))
        self.inbox = Inbox()
        self.interrupted: BaseException | None = None  # a Ctrl-C/exit that broke a cycle
        # HVDLITE_COLLECTIVE_TIMEOUT: alone, this rank never waits for another.
        self.limit = WaitLimit(config.collective_timeout if self.size > 1 else None, self.rank)
        self._pending: dict[tuple, Entry] = {}
        self._uncached: list[Entry] = []
        self._joined = False  # this rank is inside join()
        self._some_joined = False  # some rank is, as of the last cycle
        self.bits = CacheBits(ResponseCache(config.cache_capacity), self.rank)
        self.coordinator = Coordinator(self.size, sets.members.get) if self.rank == 0 else None
        self.executor = MPIExecutor(self._pending.get, self._finish, sets, planner,
                                    self._finish_keys, hierarchical,
                                    self.limit if self.limit.seconds else None)
        self._threshold = config.fusion_threshold
        # Autotune (a TuningLink, or None): rank 0's setting arrives in the status vector.
        self.tuning = tuning
        self._planner = planner
        self._plans = PlanCache()  # the plans of all-cached cycles
        warn = config.stall_check_time_seconds
        if self.limit.seconds:  # warn (naming the missing ranks) before the limit ends the job
            warn = min(warn, self.limit.seconds / 2)
        self._stall = StallClock(warn,
                                 config.stall_shutdown_time_seconds,
                                 enabled=not config.stall_check_disable and self.size > 1)
        self._stall_wanted = False
        self._stop_reason = ""
        self.cycles = 0
        self.doorbell = Doorbell(self.comm)
        self._codec = Codec()
        self._layouts: dict[tuple, tuple] = {}  # (bits, after a wait, root words) -> layout
        cycle_time = config.cycle_time_ms / 1000.0
        self.driver = Driver(self, cycle_time,
                             start_delay=cycle_time if overlap else max(cycle_time, _LAZY_START),
                             step_limit=self.limit.seconds, core=core, spare_core=overlap)
        self.driver.start()

    # ============================================================ caller side
    def submit(self, entry: Entry, wake: bool = True):
        """Queue *entry*; ValueError if its name is already in flight on this rank.

        *wake*: rouse the engine thread now (an asynchronous caller); a caller
        that is about to wait on the handle passes False and drives the engine.
        Without overlap it is roused only where its next look would come later
        than its start delay (:meth:`~hvdlite.driver.Driver.nudge`): the
        submitting thread is about to run on the same core, and a waiting
        caller usually drives the work before that look.
        """
        entry.handle.engine = self
        self.inbox.put(entry)
        if wake:
            if self.overlap:
                self.driver.wake()
            else:
                self.driver.nudge()
        return entry.handle

    def drive(self, handle, timeout: float | None = None) -> None:
        """Advance the engine from the calling thread until *handle* is done (or *timeout*)."""
        self.driver.drive(handle, timeout)

    def request_shutdown(self, timeout: float | None = 60.0) -> bool:
        """Ask every rank's engine to stop; wait for ours. True if it stopped in time."""
        return self.driver.request_stop(timeout)

    @property
    def stopped(self) -> bool:
        return self.inbox.closed

    def stop_message(self) -> str:
        return self._stop_reason or _SHUTDOWN_MESSAGE

    # ================================================= the Loop of the driver
    def oldest_queued(self) -> float | None:
        return self.inbox.oldest()

    def busy(self) -> bool:
        return bool(self._pending) or bool(self.inbox)

    def work_arrived(self) -> bool:
        """While waiting: local work (then ring every peer) or a peer's doorbell?"""
        self.limit.check_pending(self._pending)
        if self._stall.due(self._pending):
            self._stall_wanted = True
        if self.inbox or self.driver.state is State.DRAINING or self._stall_wanted:
            self.doorbell.ring()
            return True
        return self.doorbell.heard()

    def fail(self, exc: BaseException) -> None:
        self._stop_reason = f"hvdlite engine failed on rank {self.rank}: {exc!r}"
        self._fail_everything(self._stop_reason)
        if self.size > 1:
            # Peers would wait for this rank forever: end the job instead of hanging it.
            abort_job(1)

    def interrupt(self, exc: BaseException) -> None:
        """A KeyboardInterrupt or SystemExit broke a cycle in a caller that drove it.

        The cycle cannot be finished, so the engine stops: its handles fail here
        and the exception goes on to the caller.  Peers may be waiting inside that
        cycle, so a job of several ranks ends when this process exits
        (:mod:`hvdlite.basics` aborts it then).
        """
        self.interrupted = exc
        self._stop_reason = (
            f"hvdlite engine stopped on rank {self.rank}: {type(exc).__name__} arrived in the "
            "middle of an engine cycle, which cannot be finished. "
            + ("The other ranks wait inside it, so the job ends when this process exits or "
               "calls hvd.shutdown()." if self.size > 1
               else "Call hvd.shutdown() and hvd.init() to start again.")
        )
        self._fail_everything(self._stop_reason)

    def teardown(self, orderly: bool) -> None:
        self._fail_everything(self.stop_message())
        if self.tuning is not None:
            self.tuning.close()
        if orderly:
            self.executor.close()
        self.doorbell.close()
        try:
            self.comm.Free()
        except MPI.Exception:
            pass

    def _fail_everything(self, reason: str) -> None:
        for entry in self.inbox.close(reason) + list(self._pending.values()):
            self._fail(entry, reason)

    # -------------------------------------------------------------------- cycle
    def cycle(self, after_wait: bool) -> tuple[bool, bool]:
        """One cycle on every rank; returns (progress, stop)."""
        self.cycles += 1
        new = self.inbox.take_all()
        for entry in new:
            self._admit(entry)
        tl = self.timeline
        if tl is not None:
            tl.cycle_began(self.cycles, new)
        flags = self._flags(bool(new))
        if not self._stage():
            flags |= Flag.UNSTAGED
        status = self._exchange_status(flags, after_wait)
        if self.tuning is not None and status.root:
            setting = self.tuning.receive(status.root, self.cycles)
            if setting is not None:
                self._apply_setting(setting)
        flags = status.flags
        if status.ringers and not self.doorbell.drain(status.ringers, self.limit.seconds):
            raise self.limit.error("to receive their doorbells")
        bits = self.bits
        if status.invalid:
            self._uncached += bits.invalidate(status.invalid)
        ready = status.all_hit & status.any_hit & ~status.invalid
        joined_changed = self._some_joined != bool(flags & Flag.JOINED)
        self._some_joined = bool(flags & Flag.JOINED)
        if self._some_joined:
            # While a rank is joined everything is negotiated by the coordinator
            # (decided from the global flag, so every rank drops the same bits).
            self._uncached += bits.unhit_all()
            ready = 0

        responses: list[Response] = []
        if flags & (Flag.UNCACHED | Flag.STALL):
            responses = self._negotiate(bool(flags & Flag.STALL))
        if ready or responses:
            self.driver.ran_work()
            if tl is not None:
                tl.decided()
        if ready:
            ready_bits = bits.take_ready(ready)
            if responses:
                self._execute([bits.cache.get(bit) for bit in ready_bits] + responses)
            else:
                # Every rank staged the plan of its own waiting bits (no UNSTAGED),
                # and every waiting bit is ready: so each staged the plan now due.
                staged = not flags & Flag.UNSTAGED and ready == status.any_hit
                self._execute_cached(ready, ready_bits, staged)
        elif responses:
            self._execute(responses)
        for response in responses:
            if response.status == RESPONSE_OK and response.params.kind in CACHEABLE:
                evicted = bits.put(response, self.sets.members.get(response.key[0], ()))
                if evicted is not None:
                    self._uncached.append(evicted)
        if flags & Flag.SHUTDOWN:
            return True, True
        # Only globally known facts decide progress, so every rank waits (or not) together.
        # Work that was submitted but is not ready everywhere needs no further cycle:
        # the rank that completes it submits later and rings the doorbell.  Another
        # cycle is due when this one moved entries back to the coordinator
        # (invalidated cache bits, a rank joining or leaving), ran a stall check, or
        # ran work while some rank overlaps: what ran is the same on every rank, and
        # where work just ran more usually follows (the next synchronous call, the
        # rest of a burst), which then needs no doorbell.  A burst's end costs one
        # empty cycle before the wait.  Where no rank overlaps, that empty cycle
        # would fall to the engine threads in the middle of the framework's next
        # compute, on cores it needs; there the next work rings the doorbell instead.
        ran = self.overlap_anywhere and (bool(ready) or bool(responses))
        return bool(flags & (Flag.INVALID | Flag.STALL)) or joined_changed or ran, False

    def _admit(self, entry: Entry) -> None:
        params = entry.params
        if params.kind == _JOIN and params == LEAVE_PARAMS:
            self._leave_join(entry)
            return
        self._pending[entry.key] = entry
        if params.set_id not in self.sets.members:
            self._fail(entry, f"process set {params.set_id} of {params.name!r} is not "
                              "registered (was it removed?)")
            return
        if params.kind == _JOIN:
            self._joined = True
        if self._some_joined or params.kind not in CACHEABLE or not self.bits.admit(entry):
            self._uncached.append(entry)

    def _leave_join(self, leave: Entry) -> None:
        """This rank's caller left join() before it returned: fail the join here and,
        where its request went out, have the coordinator stop counting this rank as
        joined (in the same cycle, before it decides anything)."""
        self.inbox.release((leave.key,))
        leave.handle.set_result(None)  # nobody waits on it
        join = self._pending.get(JOIN_KEY)
        if join is None:  # it completed (or failed) before the caller left
            return
        sent = join.sent
        self._fail(join, "join() was left before every rank had joined; this rank takes "
                         "part in collectives again.")
        if sent:
            self._uncached.append(leave)

    def _flags(self, new: bool) -> int:
        flags = 0
        if new:
            flags |= Flag.NEW
        if self._uncached:
            flags |= Flag.UNCACHED
        if self.driver.state is State.DRAINING:
            flags |= Flag.SHUTDOWN
        if self._joined:
            flags |= Flag.JOINED
        if self.bits.invalid_mask:
            flags |= Flag.INVALID
        if self._stall_wanted or self._stall.due(self._pending):
            flags |= Flag.STALL
            self._stall_wanted = False
        return flags

    def _stage(self) -> bool:
        """Before the status exchange: stage the first batch of the cached plan
        whose ready bits are exactly the bits this rank waits on, where that plan
        has a stager (True when staged).  Every rank's answer goes into the
        exchange."""
        if self.timeline is not None or self._joined:
            return False
        bits = self.bits
        plan = self._plans.peek(bits.hit_mask, bits.cache.version)
        return plan is not None and plan.stager is not None and plan.stager.stage()

    def _exchange_status(self, flags: int, after_wait: bool):
        tuning = self.tuning
        root_words, root = (tuning.words, tuning.outgoing()) if tuning is not None else (0, None)
        shape = (self.bits.cache.num_bits, after_wait, root_words)
        try:
            layout, full = self._layouts[shape]
        except KeyError:
            layout = Layout.of(shape[0], self.size, after_wait, root_words)
            full = (1 << (layout.bit_words * 64)) - 1
            self._layouts[shape] = (layout, full)
        hit_and, hit_or = self.bits.status_masks(self._joined, full)
        invalid = self.bits.invalid_mask
        if self.size == 1:
            return alone(layout, flags, hit_and, hit_or, invalid, self.doorbell.rang, root)
        vector = self._codec.encode(layout, flags, hit_and, hit_or, invalid,
                                    self.rank if self.doorbell.rang else None, root)
        req = self.comm.Iallreduce(MPI.IN_PLACE, vector, MPI.BAND)
        wait = _STATUS_WAIT_THREAD if self.driver.is_engine_thread() else _STATUS_WAIT_CALLER
        if not wait.wait_for(req.Test, timeout=self.limit.seconds):
            raise self.limit.error("in the engine's status exchange")
        return self._codec.decode(layout, vector)

    def _negotiate(self, stall: bool) -> list[Response]:
        requests = [e.params for e in self._uncached]
        for e in self._uncached:
            e.sent = True
        self._uncached = []
        now = time.monotonic()
        pending = ([(key, now - e.submitted) for key, e in self._pending.items()]
                   if stall else None)
        gathered = self.comm.gather((requests, pending), root=0)
        responses = None
        if self.coordinator is not None:
            tl = self.timeline
            if tl is not None:
                tl.reports(gathered)  # the instant each rank's requests reached rank 0
            responses = self.coordinator.process(
                (rank, item[0]) for rank, item in enumerate(gathered))
            if stall:
                report, errors = self.coordinator.stall_report(
                    {r: item[1] or [] for r, item in enumerate(gathered)},
                    self._stall.warn_seconds, self._stall.fail_seconds)
                if report:
                    log.warning(report)
                responses += errors
        return self.comm.bcast(responses, root=0)

    # ---------------------------------------------------------------- execution
    def _execute_cached(self, ready: int, bits: list[int], staged: bool) -> None:
        """Run the cached responses of *bits* (the bits of *ready*, ascending), by
        their plan (made here on every rank the first time these bits are ready
        at this cache version).  *staged*: every rank staged this plan's first
        batch before this cycle's exchange."""
        version = self.bits.cache.version
        plan = self._plans.get(ready, version)
        if plan is None:  # (then nothing staged it: a changed version drops staged plans)
            staged = False
            batches = plan_batches([self.bits.cache.get(bit) for bit in bits], self._threshold)
            executor = self.executor
            plan = self._plans.add(ready, Plan(batches, executor.runners(batches),
                                               executor.stager(batches)))
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
        if self.tuning is not None:
            self.tuning.observe(plan.batches)

    def _execute(self, responses: list[Response]) -> None:
        self._run_batches(plan_batches(responses, self._threshold))

    def _run_batches(self, batches: list[list[Response]]) -> None:
        for batch in batches:
            first = batch[0]
            if first.status == RESPONSE_ERROR:
                entry = self._pending.get(first.key)
                if entry is not None:
                    self._fail(entry, first.error,
                               MismatchError if first.value == MISMATCH else HorovodInternalError)
                continue
            kind = first.params.kind
            if kind == _JOIN:
                self._joined = False
                self._finish_key(first.key, first.value)
            elif kind == Kind.ADD_PROCESS_SET:
                self._add_process_set(first)
            elif kind == Kind.REMOVE_PROCESS_SET:
                self._remove_process_set(first)
            else:
                tl = self.executor.timeline = self.timeline
                if tl is None:
                    self.executor.run_batch(batch)
                else:
                    tl.batch_began()
                    self.executor.run_batch(batch)
                    tl.batch_ended(batch)
        if self.tuning is not None:
            self.tuning.observe(batches)  # rank 0 measures; a no-op elsewhere and once settled

    def _apply_setting(self, setting) -> None:
        """Autotune: run with *setting* from this cycle on (every rank, same cycle)."""
        self._threshold = setting.fusion_threshold
        self._plans.clear()
        cycle_time = setting.cycle_time_ms / 1000.0
        self.driver.set_cycle_time(cycle_time, cycle_time if self.overlap
                                   else max(cycle_time, _LAZY_START))
        planner = self._planner.variant(setting.shared_memory_allreduce,
                                        setting.hierarchical_allreduce)
        self.executor.use_planner(planner)

    # ---------------------------------------------------------- process sets
    def _add_process_set(self, response: Response) -> None:
        """Collective: every rank splits the new set's communicator off the world."""
        ranks = list(response.params.extra)
        entry = self._pending.get(response.key)
        existing = self.sets.find_ranks(ranks)
        if existing is not None:
            if entry is not None:
                self._fail(entry, f"a process set with ranks {ranks} already exists "
                                  f"(id {existing.process_set_id}).")
            return
        ps = entry.payload if entry is not None else ProcessSet(ranks)
        self.sets.create(ps, ranks)
        if entry is not None:
            self._finish(entry, ps)

    def _remove_process_set(self, response: Response) -> None:
        set_id = response.params.extra[0]
        entry = self._pending.get(response.key)
        if set_id == 0 or self.sets.get(set_id) is None:
            if entry is not None:
                self._fail(entry, f"process set {set_id} cannot be removed "
                                  "(it is the global set or not registered).")
            return
        self.bits.erase_set(set_id)
        for key, other in list(self._pending.items()):
            if key[0] == set_id:
                self._fail(other, f"process set {set_id} was removed while {key[1]!r} was "
                                  "pending.")
        if self.rank in self.sets.members.get(set_id, ()):
            self.executor.forget_set(set_id)
        ps = self.sets.remove(set_id)
        if entry is not None:
            self._finish(entry, ps)

    # --------------------------------------------------------------- completion
    def _finish(self, entry: Entry, value) -> None:
        tl = self.timeline
        if tl is not None:
            tl.finishing()
        self._pending.pop(entry.key, None)
        self.inbox.release((entry.key,))
        if entry.params.kind == _JOIN:
            self._joined = False
        entry.handle.set_result(entry.result(value))

    def _finish_key(self, key, value) -> None:
        entry = self._pending.get(key)
        if entry is not None:
            self._finish(entry, value)

    def _finish_keys(self, keys) -> None:
        """Finish the local entries of *keys* with their outputs (a batch that ran):
        what _finish does per entry, with the in-flight names released at once."""
        tl = self.timeline
        if tl is not None:
            tl.finishing()
        pending = self._pending
        entries = [pending.pop(key) for key in keys if key in pending]
        self.inbox.release([entry.key for entry in entries])
        for entry in entries:
            entry.handle.set_result(entry.result(None))

    def _fail(self, entry: Entry, message: str, error=HorovodInternalError) -> None:
        self._pending.pop(entry.key, None)
        self.inbox.release((entry.key,))
        if entry.params.kind == _JOIN:
            self._joined = False
        self.bits.forget(entry)
        if entry in self._uncached:
            self._uncached.remove(entry)
        entry.handle.set_exception(error(message))
