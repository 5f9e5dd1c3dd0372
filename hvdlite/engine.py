"""The engine: one background thread per process that negotiates and runs collectives.

Framework threads call :meth:`Engine.submit`; the engine thread runs *cycles*.
A cycle, on every rank at once over the engine's private copy of the world
communicator:

1. drain newly submitted entries; look each up in the response cache
   (hit: set its bit; changed parameters: mark the bit invalid; miss: queue a
   request for the coordinator);
2. one non-blocking bitwise-AND allreduce of a small status vector: OR-flags
   (stored inverted), the AND and OR of cache bits, invalidations, and, right
   after a wait, which ranks rang the doorbell;
3. if any rank has requests (or a stall check is due): gather them to rank 0,
   whose :class:`~hvdlite.coordinator.Coordinator` answers with a response
   list that is broadcast;
4. run cached responses that every rank is ready for, then the coordinator's
   responses, fused into batches (identical on every rank); complete handles.

All process sets negotiate through this one global cycle, and every rank runs
the same responses in the same order (skipping sets it is not in), so the
blocking data collectives of different sets can never deadlock each other.

Idle cost: after a cycle that needs no follow-up anywhere (work that is not
ready on every rank needs none: the rank that completes it will submit), every
rank stops cycling and *waits*: it sleeps on its local submission event and
polls a posted doorbell receive with an interval that grows with the time
already waited (for a caller blocked on a handle from 50 µs up to 5 ms, for
the engine thread from the cycle time up to 20 ms).  The first rank with new
work sends a one-byte doorbell to every other rank and cycling resumes.  A training step
that submits its gradients in one burst therefore costs one cycle.  No MPI
call spins for long while a peer is slow: the status allreduce is non-blocking,
tested in a loop that yields the core for a few milliseconds at most, then
with sleeps that grow.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import traceback

import numpy as np
from mpi4py import MPI

from .coordinator import Coordinator
from .exceptions import HorovodInternalError
from .executor import MPIExecutor
from .fusion import plan_batches
from .handles import Handle
from .messages import (
    CACHEABLE, RESPONSE_ERROR, RESPONSE_OK, Kind, Params, Response,
)
from .response_cache import HIT, INVALID, ResponseCache, set_bits

__all__ = ["Engine", "Entry"]

log = logging.getLogger("hvdlite")

# OR-flags of the status vector.
_NEW = 1  # a rank drained new entries this cycle
_UNCACHED = 2  # a rank has requests for the coordinator
_SHUTDOWN = 4  # a rank asked to shut down
_JOINED = 8  # a rank has joined: everything goes through the coordinator
_STALL = 16  # a rank wants a stall check
_INVALID = 32  # a rank saw changed parameters under a cached name

_JOIN = int(Kind.JOIN)
_DOORBELL_TAG = 77
#: Without overlap, the engine thread starts negotiating asynchronous work itself
#: after this many seconds, so work that nobody waits on still completes.
_LAZY_START = 0.02
_WORD = 64
_ALL_ONES = (1 << 64) - 1


class Entry:
    """One submitted collective (a single tensor or a group), owned by the engine thread."""

    __slots__ = ("params", "key", "inputs", "outputs", "handle", "submitted", "grouped",
                 "splits", "payload", "bit", "sent")

    def __init__(self, params: Params, inputs, outputs, handle: Handle, grouped=False,
                 splits=None, payload=None):
        self.params = params
        self.key = (params.set_id, params.name)  # params.key, computed once
        self.inputs = inputs
        self.outputs = outputs
        self.handle = handle
        self.submitted = time.monotonic()
        self.grouped = grouped
        self.splits = splits
        self.payload = payload
        self.bit = -1
        self.sent = False

    def result(self, value):
        """What the handle returns: *value*, or (None) the outputs; a single tensor's
        entry returns its one output, not a sequence."""
        if value is None:
            value = self.outputs
            if not self.grouped:
                return value[0] if value else None
        elif isinstance(value, list) and not self.grouped:
            return value[0] if value else None
        return value


class Engine:
    """The per-process background engine (see the module docstring for the cycle)."""

    def __init__(self, world, config, sets, timeline=None, hierarchical=None, overlap=True):
        self.config = config
        self.sets = sets
        self.comm = world.Dup()  # control traffic only: status, gather/bcast, doorbells
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.timeline = timeline
        self._queue: collections.deque = collections.deque()
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._inflight: set = set()
        self._stopped = False
        self._stop_reason = ""
        self._shutdown_requested = False

        # Engine-thread state.
        self._pending: dict[tuple, Entry] = {}
        self._hits: dict[int, Entry] = {}  # bit -> entry waiting on it
        self._hit_mask = 0
        self._foreign_mask = 0
        self._invalid_mask = 0
        self._uncached: list[Entry] = []
        self._joined = False
        self._some_joined = False
        self.cache = ResponseCache(config.cache_capacity)
        self.coordinator = Coordinator(self.size, sets.members.get) if self.rank == 0 else None
        self.executor = MPIExecutor(self._pending.get, self._finish, self._comm_of, self.rank,
                                    self._finish_keys)
        self.executor.hierarchical = hierarchical
        self.executor.shared_memory = not config.shm_allreduce_disable
        self._orderly_stop = False  # every rank agreed to stop (collective clean-up is safe)
        self._threshold = config.fusion_threshold
        self._last_plan: tuple = (None, [])  # ((ready bits, cache version), batches)
        self._cycle_time = config.cycle_time_ms / 1000.0
        self.overlap = overlap
        # How long the engine thread lets asynchronous work gather before it
        # negotiates it itself (a caller that waits on a handle starts at once).
        self._start_delay = self._cycle_time if overlap else max(self._cycle_time,
                                                                 _LAZY_START)
        self._stall_warn = config.stall_check_time_seconds
        self._stall_fail = config.stall_shutdown_time_seconds
        self._stall_enabled = not config.stall_check_disable and self.size > 1
        self._next_stall_check = time.monotonic() + min(self._stall_warn, 5.0)
        self._doorbell_buf = np.zeros(1, dtype=np.uint8)
        self._doorbell_out = np.ones(1, dtype=np.uint8)  # what a ring sends (never written)
        self._peers = [r for r in range(self.size) if r != self.rank]
        self._doorbell_req = None
        self._doorbells_seen = 0
        self._rang = False
        self._waited = False
        self._stall_wanted = False
        self._waiting = False
        self._wait_start = time.monotonic()
        self._finished = False
        self._driver = threading.Lock()
        self._callers = 0  # threads inside drive()
        self._owner = None  # thread taking a step right now
        self.cycles = 0
        self._doorbell_req = self.comm.Irecv(self._doorbell_buf, MPI.ANY_SOURCE, _DOORBELL_TAG)
        self._thread = threading.Thread(target=self._main, name="hvdlite-engine", daemon=True)
        self._thread.start()

    # ============================================================ caller side
    def submit(self, entry: Entry, wake: bool = True) -> Handle:
        """Queue *entry*; ValueError if its name is already in flight on this rank.

        *wake*: rouse the engine thread now (an asynchronous caller); a caller
        that is about to wait on the handle passes False and drives the engine.
        Without overlap nothing rouses it: the submitting thread is about to run
        on the same core, and the engine thread's next look (at most 20 ms away)
        finds the work anyway, which a waiting caller usually has driven by then.
        """
        key = entry.key
        entry.handle._engine = self
        with self._lock:
            if self._stopped:
                raise HorovodInternalError(self._stop_message())
            if key in self._inflight:
                raise ValueError(
                    f"A collective named {key[1]!r} is already in flight on this rank; "
                    "names must be unique until their handle completes (wait for it with "
                    "synchronize(), or pass a different name=)."
                )
            self._inflight.add(key)
            self._queue.append(entry)
        if wake and self.overlap and not self._event.is_set():
            self._event.set()
        return entry.handle

    def request_shutdown(self, timeout: float | None = 60.0) -> bool:
        """Ask every rank's engine to stop; wait for ours. True if it stopped in time."""
        self._shutdown_requested = True
        self._event.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _stop_message(self) -> str:
        return self._stop_reason or (
            "hvdlite has been shut down. This was caused by shutdown() on this or another "
            "rank, or an exception on another rank; call hvd.init() again to restart."
        )

    # ================================================================ driving
    # The engine advances in *steps* (one cycle, or one check while waiting), each
    # taken under ``_driver``.  The engine thread takes steps whenever it can; a
    # caller blocked in ``Handle.result()`` takes them itself when the lock is
    # free, which saves two thread hand-offs (~100 us in CPython) per collective.

    def _main(self) -> None:
        while not self._finished:
            if self._callers:
                # A caller is driving; stay out of its way until it leaves.
                self._event.wait(0.002)
                self._event.clear()
                continue
            if self._waiting and self._queue:
                # Local work is queued: give the framework time to submit the rest
                # of its burst, so it is negotiated and fused as one batch (without
                # overlap, time enough for a caller to wait and drive it instead).
                try:
                    left = self._queue[0].submitted + self._start_delay - time.monotonic()
                except IndexError:  # a caller took it meanwhile
                    left = 0.0
                if left > 0:
                    time.sleep(left)
                if self._callers:
                    continue
            with self._driver:
                if not self._finished:
                    self._guarded_step()
            if self._waiting and not self._finished:
                self._event.wait(self._poll_interval(background=True))
        with self._driver:
            self._teardown()

    def drive(self, handle: Handle, timeout: float | None = None) -> None:
        """Advance the engine from the calling thread until *handle* is done (or *timeout*)."""
        if self._owner == threading.get_ident():
            raise RuntimeError(
                "hvdlite: a handle was waited on inside a done-callback of another handle; "
                "that would deadlock the engine. Wait on it after the callback returns."
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._callers += 1
        try:
            while not handle.done() and not self._finished:
                with self._driver:
                    if self._finished:
                        break
                    self._guarded_step()
                if handle.done() or not self._waiting:
                    continue
                pause = self._poll_interval()
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    pause = min(pause, left)
                condition = handle._condition
                with condition:
                    if not handle.done():
                        condition.wait(pause)
        finally:
            with self._lock:
                self._callers -= 1
            # Hand the engine back to its thread if other entries are still pending.
            if self._pending or self._queue or self._finished:
                self._event.set()

    def _guarded_step(self) -> None:
        self._owner = threading.get_ident()
        try:
            if self._step():
                self._orderly_stop = True
                self._finished = True
                self._event.set()
        except BaseException as exc:  # noqa: BLE001 - the engine must never die silently
            text = "".join(traceback.format_exception(exc))
            log.error("hvdlite engine failed on rank %d:\n%s", self.rank, text)
            self._stop_reason = f"hvdlite engine failed on rank {self.rank}: {exc!r}"
            self._finished = True
            self._fail_everything(self._stop_reason)
            if self.size > 1:
                # Peers would wait for this rank forever: end the job instead of hanging it.
                MPI.COMM_WORLD.Abort(1)
        finally:
            self._owner = None

    def _step(self) -> bool:
        """One cycle, or one look for work while waiting. True when the engine must stop."""
        if self._waiting:
            if not self._work_arrived():
                return False
            self._waiting = False
            self._waited = True
        progress, stop = self._cycle()
        if stop:
            return True
        if not progress:
            self._waiting = True
            self._wait_start = time.monotonic()
        return False

    def _poll_interval(self, background: bool = False) -> float:
        """How long to sleep between looks for a peer's doorbell while waiting.

        A caller blocked on a handle has nothing else to do: it looks again
        after 50 us, growing with the time already waited (10 %) to 5 ms.

        The engine thread wakes for this rank's own submissions anyway, so its
        looks only serve peers' doorbells, and in lockstep training answering
        them early helps nobody: a peer that is ahead needs this rank's matching
        submission, which rings by itself.  Early answers only add a cycle in
        which nothing is ready, and every wake-up takes the core from the
        framework's compute running beside it (measured: polling every 1 ms cost
        a Keras step 9 %).  So these looks start at the cycle time and then
        double the time waited, up to 20 ms; they still carry the work of sets
        this rank is not in, a joined rank's part, and stall checks.
        """
        waited = time.monotonic() - self._wait_start
        if background:
            return min(0.02, max(self._cycle_time, waited))
        return min(0.005, max(0.00005, waited * 0.1))

    def _teardown(self) -> None:
        reason = self._stop_message()
        self._fail_everything(reason)
        if self._orderly_stop:
            self.executor.close()
        req = self._doorbell_req
        if req is not None:
            try:
                req.Cancel()
                req.Wait()
            except MPI.Exception:
                pass
        try:
            self.comm.Free()
        except MPI.Exception:
            pass

    def _fail_everything(self, reason: str) -> None:
        with self._lock:
            self._stopped = True
            queued = list(self._queue)
            self._queue.clear()
        for entry in queued + list(self._pending.values()):
            self._fail(entry, reason)

    # ------------------------------------------------------------------ waiting
    def _work_arrived(self) -> bool:
        """While waiting: local work (then ring every peer) or a peer's doorbell?"""
        self._event.clear()
        if self._stall_due():
            self._stall_wanted = True
        if self._queue or self._shutdown_requested or self._stall_wanted:
            self._ring()
            return True
        if self._doorbell_req.Test():
            self._doorbells_seen += 1
            self._doorbell_req = self.comm.Irecv(self._doorbell_buf, MPI.ANY_SOURCE,
                                                 _DOORBELL_TAG)
            return True
        return False

    def _ring(self) -> None:
        if self._peers:
            MPI.Request.Waitall([self.comm.Isend(self._doorbell_out, dest=r, tag=_DOORBELL_TAG)
                                 for r in self._peers])
        self._rang = True

    def _drain_doorbells(self, wakers: int) -> None:
        """Receive exactly the doorbells rung before this cycle (each rank rang at most one)."""
        expected = wakers - (1 if self._rang else 0)
        while self._doorbells_seen < expected:
            self._doorbell_req.Wait()
            self._doorbells_seen += 1
            self._doorbell_req = self.comm.Irecv(self._doorbell_buf, MPI.ANY_SOURCE,
                                                 _DOORBELL_TAG)
        self._doorbells_seen = 0
        self._rang = False

    # Every rank applies the same puts and erases (driven by global facts only),
    # so bits agree everywhere; _foreign_mask marks bits of sets this rank is not in.
    def _cache_put(self, response: Response) -> None:
        evicted = self.cache.put(response)
        if evicted is not None:
            self._unhit(evicted, to_coordinator=True)
            self._foreign_mask &= ~(1 << evicted)
        bit = self.cache.bit_of(response.key)
        if bit is not None:
            members = self.sets.members.get(response.key[0], ())
            if self.rank in members:
                self._foreign_mask &= ~(1 << bit)
            else:
                self._foreign_mask |= 1 << bit

    def _cache_erase(self, bit: int) -> None:
        self.cache.erase(bit)
        self._foreign_mask &= ~(1 << bit)

    def _stall_due(self) -> bool:
        if not self._stall_enabled or not self._pending:
            return False
        now = time.monotonic()
        if now < self._next_stall_check:
            return False
        self._next_stall_check = now + max(1.0, min(self._stall_warn, 10.0) / 2)
        oldest = min(e.submitted for e in self._pending.values())
        return now - oldest >= self._stall_warn

    # -------------------------------------------------------------------- cycle
    def _admit(self, entry: Entry) -> None:
        params = entry.params
        self._pending[entry.key] = entry
        if params.set_id not in self.sets.members:
            self._fail(entry, f"process set {params.set_id} of {params.name!r} is not "
                              "registered (was it removed?)")
            return
        if params.kind == _JOIN:
            self._joined = True
        if self._some_joined or params.kind not in CACHEABLE:
            self._uncached.append(entry)
            return
        state, bit = self.cache.lookup(params, entry.key)
        if state == HIT:
            entry.bit = bit
            self._hits[bit] = entry
            self._hit_mask |= 1 << bit
        else:
            if state == INVALID:
                self._invalid_mask |= 1 << bit
            self._uncached.append(entry)

    def _unhit(self, bit: int, to_coordinator: bool) -> None:
        entry = self._hits.pop(bit, None)
        self._hit_mask &= ~(1 << bit)
        if entry is not None:
            entry.bit = -1
            if to_coordinator:
                self._uncached.append(entry)

    def _cycle(self) -> tuple[bool, bool]:
        self.cycles += 1
        self._event.clear()
        new = []
        queue = self._queue
        while queue:
            new.append(queue.popleft())
        for entry in new:
            self._admit(entry)

        flags = 0
        if new:
            flags |= _NEW
        if self._uncached:
            flags |= _UNCACHED
        if self._shutdown_requested:
            flags |= _SHUTDOWN
        if self._joined:
            flags |= _JOINED
        if self._invalid_mask:
            flags |= _INVALID
        if self._stall_wanted or self._stall_due():
            flags |= _STALL
            self._stall_wanted = False

        # The status vector as one little-endian integer of 64-bit words:
        # [~flags][AND of hits][~OR of hits][~invalid][~doorbell ringers (after a wait)]
        nwords = (self.cache.num_bits + _WORD - 1) // _WORD
        wake_words = (self.size + _WORD - 1) // _WORD if self._waited else 0
        width = nwords * _WORD
        full = (1 << width) - 1
        # Bits of process sets this rank is not in count as set, so the AND runs
        # over the members only (any_hit still needs a member's bit).
        hit_and = full if self._joined else self._hit_mask | self._foreign_mask
        hit_or = 0 if self._joined else self._hit_mask
        value = (~flags & _ALL_ONES) | (hit_and << _WORD) \
            | ((~hit_or & full) << (_WORD + width)) \
            | ((~self._invalid_mask & full) << (_WORD + 2 * width))
        if wake_words:
            wake_full = (1 << (wake_words * _WORD)) - 1
            mine = (1 << self.rank) if self._rang else 0
            value |= (~mine & wake_full) << (_WORD + 3 * width)
        if self.size > 1:
            nbytes = 8 * (1 + 3 * nwords + wake_words)
            buf = bytearray(value.to_bytes(nbytes, "little"))
            self._allreduce_status(np.frombuffer(buf, dtype="<u8"))
            value = int.from_bytes(buf, "little")

        flags = ~value & _ALL_ONES
        if wake_words:
            wakers = bin(~(value >> (_WORD + 3 * width)) & wake_full).count("1")
            self._drain_doorbells(wakers)
            self._waited = False
        ready = 0
        if nwords:
            all_hit = (value >> _WORD) & full
            any_hit = ~(value >> (_WORD + width)) & full
            invalid = ~(value >> (_WORD + 2 * width)) & full
            self._invalid_mask = 0
            if invalid:
                for bit in set_bits(invalid):
                    self._unhit(bit, to_coordinator=True)
                    self._cache_erase(bit)
            ready = all_hit & any_hit & ~invalid
        joined_changed = self._some_joined != bool(flags & _JOINED)
        self._some_joined = bool(flags & _JOINED)
        if self._some_joined:
            # While a rank is joined everything is negotiated by the coordinator
            # (decided from the global flag, so every rank drops the same bits).
            for bit in set_bits(self._hit_mask):
                self._unhit(bit, to_coordinator=True)
            ready = 0

        responses: list[Response] = []
        if flags & (_UNCACHED | _STALL):
            responses = self._negotiate(bool(flags & _STALL))
        if ready:
            bits = set_bits(ready)
            self.cache.touch_all(bits)
            hits = self._hits
            for bit in bits:
                entry = hits.pop(bit, None)
                if entry is not None:
                    entry.bit = -1
            self._hit_mask &= ~ready
            if responses:
                self._execute([self.cache.get(bit) for bit in bits] + responses)
            else:
                self._execute_cached(ready, bits)
        elif responses:
            self._execute(responses)
        for response in responses:
            if response.status == RESPONSE_OK and response.params.kind in CACHEABLE:
                self._cache_put(response)
        if flags & _SHUTDOWN:
            return True, True
        # Only globally known facts decide progress, so every rank waits (or not) together.
        # Work that was submitted but is not ready everywhere needs no further cycle:
        # the rank that completes it submits later and rings the doorbell.  Another
        # cycle is due only when this one moved entries back to the coordinator
        # (invalidated cache bits, a rank joining or leaving) or ran a stall check.
        progress = bool(flags & (_INVALID | _STALL)) or joined_changed
        return progress, False

    def _allreduce_status(self, status: np.ndarray) -> None:
        """Non-blocking AND-allreduce of the status vector, tested with a back-off.

        Peers in step arrive within microseconds, so the wait first tests in a
        loop that yields the core (``sched_yield``) between tests: for up to 5 ms
        when the waiter is a caller blocked on a handle (its thread has nothing
        else to do, and a peer that is late to this allreduce would be late to
        the data collective that follows too), for 200 us on the engine thread
        (the framework computes beside it).  After that it sleeps between tests
        (20 us growing to 1 ms), so a slow peer never costs this rank a core.
        """
        req = self.comm.Iallreduce(MPI.IN_PLACE, status, MPI.BAND)
        if req.Test():
            return
        clock = time.perf_counter
        spin = 0.005 if threading.get_ident() != self._thread.ident else 0.0002
        spin_until = clock() + spin
        while clock() < spin_until:
            if req.Test():
                return
            os.sched_yield()
        pause = 0.00002
        while not req.Test():
            time.sleep(pause)
            pause = min(0.001, pause * 1.5)

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
            responses = self.coordinator.process(
                (rank, item[0]) for rank, item in enumerate(gathered))
            if stall:
                report, errors = self.coordinator.stall_report(
                    {r: item[1] or [] for r, item in enumerate(gathered)},
                    self._stall_warn, self._stall_fail)
                if report:
                    log.warning(report)
                responses += errors
        return self.comm.bcast(responses, root=0)

    # ---------------------------------------------------------------- execution
    def _execute_cached(self, ready: int, bits: list[int]) -> None:
        """Run the cached responses of *bits* (the bits of *ready*, ascending).

        A training loop readies the same bits every step, so the fusion plan of
        the last all-cached cycle is kept while the cache is unchanged.
        """
        key = (ready, self.cache.version)
        if self._last_plan[0] != key:
            responses = [self.cache.get(bit) for bit in bits]
            self._last_plan = (key, plan_batches(responses, self._threshold))
        self._run_batches(self._last_plan[1])

    def _execute(self, responses: list[Response]) -> None:
        """Run *responses*, fused into batches."""
        self._run_batches(plan_batches(responses, self._threshold))

    def _run_batches(self, batches: list[list[Response]]) -> None:
        for batch in batches:
            first = batch[0]
            if first.status == RESPONSE_ERROR:
                entry = self._pending.get(first.key)
                if entry is not None:
                    self._fail(entry, first.error)
                continue
            kind = first.params.kind
            if kind == Kind.JOIN:
                self._finish_join(first)
            elif kind == Kind.ADD_PROCESS_SET:
                self._add_process_set(first)
            elif kind == Kind.REMOVE_PROCESS_SET:
                self._remove_process_set(first)
            else:
                timeline = self.timeline
                if timeline is not None:
                    timeline.start_batch(batch)
                self.executor.run_batch(batch)
                if timeline is not None:
                    timeline.end_batch(batch)

    def _finish_join(self, response: Response) -> None:
        self._joined = False
        entry = self._pending.get(response.key)
        if entry is not None:
            self._finish(entry, response.value)

    def _add_process_set(self, response: Response) -> None:
        ranks = list(response.params.extra)
        color = 0 if self.rank in ranks else MPI.UNDEFINED
        comm = self.sets.get(0).comm.Split(color, self.rank)
        entry = self._pending.get(response.key)
        existing = self.sets.find_ranks(ranks)
        if existing is not None:
            if comm != MPI.COMM_NULL:
                comm.Free()
            if entry is not None:
                self._fail(entry, f"a process set with ranks {ranks} already exists "
                                  f"(id {existing.process_set_id}).")
            return
        from .process_sets import ProcessSet

        ps = entry.payload if entry is not None else ProcessSet(ranks)
        self.sets.register(ps, ranks, None if comm == MPI.COMM_NULL else comm)
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
        for bit in self.cache.erase_set(set_id):
            self._unhit(bit, to_coordinator=False)
            self._foreign_mask &= ~(1 << bit)
        for key, other in list(self._pending.items()):
            if key[0] == set_id:
                self._fail(other, f"process set {set_id} was removed while {key[1]!r} was "
                                  "pending.")
        if self.rank in self.sets.members.get(set_id, ()):
            self.executor.forget_set(set_id)
        ps = self.sets.remove(set_id)
        if entry is not None:
            self._finish(entry, ps)

    def _comm_of(self, set_id: int):
        ps = self.sets.get(set_id)
        return ps.comm, ps.ranks

    # --------------------------------------------------------------- completion
    def _release(self, entry: Entry) -> None:
        key = entry.key
        self._pending.pop(key, None)
        with self._lock:
            self._inflight.discard(key)

    def _finish(self, entry: Entry, value) -> None:
        self._release(entry)
        if entry.params.kind == _JOIN:
            self._joined = False
        entry.handle._complete(entry.result(value))

    def _finish_keys(self, keys) -> None:
        """Finish the local entries of *keys* with their outputs (a batch that ran):
        what _finish does per entry, with the in-flight set locked once."""
        pending = self._pending
        entries = [pending.pop(key) for key in keys if key in pending]
        with self._lock:
            discard = self._inflight.discard
            for entry in entries:
                discard(entry.key)
        for entry in entries:
            entry.handle._complete(entry.result(None))

    def _fail(self, entry: Entry, message: str) -> None:
        self._release(entry)
        if entry.bit >= 0:
            self._hits.pop(entry.bit, None)
            self._hit_mask &= ~(1 << entry.bit)
            entry.bit = -1
        if entry in self._uncached:
            self._uncached.remove(entry)
        entry.handle._complete(exception=HorovodInternalError(message))
