"""The engine's driver without MPI: who takes the next step (the engine thread or a
waiting caller), how often a waiting thread looks (the back-off), how it stops, and its
failure paths: wait limits, interrupts, timeouts and what is logged."""

from __future__ import annotations

import logging
import threading

import pytest

from hvdlite.util.backoff import Backoff
from hvdlite.engine.driver import Driver, Phase
from hvdlite.engine.wait_limit import WaitLimit
from hvdlite.exceptions import CollectiveTimeoutError, HorovodInternalError
from hvdlite.handles import Handle

pytestmark = pytest.mark.timeout(60)


def test_backoff_grows_with_the_time_waited_within_its_bounds():
    policy = Backoff(floor=0.001, cap=0.02, ratio=0.5)
    assert policy.delay(0.0) == 0.001
    assert policy.delay(0.01) == 0.005
    assert policy.delay(10.0) == 0.02
    with pytest.raises(ValueError):
        Backoff(floor=0.0, cap=1.0)


def test_backoff_spins_then_sleeps_until_the_test_passes():
    now = [0.0]
    sleeps, yields = [], []
    looks = iter([False] * 7 + [True])

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    def yield_core():
        yields.append(1)
        now[0] += 0.001

    Backoff(floor=0.002, cap=0.004, ratio=1.0, spin=0.003).wait_for(
        lambda: next(looks), clock=lambda: now[0], sleep=sleep, yield_core=yield_core
    )
    assert len(yields) == 3  # the spin phase: 3 ms of yields
    assert sleeps == [0.002, 0.002, 0.004]  # then sleeps that grow to the cap


def test_a_bounded_wait_gives_up_after_its_timeout():
    now = [0.0]

    def sleep(seconds):
        now[0] += seconds

    waited = Backoff(floor=0.01, cap=0.1).wait_for(
        lambda: False, clock=lambda: now[0], sleep=sleep, timeout=1.0
    )
    assert waited is False and 1.0 <= now[0] < 1.2
    assert Backoff(floor=0.01, cap=0.1).wait_for(lambda: True, timeout=0) is True


class _Pending:
    def __init__(self, submitted):
        self.submitted = submitted


def test_the_wait_limit_fails_a_collective_others_never_submit():
    now = [100.0]
    limit = WaitLimit(5.0, rank=1, clock=lambda: now[0])
    pending = {(0, "grad.7"): _Pending(99.0), (0, "grad.8"): _Pending(101.0)}
    limit.check_pending(pending)  # 1 s old: fine
    now[0] = 103.9
    limit.check_pending(pending)  # 4.9 s old: fine
    now[0] = 104.2
    limit.check_pending(pending)  # 5.2 s, but it looked less than half a second ago
    now[0] = 104.8
    with pytest.raises(CollectiveTimeoutError) as info:
        limit.check_pending(pending)
    text = str(info.value)
    assert "rank 1" in text and "'grad.7'" in text and "HVDLITE_COLLECTIVE_TIMEOUT=5" in text
    assert isinstance(info.value, HorovodInternalError)
    WaitLimit(None, rank=0, clock=lambda: 1e9).check_pending(pending)  # off: never


class _ScriptedLoop:
    """A loop whose cycles follow a script of (progress, stop) answers."""

    def __init__(self, script, finish=None):
        self.script = list(script)
        self.finish = finish
        self.cycles = 0
        self.torn_down = None
        self.failed = None
        self.queued = None

    def cycle(self, after_wait):
        self.cycles += 1
        answer = self.script.pop(0) if self.script else (False, False)
        if isinstance(answer, BaseException):
            raise answer
        if self.finish is not None and self.cycles == 2:
            self.finish.set_result("done")
        return answer

    def work_arrived(self):
        return bool(self.script)

    def oldest_queued(self):
        return self.queued

    def busy(self):
        return False

    def fail(self, exc):
        self.failed = exc

    def teardown(self, orderly):
        self.torn_down = orderly


def test_a_waiting_caller_drives_the_loop_until_its_handle_is_done():
    handle = Handle("h")
    loop = _ScriptedLoop([(True, False), (True, False)], finish=handle)
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    driver.drive(handle, timeout=10)
    assert handle.done() and loop.cycles == 2 and driver.state is Phase.RUNNING


def test_agreeing_to_stop_ends_the_thread_with_an_orderly_teardown():
    loop = _ScriptedLoop([(True, False), (False, True)])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    driver.start()
    assert driver.request_stop(timeout=10)
    assert driver.state is Phase.STOPPED and loop.torn_down is True


def test_a_failing_cycle_fails_the_loop_and_tears_down_without_collectives():
    loop = _ScriptedLoop([RuntimeError("broken cycle")])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    driver.start()
    driver._thread.join(10)
    assert driver.state is Phase.FAILED and loop.torn_down is False
    assert isinstance(loop.failed, RuntimeError)


def test_a_stop_request_is_announced_as_draining():
    loop = _ScriptedLoop([])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    assert not driver.request_stop(timeout=0)  # its thread never started
    assert driver.state is Phase.DRAINING


