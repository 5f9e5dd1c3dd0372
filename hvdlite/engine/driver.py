"""Who advances the engine, and when: its thread, or a caller that waits.

The engine advances in *steps*: one cycle, or, while it waits for work, one
look for it.  A :class:`Driver` takes steps on the engine's background thread
and lets a caller blocked on a handle take them itself (it holds the step
lock while no other thread does), which saves two thread hand-offs per
collective.  The loop it drives is any object with the :class:`Loop` methods;
the driver knows nothing about MPI, so it is unit-tested with a scripted loop.

Its life is one explicit :class:`Phase`: RUNNING; DRAINING once a stop was
asked for here (cycles go on until every rank agreed to stop); STOPPED when
they agreed, so collective clean-up is safe; FAILED when a step raised.

Nothing leaves the driver unreported: an exception anywhere in the engine
thread fails the loop (:meth:`Loop.fail`), and a ``KeyboardInterrupt`` or
``SystemExit`` that arrives while a caller takes a step stops the loop
(:meth:`Loop.interrupt`) and goes on to that caller.

Idle cost (the engine's cycle, :mod:`hvdlite.engine.cycle`): after a cycle that
needs no follow-up anywhere (work that is not ready on every rank needs none: the
rank that completes it will submit), every rank stops cycling and waits (see
:class:`Driver` for how often it looks); the first rank with new work rings the
:class:`~hvdlite.engine.doorbell.Doorbell` and cycling resumes. A training step that
submits its gradients in one burst therefore costs one cycle, and one doorbell (or,
where some rank's engine thread overlaps the framework's compute, one empty follow-
up cycle, which lets a loop of synchronous calls go on without doorbells). No MPI
call spins for long while a peer is slow: the status allreduce is non-blocking and
tested with a :class:`~hvdlite.util.backoff.Backoff`.

Another cycle: work submitted but not ready everywhere needs no further cycle, since
the rank that completes it submits later and rings the doorbell. Another cycle is
due when this one moved entries back to the coordinator (invalidated cache bits, a
rank joining or leaving), ran a stall check, or ran work while some rank overlaps:
what ran is the same on every rank, and where work just ran more usually follows
(the next synchronous call, the rest of a burst), which then needs no doorbell. A
burst's end costs one empty cycle before the wait. Where no rank overlaps, that
empty cycle would fall to the engine threads in the middle of the framework's next
compute, on cores it needs; there the next work rings the doorbell instead.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
import traceback
from typing import Protocol

from ..exceptions import CollectiveTimeoutError
from ..util.backoff import Backoff

__all__ = ["Driver", "Loop", "Phase"]

log = logging.getLogger("hvdlite")

#: While a caller drives, the engine thread looks this often whether it left.
_CALLER_CHECK = 0.002
#: How often the engine thread looks for a peer's doorbell while waiting: from
#: the cycle time, doubling the time waited, up to 20 ms (it wakes at once for
#: this rank's own submissions; see Engine).  A thread without a core of its own
#: (``spare_core=False``) looks every 20 ms from the start: each look takes the
#: core and the GIL from the framework, and its own work is driven by callers.
_THREAD_CAP = 0.02
#: A thread whose own cycles have run no work for a while (its callers drive
#: every collective, as a training loop that waits on its gradients does) looks
#: less often still: every tenth of the time since one last did, up to 200 ms.
#: On a machine without a spare core each look costs the framework about
#: 0.1 ms of core and cache.  Work queued that no caller is about to drive
#: brings the next look forward (:meth:`Driver.nudge`); a peer's doorbell is
#: heard at the next look, and where the cycle that follows runs work (a
#: collective of a process set this rank is not in, say) the thread looks often
#: again (the loop calls :meth:`Driver.ran_work`).
_QUIET_RATIO = 0.1
_QUIET_CAP = 0.2
#: A caller blocked on a handle has nothing else to do: it looks again after
#: 50 us, growing with the time already waited (10 %), up to 5 ms.
_CALLER_POLL = Backoff(floor=0.00005, cap=0.005, ratio=0.1)


class Phase(enum.Enum):
    RUNNING = "running"
    DRAINING = "draining"  # a stop was asked for on this rank
    STOPPED = "stopped"  # every rank agreed to stop
    FAILED = "failed"  # a step raised; peers may still wait on this rank


class Loop(Protocol):
    """What the driver needs from the engine."""

    def cycle(self, after_wait: bool) -> tuple[bool, bool]:
        """Run one cycle; (progress: another cycle is due, stop: every rank stops)."""

    def work_arrived(self) -> bool:
        """While waiting: is there local work, or did a peer ring?"""

    def oldest_queued(self) -> float | None:
        """Submission time (monotonic) of the oldest queued entry, None if none."""

    def busy(self) -> bool:
        """Anything queued or pending on this rank."""

    def fail(self, exc: BaseException) -> None:
        """A step raised *exc*: fail every handle and end the job if peers would hang."""

    def interrupt(self, exc: BaseException) -> None:
        """A KeyboardInterrupt/SystemExit broke a caller's step: fail every handle."""

    def teardown(self, orderly: bool) -> None:
        """Release what the loop holds (collectively when *orderly*)."""


