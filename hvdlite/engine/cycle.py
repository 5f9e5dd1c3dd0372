"""The engine: the cycle that negotiates and runs collectives, wired to MPI.

Framework threads call :meth:`Engine.submit`; a :class:`~hvdlite.engine.driver.Driver`
runs *cycles* on the engine's thread, or on a caller that waits on a handle.
A cycle, on every rank at once over the engine's private copy of the world
communicator:

1. take newly submitted entries from the :class:`~hvdlite.engine.submissions.Inbox`;
   look each up in the response cache (:class:`~hvdlite.engine.cache_bits.CacheBits`):
   a hit waits on its bit, changed parameters invalidate the bit, a miss
   becomes a request for the coordinator;
2. one non-blocking bitwise-AND allreduce of the status vector
   (:mod:`hvdlite.engine.status`, :mod:`hvdlite.engine.status_exchange`):
   flags, the cache bits every rank is ready for, invalidations and, right
   after a wait, which ranks rang the doorbell.
   Just before it, a rank whose waiting cache bits are exactly those of a
   cached plan (:mod:`hvdlite.engine.plans`, :mod:`hvdlite.engine.execution`)
   copies that plan's first batch into
   shared memory where the plan allows it (a *staged* allreduce, see
   :mod:`hvdlite.engine.transports.shm`); when the exchange says every rank did and that every
   bit any rank waits on is ready, every rank staged the plan now due, and the
   exchange has been its first barrier;
3. if any rank has requests (or a stall check is due): gather them to rank 0,
   whose :class:`~hvdlite.engine.coordinator.Coordinator` answers with a response
   list that is broadcast (:mod:`hvdlite.engine.negotiation`);
4. run cached responses that every rank is ready for, then the coordinator's
   responses, fused into batches (identical on every rank) by the executor
   (:mod:`hvdlite.engine.execution`); control responses that add or remove a
   process set go to :mod:`hvdlite.engine.set_control`; complete the handles.

All process sets negotiate through this one global cycle, and every rank runs
the same responses in the same order (skipping sets it is not in), so the
blocking data collectives of different sets can never deadlock each other.

Idle cost: after a cycle that needs no follow-up anywhere (work that is not
ready on every rank needs none: the rank that completes it will submit), every
rank stops cycling and waits (see :class:`~hvdlite.engine.driver.Driver` for how
often it looks); the first rank with new work rings the
:class:`~hvdlite.engine.doorbell.Doorbell` and cycling resumes.  A training step that
submits its gradients in one burst therefore costs one cycle, and one doorbell
(or, where some rank's engine thread overlaps the framework's compute, one
empty follow-up cycle, which lets a loop of synchronous calls go on without
doorbells).  No MPI call
spins for long while a peer is slow: the status allreduce is non-blocking and
tested with a :class:`~hvdlite.util.backoff.Backoff`.

Another cycle: work submitted but not ready everywhere needs no further cycle,
since the rank that completes it submits later and rings the doorbell.  Another
cycle is due when this one moved entries back to the coordinator (invalidated
cache bits, a rank joining or leaving), ran a stall check, or ran work while
some rank overlaps: what ran is the same on every rank, and where work just ran
more usually follows (the next synchronous call, the rest of a burst), which
then needs no doorbell.  A burst's end costs one empty cycle before the wait.
Where no rank overlaps, that empty cycle would fall to the engine threads in
the middle of the framework's next compute, on cores it needs; there the next
work rings the doorbell instead.
"""

from __future__ import annotations

import contextlib

from mpi4py import MPI

from .cache_bits import CacheBits
from .coordinator import Coordinator, StallClock
from .doorbell import Doorbell
from .driver import Driver, Phase
from ..exceptions import CollectiveTimeoutError, HorovodInternalError, MismatchError
from .executor import MPIExecutor
from .execution import Execution
from .messages import (
    CACHEABLE,
    JOIN_KEY,
    LEAVE_PARAMS,
    MISMATCH,
    RESPONSE_ERROR,
    RESPONSE_OK,
    Kind,
    Response,
)
from .response_cache import ResponseCache
from .negotiation import WaitingStacks, negotiate
from .set_control import SetControl
from .status import Flag
from .status_exchange import StatusExchange
from .submissions import Entry, Inbox
from .runtime import abort_job
from .wait_limit import WaitLimit

__all__ = ["Engine"]

_JOIN = int(Kind.JOIN)
#: Without overlap, the engine thread starts negotiating asynchronous work itself
#: after this many seconds, so work that nobody waits on still completes.
_LAZY_START = 0.02
_SHUTDOWN_MESSAGE = (
    "hvdlite has been shut down on this rank (hvd.shutdown()) before this collective "
    "completed; call hvd.init() again to run collectives."
)
_PEER_SHUTDOWN_MESSAGE = (
    "hvdlite was shut down by another rank: its program ended (or called hvd.shutdown()) "
    "while this rank still had collectives to run, and they cannot complete without it. "
    "Every rank must run the same collectives before it exits; if that rank failed, its "
    "error is in the job's output."
)