@pytest.mark.parametrize("spare_core", [True, False])
def test_a_waiting_thread_without_a_core_of_its_own_looks_for_doorbells_every_20_ms(spare_core):
    # With a spare core the first look comes a cycle time into the wait, growing
    # to 20 ms; without, every look is 20 ms apart (each takes the framework's core).
    driver = Driver(_ScriptedLoop([]), cycle_time=0.001, start_delay=0.001, spare_core=spare_core)
    for cycle_time in (0.001, 0.004):  # also after autotune sets a new cycle time
        driver.set_cycle_time(cycle_time, start_delay=0.02)
        poll = driver._thread_poll
        assert poll.delay(0.0) == (cycle_time if spare_core else 0.02)
        assert poll.delay(1.0) == 0.02


def test_a_thread_whose_cycles_run_no_work_looks_less_and_less_often():
    import time

    from hvdlite.engine import driver as driver_module

    driver = Driver(_ScriptedLoop([]), cycle_time=0.001, start_delay=0.02, spare_core=False)
    now = time.monotonic()
    driver._wait_start = driver._thread_worked = now
    assert driver._thread_pause() == pytest.approx(0.02, abs=0.002)  # just cycled
    driver._thread_worked = now - 1.0
    assert driver._thread_pause() == pytest.approx(0.1, abs=0.002)  # a tenth of the quiet
    driver._thread_worked = now - 60.0
    assert driver._thread_pause() == driver_module._QUIET_CAP == 0.2
    assert driver._wakes_at > time.monotonic() + 0.15
    # work queued that nobody drives brings a look that far away forward ...
    driver.nudge()
    assert driver.event.is_set()
    # ... but not one due within the start delay anyway
    driver.event.clear()
    driver._wakes_at = time.monotonic() + 0.01
    driver.nudge()
    assert not driver.event.is_set()


def test_only_work_run_by_the_engine_thread_makes_it_look_often_again():
    class Working(_ScriptedLoop):
        def cycle(self, after_wait):
            driver.ran_work()  # as the engine does after a cycle that ran work
            return super().cycle(after_wait)

    handle = Handle("h")
    loop = Working([(True, False), (True, False)], finish=handle)
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    driver._thread_worked -= 100.0
    quiet_since = driver._thread_worked
    driver.drive(handle, timeout=10)  # a caller's cycles: the thread stays quiet
    assert loop.cycles == 2 and driver._thread_worked == quiet_since
    loop.script = [(False, True)]
    driver.start()  # the thread's cycle
    driver._thread.join(10)
    assert loop.cycles == 3 and driver._thread_worked > quiet_since + 99


def test_waiting_on_a_handle_inside_a_step_is_refused():
    handle = Handle("inner")
    errors = []

    class Reentrant(_ScriptedLoop):
        def cycle(self, after_wait):
            try:
                driver.drive(handle)
            except RuntimeError as exc:
                errors.append(exc)
            return False, True

    driver = Driver(Reentrant([]), cycle_time=0.001, start_delay=0.001)
    outer = Handle("outer")
    threading.Timer(0.5, outer.set_result, args=(1,)).start()
    driver.drive(outer, timeout=5)
    assert errors and "done-callback" in str(errors[0])


class _InterruptibleLoop(_ScriptedLoop):
    def __init__(self, script):
        super().__init__(script)
        self.interrupted = None

    def interrupt(self, exc):
        self.interrupted = exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3)])
def test_an_interrupt_in_a_callers_step_reaches_the_caller(exc):
    loop = _InterruptibleLoop([exc])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    with pytest.raises(type(exc)):
        driver.drive(Handle("h"), timeout=5)
    assert loop.interrupted is exc and loop.failed is None
    assert driver.state is Phase.FAILED


def test_an_exception_outside_a_step_still_fails_the_loop():
    loop = _InterruptibleLoop([(False, False)])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)

    class BrokenPoll:
        def delay(self, waited):
            raise OverflowError("timeout value is too large")

    driver._thread_poll = BrokenPoll()
    driver.start()
    driver._thread.join(10)
    assert isinstance(loop.failed, OverflowError) and driver.state is Phase.FAILED
    assert loop.torn_down is False


def test_a_caller_gives_up_on_a_step_that_outlasts_the_limit():
    started, release = threading.Event(), threading.Event()

    class Stuck(_InterruptibleLoop):
        def cycle(self, after_wait):
            started.set()
            release.wait(10)
            return False, False

    loop = Stuck([])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001, step_limit=0.3)
    driver.start()
    assert started.wait(5)
    driver.drive(Handle("h"), timeout=5)
    release.set()
    assert isinstance(loop.failed, CollectiveTimeoutError) and "0.3 s" in str(loop.failed)


def test_a_collective_timeout_is_logged_as_its_message_without_engine_frames(caplog):
    message = "hvdlite: rank 0 waited more than 3 s for the other ranks (deliberate)"
    loop = _InterruptibleLoop([CollectiveTimeoutError(message)])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    with caplog.at_level(logging.DEBUG, logger="hvdlite"):
        driver.drive(Handle("h"), timeout=5)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [message]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("driver.py" in text for text in debug)  # the frames, for who asks
    assert isinstance(loop.failed, CollectiveTimeoutError)


def test_other_engine_failures_keep_their_traceback(caplog):
    loop = _InterruptibleLoop([RuntimeError("a bug")])
    driver = Driver(loop, cycle_time=0.001, start_delay=0.001)
    with caplog.at_level(logging.WARNING, logger="hvdlite"):
        driver.drive(Handle("h"), timeout=5)
    (error,) = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert error.startswith("hvdlite engine failed:") and "Traceback" in error
