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

When the engine waits instead of cycling, and what a cycle's progress means for
that, is in :mod:`hvdlite.engine.driver` ("Idle cost", "Another cycle").
"""

from __future__ import annotations

import contextlib

from mpi4py import MPI

from .cache_bits import CacheBits
from .doorbell import Doorbell
from .driver import Driver, Phase
from .executor import MPIExecutor
from .execution import Execution
from .in_flight import InFlight
from .stop_reasons import StopReason, stall_clock
from .messages import Response
from .response_cache import ResponseCache
from .negotiation import Negotiator
from .set_control import SetControl
from .status import Flag
from .status_exchange import StatusExchange
from .submissions import Entry, Inbox
from .runtime import abort_job
from .wait_limit import WaitLimit

__all__ = ["Engine"]

#: Without overlap, the engine thread starts negotiating asynchronous work itself
#: after this many seconds, so work that nobody waits on still completes.
_LAZY_START = 0.02


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
        self.bits = CacheBits(ResponseCache(config.cache_capacity), self.rank)
        self.flight = flight = InFlight(self.inbox, self.bits, sets, config.check_order)
        flight.timeline = timeline  # the engine's Timeline (see the timeline property)
        self.negotiator = Negotiator(
            self.comm,
            sets.members.get,
            config.check_order,
            stall_clock(config, self.limit, self.size),
        )
        self.coordinator = self.negotiator.coordinator  # rank 0's, None elsewhere
        self.tuning = tuning  # autotune's link, or None: rank 0's setting comes in the status
        self._execution = Execution(
            MPIExecutor(
                flight.pending.get,
                flight.finish,
                sets,
                router,
                flight.finish_keys,
                hierarchical,
                self.limit if self.limit.seconds else None,
            ),
            self.bits,
            config.fusion_threshold,
            router,
            timeline,
            tuning,
            flight.control,
        )
        self.executor = self._execution.executor
        self._stop = StopReason(self.rank, self.size)
        self.cycles = 0
        self.doorbell = Doorbell(self.comm)
        self._status = StatusExchange(self.comm, self.limit)
        flight.set_control = SetControl(
            sets, self.bits, self.executor, self.rank, flight.pending, flight.fail, flight.finish
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
        self._execution.timeline = self.flight.timeline = timeline

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
        return self._stop.message()

    # ================================================= the Loop of the driver
    def oldest_queued(self) -> float | None:
        return self.inbox.oldest()

    def busy(self) -> bool:
        return bool(self.flight.pending) or bool(self.inbox)

    def work_arrived(self) -> bool:
        """While waiting: local work (then ring every peer) or a peer's doorbell?"""
        self.limit.check_pending(self.flight.pending)
        stall = self.negotiator.want_stall_check(self.flight.pending)
        if self.inbox or self.driver.state is Phase.DRAINING or stall:
            # A peer's ring already wakes every rank; ours would add N - 1 messages.
            if not self.doorbell.heard():
                self.doorbell.ring()
            return True
        return self.doorbell.heard()

    def fail(self, exc: BaseException) -> None:
        self.flight.fail_everything(self._stop.failed(exc))
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
        self.flight.fail_everything(self._stop.interrupted(exc))

    def teardown(self, orderly: bool) -> None:
        self.flight.fail_everything(self.stop_message())
        if self.tuning is not None:
            self.tuning.close()
        if orderly:
            self.executor.close()
        self.doorbell.close()
        with contextlib.suppress(MPI.Exception):
            self.comm.Free()

    # -------------------------------------------------------------------- cycle
    def cycle(self, after_wait: bool) -> tuple[bool, bool]:
        """One cycle on every rank; returns (progress, stop)."""
        self.cycles += 1
        new = self.inbox.take_all()
        for entry in new:
            self.flight.admit(entry)
        tl = self.timeline
        if tl is not None:
            tl.cycle_began(self.cycles, new)
        stall = self.negotiator.take_stall_check(self.flight.pending)
        flags = self.flight.flags(bool(new), self.driver.state is Phase.DRAINING, stall)
        stopping_here = bool(flags & Flag.SHUTDOWN)
        if self.flight.joined or not self._execution.stage():
            flags |= Flag.UNSTAGED
        status = self._status.exchange(
            flags,
            self.bits,
            self.flight.joined,
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
        if status.invalid:
            self.flight.uncached += self.bits.invalidate(status.invalid)
        ready = status.all_hit & status.any_hit & ~status.invalid
        joined_changed, unhit = self.flight.some_joined(bool(flags & Flag.JOINED), status.any_hit)
        if self.flight.others_joined:
            ready = 0

        responses: list[Response] = []
        if flags & (Flag.UNCACHED | Flag.STALL):
            responses = self.negotiator.negotiate(
                self.flight.take_uncached(),
                self.flight.pending,
                bool(flags & Flag.STALL),
                self.timeline,
            )
        if ready or responses:
            self.driver.ran_work()
            if tl is not None:
                tl.decided()
        # Every rank staged the plan of its own waiting bits (no UNSTAGED), and every
        # waiting bit is ready: so each staged the plan now due.
        staged = not flags & Flag.UNSTAGED and ready == status.any_hit
        self._execution.run_ready(ready, responses, staged)
        self.flight.uncached += self._execution.remember(responses, self.sets.members.get)
        if flags & Flag.SHUTDOWN:
            if not stopping_here:
                self._stop.peer_shut_down()
            return True, True
        # Only globally known facts decide progress, so every rank waits (or not)
        # together: see "Another cycle" in hvdlite.engine.driver's docstring.
        ran = self.overlap_anywhere and (bool(ready) or bool(responses))
        return bool(flags & (Flag.INVALID | Flag.STALL)) or joined_changed or unhit or ran, False

    def _apply_setting(self, setting) -> None:
        """Autotune: run with *setting* from this cycle on (every rank, same cycle)."""
        self._execution.apply_setting(setting)
        cycle_time = setting.cycle_time_ms / 1000.0
        self.driver.set_cycle_time(
            cycle_time, cycle_time if self.overlap else max(cycle_time, _LAZY_START)
        )
