"""Failure paths of the core that need no MPI: knob values, the init agreement's
verdicts, wait limits, interrupts in the driver, automatic names from threads,
timeline write errors, and the bounds on what a long run keeps.

The same paths under real MPI (several ranks) are in tests/test_core_failures.py.
"""

from __future__ import annotations

import logging
import sys
import threading

import numpy as np
import pytest
from test_core_parts import _ScriptedLoop

from hvdlite import config
from hvdlite.engine.auto_names import AutoNames
from hvdlite.util.backoff import Backoff
from hvdlite.engine.driver import Driver, Phase
from hvdlite.exceptions import CollectiveTimeoutError, HorovodInternalError
from hvdlite.device.buffers import BufferPool
from hvdlite.handles import Handle
from hvdlite.engine.init_agreement import Preparation, check
from hvdlite.engine.messages import Kind, Params, Response
from hvdlite.timeline import MAX_ROWS, Timeline
from hvdlite.engine.wait_limit import WaitLimit

pytestmark = pytest.mark.timeout(60)


# ----------------------------------------------------------------- knob values
@pytest.mark.parametrize(
    "var",
    [
        "HVDLITE_CYCLE_TIME",
        "HVDLITE_STALL_CHECK_TIME_SECONDS",
        "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS",
        "HVDLITE_COLLECTIVE_TIMEOUT",
        "HVDLITE_FUSION_THRESHOLD",
        "HVDLITE_CACHE_CAPACITY",
        "HVDLITE_TEST_NODE_SIZE",
    ],
)
@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e999"])
def test_non_finite_numbers_are_refused_naming_the_variable(var, raw):
    with pytest.raises(ValueError) as info:
        config.read_config({var: raw})
    assert var in str(info.value) and "is not valid" in str(info.value)


@pytest.mark.parametrize(
    "env,words",
    [
        ({"HVDLITE_CYCLE_TIME": "1e9"}, "at most 10000"),
        ({"HVDLITE_COLLECTIVE_TIMEOUT": "-1"}, "HVDLITE_COLLECTIVE_TIMEOUT must be >= 0"),
        ({"HVDLITE_STALL_CHECK_TIME_SECONDS": "-5"}, "HVDLITE_STALL_CHECK_TIME_SECONDS"),
    ],
)
def test_out_of_range_numbers_are_refused(env, words):
    with pytest.raises(ValueError, match=words):
        config.read_config(env)


def test_the_collective_timeout_knob_reads_both_spellings():
    assert config.read_config({}).collective_timeout == 0.0
    assert config.read_config({"HOROVOD_COLLECTIVE_TIMEOUT": "7.5"}).collective_timeout == 7.5


def test_knobs_that_must_agree_are_the_ones_that_change_collective_behaviour():
    agreed = {k.attr for k in config.KNOBS if k.agree}
    assert agreed == {
        "fusion_threshold",
        "cache_capacity",
        "hierarchical_allreduce",
        "hierarchical_allgather",
        "shm_allreduce_disable",
        "dynamic_process_sets",
        "test_node_size",
        "bucket_cap_mb",
        # the order check bypasses the response cache on every rank or none
        "check_order",
        # autotune: its status-vector field, and rank 0's sampling for all
        "autotune",
        "autotune_warmup_samples",
        "autotune_steps_per_sample",
        "autotune_bayes_opt_max_samples",
        "autotune_gaussian_process_noise",
    }


def test_disagreements_name_the_knob_the_ranks_and_the_values():
    base = config.read_config({})
    other = config.read_config(
        {"HVDLITE_FUSION_THRESHOLD": "1024", "HVDLITE_CYCLE_TIME": "5"}
    )  # cycle time may differ
    per_rank = [config.agreed_values(c) for c in (base, other, base)]
    lines = config.disagreements(per_rank)
    assert len(lines) == 1
    assert "HVDLITE_FUSION_THRESHOLD" in lines[0]
    assert "ranks 0, 2: 67108864" in lines[0] and "rank 1: 1024" in lines[0]


# ------------------------------------------------------------ init agreement
def _summary(error=None, env=None, sets=()):
    entries = [(False, list(s)) for s in sets]  # sets given as ranks
    return Preparation(error, config.read_config(env or {}), entries).summary()


def test_the_agreement_passes_when_ranks_prepared_alike():
    assert check([_summary(sets=[[0, 1]]), _summary(sets=[[0, 1]])]) is None


def test_one_failed_rank_fails_init_everywhere_with_its_error():
    message = check([_summary(), _summary(ValueError("HVDLITE_CYCLE_TIME='nan' is bad"))])
    assert "failed on 1 of 2 ranks" in message and "no rank is initialized" in message
    assert "rank 1: ValueError: HVDLITE_CYCLE_TIME='nan' is bad" in message


def test_many_ranks_failing_alike_are_named_as_one_range():
    error = ValueError("HVDLITE_FUSION_THRESHOLD='x' is bad")
    message = check([_summary()] * 3 + [_summary(error)] * 29)
    assert "failed on 29 of 32 ranks" in message
    assert message.count("is bad") == 1 and "ranks 3-31: ValueError" in message


def test_differing_knobs_or_process_sets_fail_init():
    knobs = check([_summary(), _summary(env={"HVDLITE_CACHE_CAPACITY": "0"})])
    assert "HVDLITE_CACHE_CAPACITY differs between ranks" in knobs
    sets = check([_summary(sets=[[0, 1]]), _summary(sets=[[1]])])
    assert "process_sets" in sets and "rank 0: [[0, 1]]" in sets