def _interrupted_message(exc: BaseException, rank: int, size: int) -> str:
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


def _stall_clock(config, limit: WaitLimit, size: int) -> StallClock:
    warn = config.stall_check_time_seconds
    if limit.seconds:  # warn (naming the missing ranks) before the limit ends the job
        warn = min(warn, limit.seconds / 2)
    return StallClock(
        warn,
        config.stall_shutdown_time_seconds,
        enabled=not config.stall_check_disable and size > 1,
    )


class Engine:
    """The per-process engine (see the module docstring for the cycle)."""

    def __init__(
        self,
        world,
        config,
        sets,
        router,
        timeline=None,
        hierarchical=None,
        overlap=True,
        core=None,
        tuning=None,
    ):
        self.sets = sets
        self.comm = world.Dup()  # control traffic only: status, gather/bcast, doorbells
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.overlap = overlap
        # Some rank's engine thread has a core of its own (decides follow-up cycles).
        self.overlap_anywhere = (
            overlap if self.size == 1 else self.comm.allreduce(overlap, op=MPI.LOR)
        )
        self.inbox = Inbox()
        self.interrupted: BaseException | None = None  # a Ctrl-C/exit that broke a cycle
        # HVDLITE_COLLECTIVE_TIMEOUT: alone, this rank never waits for another.
        self.limit = WaitLimit(config.collective_timeout if self.size > 1 else None, self.rank)
        self._pending: dict[tuple, Entry] = {}
        self._uncached: list[Entry] = []
        self._joined = False  # this rank is inside join()
        self._some_joined = False  # some rank is, as of the last cycle
        self.bits = CacheBits(ResponseCache(config.cache_capacity), self.rank)
        # Rank 0 names hosts in its stall reports: each rank's host, gathered once.
        hosts = self.comm.gather(MPI.Get_processor_name(), root=0)
        self.coordinator = (
            Coordinator(self.size, sets.members.get, config.check_order, hosts)
            if self.rank == 0
            else None
        )
        self.check_order = config.check_order  # then the response cache is bypassed
        self.executor = MPIExecutor(
            self._pending.get,
            self._finish,
            sets,
            router,
            self._finish_keys,
            hierarchical,
            self.limit if self.limit.seconds else None,
        )
        self.tuning = tuning  # autotune's link, or None: rank 0's setting comes in the status
        self._execution = Execution(
            self.executor,
            self.bits,
            config.fusion_threshold,
            router,
            timeline,
            tuning,
            self._control,
        )
        self._stall = _stall_clock(config, self.limit, self.size)
        self._stall_wanted = False
        self._stacks = WaitingStacks(self.rank)  # where waiting threads are, at a stall
        self._stop_reason = ""
        self.cycles = 0
        self.doorbell = Doorbell(self.comm)
        self._status = StatusExchange(self.comm, self.limit)
        self._set_control = SetControl(
            sets, self.bits, self.executor, self.rank, self._pending, self._fail, self._finish
        )
        cycle_time = config.cycle_time_ms / 1000.0
        self.driver = Driver(
            self,
            cycle_time,
            start_delay=cycle_time if overlap else max(cycle_time, _LAZY_START),
            step_limit=self.limit.seconds,
            core=core,
            spare_core=overlap,
        )
        self.driver.start()

    def _set_timeline(self, timeline) -> None:
        self._execution.timeline = timeline

    timeline = property(
        lambda self: self._execution.timeline,
        _set_timeline,
        doc="The Timeline being recorded, or None (start_timeline() sets it).",
    )

    # ============================================================ caller side
    def submit(self, entry: Entry, wake: bool = True):
        """Queue *entry*; ValueError if its name is already in flight on this rank.

        *wake*: rouse the engine thread now (an asynchronous caller; a caller
        about to wait on the handle passes False and drives the engine).  Without
        overlap only where its next look comes later than its start delay
        (:meth:`~hvdlite.engine.driver.Driver.nudge`): the waiting caller
        usually drives the work before that."""
        entry.handle.engine = self
        self.inbox.put(entry)
        if wake:
            (self.driver.wake if self.overlap else self.driver.nudge)()
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
        if self.inbox or self.driver.state is Phase.DRAINING or self._stall_wanted:
            # A peer's ring already wakes every rank; ours would add N - 1 messages.
            if not self.doorbell.heard():
                self.doorbell.ring()
            return True
        return self.doorbell.heard()

    def fail(self, exc: BaseException) -> None:
        # A wait that ran out is an answer about the job: its message says it all.
        self._stop_reason = (
            str(exc)
            if isinstance(exc, CollectiveTimeoutError)
            else f"hvdlite engine failed on rank {self.rank}: {exc!r}"
        )
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
        self._stop_reason = _interrupted_message(exc, self.rank, self.size)
        self._fail_everything(self._stop_reason)

    def teardown(self, orderly: bool) -> None:
        self._fail_everything(self.stop_message())
        if self.tuning is not None:
            self.tuning.close()
        if orderly:
            self.executor.close()
        self.doorbell.close()
        with contextlib.suppress(MPI.Exception):
            self.comm.Free()

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
        stopping_here = bool(flags & Flag.SHUTDOWN)
        if self._joined or not self._execution.stage():
            flags |= Flag.UNSTAGED
        status = self._status.exchange(
            flags,
            self.bits,
            self._joined,
            after_wait,
            self.doorbell.rang,
            self.tuning,
            self.driver.is_engine_thread(),
        )
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
        # Some rank joined: the coordinator negotiates everything, by this cycle's global
        # flag (not at admission, maybe a cycle apart on each rank); any_hit is global.
        unhit = self._some_joined and bool(status.any_hit)
        if self._some_joined:
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
                self._execution.run([bits.cache.get(bit) for bit in ready_bits] + responses)
            else:
                # Every rank staged the plan of its own waiting bits (no UNSTAGED),
                # and every waiting bit is ready: so each staged the plan now due.
                staged = not flags & Flag.UNSTAGED and ready == status.any_hit
                self._execution.run_cached(ready, ready_bits, staged)
        elif responses:
            self._execution.run(responses)
        for response in responses:
            if response.status == RESPONSE_OK and response.params.kind in CACHEABLE:
                evicted = bits.put(response, self.sets.members.get(response.key[0], ()))
                if evicted is not None:
                    self._uncached.append(evicted)
        if flags & Flag.SHUTDOWN:
            if not stopping_here and not self._stop_reason:
                self._stop_reason = _PEER_SHUTDOWN_MESSAGE
            return True, True
        # Only globally known facts decide progress, so every rank waits (or not)
        # together: see "Another cycle" in the module docstring.
        ran = self.overlap_anywhere and (bool(ready) or bool(responses))
        return bool(flags & (Flag.INVALID | Flag.STALL)) or joined_changed or unhit or ran, False

    def _admit(self, entry: Entry) -> None:
        params = entry.params
        if params.kind == _JOIN and params == LEAVE_PARAMS:
            self._leave_join(entry)
            return
        self._pending[entry.key] = entry
        if params.set_id not in self.sets.members:
            self._fail(
                entry,
                f"process set {params.set_id} of {params.name!r} is not "
                "registered (was it removed?)",
            )
            return
        if params.kind == _JOIN:
            self._joined = True
        if self.check_order or params.kind not in CACHEABLE or not self.bits.admit(entry):
            self._uncached.append(entry)

    def _leave_join(self, leave: Entry) -> None:
        """The caller left join() before it returned: fail the join here and, where
        its request went out, have the coordinator stop counting this rank as joined."""
        self.inbox.release((leave.key,))
        leave.handle.set_result(None)  # nobody waits on it
        join = self._pending.get(JOIN_KEY)
        if join is None:  # it completed (or failed) before the caller left
            return
        sent = join.sent
        self._fail(
            join,
            "join() was left before every rank had joined; this rank takes "
            "part in collectives again.",
        )
        if sent:
            self._uncached.append(leave)

    def _flags(self, new: bool) -> int:
        stall = self._stall_wanted or self._stall.due(self._pending)
        self._stall_wanted = False
        return (
            (Flag.NEW if new else 0)
            | (Flag.UNCACHED if self._uncached else 0)
            | (Flag.SHUTDOWN if self.driver.state is Phase.DRAINING else 0)
            | (Flag.JOINED if self._joined else 0)
            | (Flag.INVALID if self.bits.invalid_mask else 0)
            | (Flag.STALL if stall else 0)
        )

    def _negotiate(self, stall: bool) -> list[Response]:
        uncached, self._uncached = self._uncached, []
        return negotiate(
            self.comm,
            uncached,
            self._pending,
            self.coordinator,
            stall,
            self._stall,
            self.timeline,
            self._stacks,
        )

    # ---------------------------------------------------------------- execution
    def _control(self, response: Response) -> None:
        """An error response, or one of a kind without tensors (join, process sets)."""
        if response.status == RESPONSE_ERROR:
            entry = self._pending.get(response.key)
            if entry is not None:
                self._fail(
                    entry,
                    response.error,
                    MismatchError if response.value == MISMATCH else HorovodInternalError,
                )
        elif response.params.kind == _JOIN:
            self._joined = False
            entry = self._pending.get(response.key)
            if entry is not None:
                self._finish(entry, response.value)
        elif response.params.kind == Kind.ADD_PROCESS_SET:
            self._set_control.add(response)
        else:
            self._set_control.remove(response)

    def _apply_setting(self, setting) -> None:
        """Autotune: run with *setting* from this cycle on (every rank, same cycle)."""
        self._execution.apply_setting(setting)
        cycle_time = setting.cycle_time_ms / 1000.0
        self.driver.set_cycle_time(
            cycle_time, cycle_time if self.overlap else max(cycle_time, _LAZY_START)
        )

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