class Driver:
    """Takes the engine's steps, on its thread or on a waiting caller's."""

    def __init__(
        self,
        loop: Loop,
        cycle_time: float,
        start_delay: float,
        name: str = "hvdlite-engine",
        step_limit: float | None = None,
        core: int | None = None,
        spare_core: bool = True,
    ):
        self.loop = loop
        self.core = core  # the CPU core the engine thread pins itself to, or None
        # A caller that waits longer than this for another thread's step to end
        # takes the step for stuck (HVDLITE_COLLECTIVE_TIMEOUT; None: no limit).
        self.step_limit = step_limit
        self._set_state(Phase.RUNNING)
        self.event = threading.Event()  # rouses the engine thread
        self._spare_core = spare_core
        self._thread_poll = self._poll_backoff(cycle_time)
        # How long the thread lets queued work gather before it starts it itself
        # (a caller that waits on a handle starts at once).
        self._start_delay = start_delay
        self._step_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._callers = 0  # threads inside drive()
        self._owner: int | None = None  # thread taking a step right now
        self.waiting = False
        self._after_wait = False
        self._wait_start = self._thread_worked = time.monotonic()
        self._wakes_at = 0.0  # when the waiting thread looks next (monotonic)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread_id: int | None = None  # the engine thread's, once it runs

    def start(self) -> None:
        self._thread.start()

    def set_cycle_time(self, cycle_time: float, start_delay: float) -> None:
        """A new cycle time (autotune, from inside a step): how often the thread looks
        for a peer's doorbell, and how long it lets a burst gather."""
        self._thread_poll = self._poll_backoff(cycle_time)
        self._start_delay = start_delay

    def _poll_backoff(self, cycle_time: float) -> Backoff:
        first = min(cycle_time, _THREAD_CAP) if self._spare_core else _THREAD_CAP
        return Backoff(floor=first, cap=_THREAD_CAP)

    def _set_state(self, state: Phase) -> None:
        self.state = state
        # A plain attribute, not a property: a waiting caller reads it several
        # times per collective.
        self.finished = state in (Phase.STOPPED, Phase.FAILED)

    def is_engine_thread(self) -> bool:
        return threading.get_ident() == self._thread_id

    def wake(self) -> None:
        if not self.event.is_set():
            self.event.set()

    def ran_work(self) -> None:
        """Called by the loop from inside a cycle that ran work: on the engine
        thread, this keeps its looks frequent (see ``_QUIET_RATIO``)."""
        if self.is_engine_thread():
            self._thread_worked = time.monotonic()

    def nudge(self) -> None:
        """Work was queued that no caller is about to drive (an asynchronous
        submission without overlap): rouse the thread only if its next look is
        later than the start delay, so the work still starts about that soon."""
        if self._wakes_at - time.monotonic() > self._start_delay:
            self.wake()

    def request_stop(self, timeout: float | None) -> bool:
        """Ask for a stop on every rank; wait for this rank's. True if it stopped in time."""
        if self.state is Phase.RUNNING:
            self._set_state(Phase.DRAINING)
        self.event.set()
        if self._thread.ident is None:  # never started: nothing runs to stop
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------- the thread
    def _main(self) -> None:
        self._thread_id = threading.get_ident()
        try:
            if self.core is not None and hasattr(os, "sched_setaffinity"):
                os.sched_setaffinity(0, {self.core})  # Linux: this thread only
            self._run_thread()
        except BaseException as exc:  # noqa: BLE001 - outside a step: still reported
            self._failed(exc)
        with self._step_lock:
            self.loop.teardown(orderly=self.state is Phase.STOPPED)

    def _run_thread(self) -> None:
        loop = self.loop
        while not self.finished:
            if self._callers:
                # A caller is driving; stay out of its way until it leaves.
                self.event.wait(_CALLER_CHECK)
                self.event.clear()
                continue
            if self.waiting:
                oldest = loop.oldest_queued()
                if oldest is not None:
                    # Local work is queued: give the framework time to submit the rest
                    # of its burst, so it is negotiated and fused as one batch.
                    left = oldest + self._start_delay - time.monotonic()
                    if left > 0:
                        time.sleep(left)
                    if self._callers:
                        continue
            with self._step_lock:
                if not self.finished:
                    self._step()
            if self.waiting and not self.finished:
                self.event.wait(self._thread_pause())

    def _thread_pause(self) -> float:
        """How long the waiting thread sleeps before its next look."""
        now = time.monotonic()
        pause = max(
            self._thread_poll.delay(now - self._wait_start),
            min(_QUIET_CAP, (now - self._thread_worked) * _QUIET_RATIO),
        )
        self._wakes_at = now + pause
        return pause

    # ------------------------------------------------------------ a caller
    def drive(self, handle, timeout: float | None = None) -> None:
        """Take steps in the calling thread until *handle* is done (or *timeout*)."""
        if self._owner == threading.get_ident():
            raise RuntimeError(
                "hvdlite: a handle was waited on inside a done-callback of another handle; "
                "that would deadlock the engine. Wait on it after the callback returns."
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._count_lock:
            self._callers += 1
        try:
            while not handle.done() and not self.finished:
                if not self._step_lock.acquire(timeout=self.step_limit or -1):
                    self._failed(
                        CollectiveTimeoutError(
                            f"hvdlite: an engine step has run for more than "
                            f"{self.step_limit:g} s (HVDLITE_COLLECTIVE_TIMEOUT): a peer "
                            "stopped inside a collective"
                        )
                    )
                    break
                try:
                    if self.finished:
                        break
                    self._step()
                finally:
                    self._step_lock.release()
                if handle.done() or not self.waiting:
                    continue
                pause = _CALLER_POLL.delay(time.monotonic() - self._wait_start)
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return
                    pause = min(pause, left)
                handle.wait(pause)
        finally:
            with self._count_lock:
                self._callers -= 1
            # Hand the engine back to its thread if other work is still there.
            if self.finished or self.loop.busy():
                self.event.set()

    # ---------------------------------------------------------------- a step
    def _step(self) -> None:
        """One cycle, or one look for work while waiting (under the step lock)."""
        self._owner = threading.get_ident()
        try:
            if self.event.is_set():  # clear() takes the event's lock even when unset
                self.event.clear()
            if self.waiting:
                if not self.loop.work_arrived():
                    return
                self.waiting = False
                self._after_wait = True
            after_wait, self._after_wait = self._after_wait, False
            progress, stop = self.loop.cycle(after_wait)
            if stop:
                self._set_state(Phase.STOPPED)
                self.event.set()
            elif not progress:
                self.waiting = True
                self._wait_start = time.monotonic()
        except (KeyboardInterrupt, SystemExit) as exc:
            if self.is_engine_thread():  # not a signal: raised by code the engine ran
                self._failed(exc)
                return
            self._set_state(Phase.FAILED)
            self.event.set()
            self.loop.interrupt(exc)
            raise
        except BaseException as exc:  # noqa: BLE001 - the engine must never die silently
            self._failed(exc)
        finally:
            self._owner = None

    def _failed(self, exc: BaseException) -> None:
        """Report *exc*, stop, and let the loop fail its work (and end the job).

        A wait that outlasted ``HVDLITE_COLLECTIVE_TIMEOUT`` is an answer about the
        job, not a bug in the engine: its message alone is an error, where in the
        engine it arose only at debug level."""
        frames = "".join(traceback.format_exception(exc))
        if isinstance(exc, CollectiveTimeoutError):
            log.error("%s", exc)
            log.debug("where the engine noticed it:\n%s", frames)
        else:
            log.error("hvdlite engine failed:\n%s", frames)
        self._set_state(Phase.FAILED)
        self.event.set()
        self.loop.fail(exc)