def test_communicator_sets_may_differ_per_rank_when_their_members_agree():
    from hvdlite.engine.initial_sets import duplicates, inconsistency, union

    halves = [[(True, [0, 2]), (False, [0])], [(True, [1])], [(True, [0, 2]), (False, [0])]]
    assert "must list the same sets" in inconsistency(halves)  # rank 1 lists one set only
    halves[1].append((False, [0]))
    assert inconsistency(halves) is None
    assert union(halves, 3) == [[0, 2], [1], [0]]
    # rank 1 says the communicator holds ranks 0 and 1; rank 0 says it holds 0 and 2
    wrong = [[(True, [0, 2])], [(True, [0, 1])], [(True, [0, 2])]]
    assert "rank 1 sees ranks [0, 1], but rank 0 sees [0, 2]" in inconsistency(wrong)
    # a set of every rank, then a repeat: both duplicates; the union skips them
    listed = [(False, [0, 1, 2]), (False, [1]), (False, [1])]
    assert duplicates(listed, 3) == [0, 2]
    assert union([listed] * 3, 3) == [[1]]


# ---------------------------------------------------------------- wait limits
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


# ---------------------------------------------------------- driver interrupts
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


# ------------------------------------------------------------- automatic names
def test_automatic_names_count_per_thread():
    names = AutoNames()
    assert [names.suffix("allreduce") for _ in range(2)] == ["0", "1"]
    out = []
    worker = threading.Thread(
        target=lambda: out.extend(names.suffix("allreduce") for _ in range(2)), name="loader"
    )
    worker.start()
    worker.join()
    assert out == ["loader.0", "loader.1"]
    assert names.suffix("allreduce") == "2"  # the main thread's count went on alone


def test_threads_racing_for_names_never_share_one():
    names = AutoNames()
    got: list[str] = []
    lock = threading.Lock()
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def work():
            mine = [names.suffix(("allreduce", 0)) for _ in range(2000)]
            with lock:
                got.extend(mine)

        threads = [threading.Thread(target=work, name=f"w{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert len(got) == len(set(got)) == 8000


def test_two_live_threads_with_one_name_are_refused():
    names = AutoNames()
    release = threading.Event()
    first = threading.Thread(target=lambda: (names.suffix("x"), release.wait(10)), name="dup")
    first.start()
    errors = []

    def second():
        try:
            names.suffix("x")
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=second, name="dup")
    t.start()
    t.join()
    release.set()
    first.join()
    assert errors and "distinct name" in str(errors[0])


# -------------------------------------------------------------------- timeline
def _batch(name):
    params = Params(set_id=0, name=name, kind=Kind.ALLREDUCE, shapes=((2,),), dtypes=("<f4",))
    return [Response(0, params, (0, name))]


def _run_batch(timeline, name):
    """What the engine calls around one batch."""
    timeline.batch_began()
    timeline.finishing()
    timeline.batch_ended(_batch(name))


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_a_timeline_that_cannot_be_written_turns_itself_off_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hvdlite"):
        timeline = Timeline("/dev/full")
        for i in range(2000):  # far more than one write buffer
            _run_batch(timeline, f"t{i}")
        timeline.close()
    warnings = [r for r in caplog.records if "timeline could not be written" in r.getMessage()]
    assert len(warnings) == 1


def test_timeline_rows_stay_bounded(tmp_path):
    timeline = Timeline(str(tmp_path / "t.json"))
    for i in range(3000):
        _run_batch(timeline, f"allreduce.noname.{i}")
    timeline.close()
    assert timeline.rows == 1
    timeline = Timeline(str(tmp_path / "t2.json"))
    for i in range(MAX_ROWS + 50):
        _run_batch(timeline, f"grad.{i}")
    timeline.close()
    assert timeline.rows == MAX_ROWS


# ---------------------------------------------------------------- buffer pool
def test_fusion_buffers_shrink_after_a_peak_and_unused_ones_are_freed():
    pool = BufferPool()
    pool.get(np.float32, 8 << 20)  # a 32 MiB peak
    pool.get(np.float64, 1000)
    for _ in range(2 * BufferPool.WINDOW):
        pool.get(np.float32, 1024)
    assert pool.nbytes() == 1024 * 4  # shrunk to the window's largest; float64 freed


# ------------------------------------------------- logging and thread affinity
@pytest.mark.parametrize("hide,stamped", [(False, True), (True, False)])
def test_log_lines_carry_a_time_stamp_unless_hidden(monkeypatch, hide, stamped):
    from hvdlite import basics

    log = logging.getLogger("hvdlite")
    monkeypatch.setattr(log, "handlers", [])
    monkeypatch.setattr(log, "level", log.level)
    basics._configure_logging("WARNING", 3, hide_time=hide)
    fmt = log.handlers[0].formatter._fmt
    assert fmt.startswith("[hvdlite rank 3] ") and ("%(asctime)s" in fmt) is stamped
    assert config.read_config({"HOROVOD_LOG_HIDE_TIME": "1"}).log_hide_time is True


def test_a_malformed_thread_affinity_is_refused():
    with pytest.raises(ValueError, match="HVDLITE_THREAD_AFFINITY='0,x'"):
        config.read_config({"HVDLITE_THREAD_AFFINITY": "0,x"})
    assert config.read_config({"HOROVOD_THREAD_AFFINITY": "0, 8"}).thread_affinity == "0, 8"
