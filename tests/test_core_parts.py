"""Unit tests of the engine's parts that need no MPI: the status vector, the
cache bits, the inbox, the back-off, the driver's states, the transport plan,
and the import graph of the package."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hvdlite.util.backoff import Backoff
from hvdlite.engine.cache_bits import CacheBits
from hvdlite.engine.coordinator import StallClock
from hvdlite.engine.driver import Driver, Phase
from hvdlite.exceptions import HorovodInternalError
from hvdlite.handles import Handle
from hvdlite.engine.messages import RESPONSE_OK, Kind, Params, Response
from hvdlite.engine.plans import Plan, PlanCache
from hvdlite.engine.response_cache import ResponseCache
from hvdlite.engine.status import Codec, Flag, Layout, alone, combine, decode, encode
from hvdlite.engine.submissions import Entry, Inbox
from hvdlite.engine.transports.routes import SHM_MIN_BYTES, Router, Transport

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ doorbell
class _Bell:
    def __init__(self, peer_rang: bool):
        self.peer_rang = peer_rang
        self.rings = 0

    def heard(self) -> bool:
        heard, self.peer_rang = self.peer_rang, False
        return heard

    def ring(self) -> None:
        self.rings += 1


def _waiting_engine(bell: _Bell, work: bool):
    """What Engine.work_arrived reads, for a rank waiting with or without local work."""
    from types import SimpleNamespace

    from hvdlite.engine.wait_limit import WaitLimit

    stall = StallClock(60, 0, enabled=False)
    return SimpleNamespace(
        limit=WaitLimit(None, 0),
        flight=SimpleNamespace(pending={}),
        negotiator=SimpleNamespace(want_stall_check=stall.due),
        inbox=[object()] if work else [],
        driver=SimpleNamespace(state=Phase.RUNNING),
        doorbell=bell,
    )


@pytest.mark.parametrize("peer_rang", [False, True])
def test_a_rank_with_work_rings_only_if_no_peer_rang_first(peer_rang):
    # When every rank has work in the same step, ringing every peer from every
    # rank would cost N * (N - 1) messages; a peer's ring already wakes them all.
    from hvdlite.engine.cycle import Engine

    bell = _Bell(peer_rang)
    assert Engine.work_arrived(_waiting_engine(bell, work=True))
    assert bell.rings == (0 if peer_rang else 1)
    idle = _Bell(peer_rang)
    assert Engine.work_arrived(_waiting_engine(idle, work=False)) is peer_rang
    assert idle.rings == 0


# ------------------------------------------------------------------ status vector
def test_the_combined_status_is_the_or_of_flags_and_the_and_of_hits():
    rng = random.Random(7)
    for world, nbits in ((1, 0), (2, 5), (3, 130), (70, 64)):
        layout = Layout.of(nbits, world, after_wait=True)
        full = (1 << (layout.bit_words * 64)) - 1
        ranks = []
        for rank in range(world):
            hits = rng.getrandbits(nbits) if nbits else 0
            ranks.append(
                (
                    rng.choice([0, Flag.NEW, Flag.STALL | Flag.JOINED]),
                    hits,
                    rng.getrandbits(nbits) if nbits and rng.random() < 0.3 else 0,
                    rank if rng.random() < 0.5 else None,
                )
            )
        vectors = [
            encode(layout, flags, hits, hits, invalid, ringer)
            for flags, hits, invalid, ringer in ranks
        ]
        status = decode(layout, combine(vectors))
        expect_flags = expect_any = expect_invalid = 0
        expect_all = full
        for flags, hits, invalid, _ in ranks:
            expect_flags |= flags
            expect_all &= hits
            expect_any |= hits
            expect_invalid |= invalid
        assert status.flags == expect_flags
        assert status.all_hit == expect_all & full
        assert status.any_hit == expect_any
        assert status.invalid == expect_invalid
        assert status.ringers == sum(ringer is not None for *_, ringer in ranks)


def test_a_job_of_one_rank_decodes_its_own_status_without_a_vector():
    for after_wait in (False, True):
        layout = Layout.of(70, 1, after_wait)
        args = (Flag.NEW | Flag.STALL, (1 << 69) | 5, (1 << 69) | 5, 2)
        assert alone(layout, *args, rang=True) == decode(
            layout, combine([encode(layout, *args, ringer_rank=0)])
        )


def test_a_status_without_a_wait_has_no_ringer_field():
    layout = Layout.of(10, 4, after_wait=False)
    assert layout.ringer_words == 0 and layout.nbytes == 8 * 4
    status = decode(layout, encode(layout, Flag.SHUTDOWN, 0b101, 0b101, 0))
    assert status.flags == Flag.SHUTDOWN and status.all_hit == 0b101 and status.ringers == 0


def test_the_codec_answers_as_encode_and_decode_do_and_forgets_past_its_limit():
    codec = Codec(limit=4)
    rng = random.Random(3)
    for _ in range(40):
        layout = Layout.of(rng.choice([0, 5, 70]), 3, rng.random() < 0.5, rng.choice([0, 1]))
        full = (1 << (layout.bit_words * 64)) - 1
        args = (
            rng.choice([0, Flag.NEW, Flag.STALL]),
            rng.getrandbits(3) & full,
            rng.getrandbits(3) & full,
            0,
            rng.choice([None, 1]),
            rng.choice([None, 7]) if layout.root_words else None,
        )
        vector = codec.encode(layout, *args)
        assert vector.tobytes() == encode(layout, *args).tobytes()
        vector[0] = 0  # the caller's to reduce in place: the remembered answer stays
        assert codec.encode(layout, *args).tobytes() == encode(layout, *args).tobytes()
        assert codec.decode(layout, vector) == decode(layout, vector)
        assert len(codec._vectors) <= 4 and len(codec._statuses) <= 4


# --------------------------------------------------------------------- cache bits
def _response(name, set_id=0):
    params = Params(
        set_id=set_id, name=name, kind=int(Kind.ALLREDUCE), dtypes=("<f4",), shapes=((4,),)
    )
    return Response(RESPONSE_OK, params, params.key)


def _entry(response, shape=(4,)):
    params = response.params._replace(shapes=(shape,))
    return Entry(params, (), (), Handle(params.name))


def test_cache_bits_follow_hits_invalidations_and_foreign_sets():
    bits = CacheBits(ResponseCache(capacity=2), rank=0)
    a, b = _response("a"), _response("b", set_id=1)
    assert bits.put(a, members={0, 1}) is None
    assert bits.put(b, members={1, 2}) is None  # rank 0 is not a member of set 1
    assert bits.foreign_mask == 0b10
    hit = _entry(a)
    assert bits.admit(hit) and hit.bit == 0 and bits.hit_mask == 0b01
    assert bits.status_masks(joined=False, full=0b11) == (0b11, 0b01)
    assert bits.status_masks(joined=True, full=0b11) == (0b11, 0)
    changed = _entry(a, shape=(5,))
    assert not bits.admit(changed) and bits.invalid_mask == 0b01
    assert bits.invalidate(0b01) == [hit] and hit.bit == -1 and bits.invalid_mask == 0
    assert bits.cache.bit_of(a.key) is None
    # Eviction returns the entry that waited on the evicted bit.
    waiting = _entry(b)
    bits.admit(waiting)
    assert bits.put(_response("c"), members={0, 1}) is None  # bit 0 was free again
    assert bits.put(_response("d"), members={0, 1}) is waiting


def test_take_ready_marks_bits_used_and_releases_their_entries():
    bits = CacheBits(ResponseCache(capacity=8), rank=0)
    entries = []
    for name in "abc":
        response = _response(name)
        bits.put(response, members={0})
        entries.append(_entry(response))
        bits.admit(entries[-1])
    assert bits.take_ready(0b101) == [0, 2]
    assert bits.hit_mask == 0b010 and entries[0].bit == -1 and entries[1].bit == 1
    assert bits.unhit_all() == [entries[1]] and bits.hit_mask == 0


# -------------------------------------------------------------------------- plans
def _plan(tag: str) -> Plan:
    return Plan([[tag]], [], None)


def test_plans_are_kept_per_ready_bits_while_the_cache_version_stays():
    plans = PlanCache(limit=3)
    assert plans.get(0b11, version=7) is None
    loop, loss = plans.add(0b11, _plan("loop")), plans.add(0b100, _plan("loss"))
    assert plans.get(0b11, 7) is loop and plans.get(0b100, 7) is loss
    assert plans.get(0b1, 7) is None and len(plans) == 2


def test_a_peek_guesses_without_dropping_and_a_new_version_drops_every_plan():
    plans = PlanCache()
    plans.get(0b1, version=1)
    plan = plans.add(0b1, _plan("a"))
    assert plans.peek(0b1, 1) is plan
    assert plans.peek(0b1, 2) is None and plans.get(0b1, 1) is plan  # peek kept it
    assert plans.get(0b1, 2) is None and len(plans) == 0
    assert plans.peek(0b1, 1) is None


def test_plans_past_the_limit_start_afresh_and_clear_forgets_the_version():
    plans = PlanCache(limit=2)
    plans.get(0, version=5)
    for ready in (1, 2):
        plans.add(ready, _plan(str(ready)))
    plans.add(4, _plan("4"))
    assert len(plans) == 1 and plans.get(4, 5) is not None and plans.get(1, 5) is None
    plans.clear()
    assert plans.peek(4, 5) is None and plans.get(4, 5) is None


# -------------------------------------------------------------------------- inbox
def test_the_inbox_refuses_names_in_flight_and_submissions_after_close():
    inbox = Inbox()
    first = _entry(_response("x"))
    inbox.put(first)
    with pytest.raises(ValueError, match="already in flight"):
        inbox.put(_entry(_response("x")))
    assert inbox.oldest() == first.submitted and inbox.take_all() == [first]
    with pytest.raises(ValueError):  # taken, but still in flight until released
        inbox.put(_entry(_response("x")))
    inbox.release([first.key])
    inbox.put(_entry(_response("x")))
    assert len(inbox.close("stopped for a test")) == 1 and inbox.closed
    with pytest.raises(HorovodInternalError, match="stopped for a test"):
        inbox.put(_entry(_response("y")))


# ------------------------------------------------------------------------ backoff
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


# --------------------------------------------------------------------------- stall
def test_the_stall_clock_asks_only_for_old_work_and_not_too_often():
    now = [100.0]
    clock = StallClock(warn_seconds=2.0, fail_seconds=0.0, enabled=True, clock=lambda: now[0])
    old = _entry(_response("old"))
    old.submitted = 90.0
    assert not clock.due({})  # nothing pending
    assert not clock.due({old.key: old})  # the first look waits min(warn, 5) s
    now[0] = 103.0
    assert clock.due({old.key: old})
    assert not clock.due({old.key: old})  # looked just now
    assert not StallClock(2.0, 0.0, enabled=False, clock=lambda: 1e9).due({old.key: old})


def test_the_same_stall_warning_repeats_less_and_less_often():
    now = [100.0]
    clock = StallClock(warn_seconds=5.0, fail_seconds=0.0, enabled=True, clock=lambda: now[0])
    rank1, rank2 = frozenset({1}), frozenset({1, 2})
    logged = []
    for _ in range(200):  # a stall check every 2.5 s, for 500 s
        gap = clock.report_due("report", rank1)
        if gap is not None:
            logged.append((now[0], gap))
        now[0] += 2.5
    assert [t for t, _ in logged] == [100.0, 105.0, 115.0, 135.0, 175.0, 255.0, 415.0]
    assert [gap for _, gap in logged][:3] == [5.0, 10.0, 20.0]
    assert clock.report_due("report", rank2) == 5.0  # another rank went missing: at once
    assert clock.report_due("", frozenset()) is None  # the stall ended
    assert clock.report_due("report", rank2) == 5.0  # a new stall: at once again


# -------------------------------------------------------------------------- driver
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


# ------------------------------------------------------------------------ transport
def test_the_plan_names_one_path_per_set_from_shared_facts():
    router = Router(
        world_size=4,
        node_ranks=[0, 1],
        shared_memory=True,
        hierarchical_allreduce=False,
        hierarchical_allgather=True,
    )
    node_pair = router.routes([1, 0])
    assert node_pair.allreduce is Transport.SHARED_MEMORY
    assert node_pair.allgather is Transport.SHARED_MEMORY
    assert node_pair.allreduce_path(SHM_MIN_BYTES - 1) is Transport.MPI
    assert node_pair.allreduce_path(SHM_MIN_BYTES) is Transport.SHARED_MEMORY
    assert router.routes([0, 2]).allreduce is Transport.MPI  # not all on this node
    assert router.routes([0, 2]).allgather is Transport.MPI
    assert router.routes([0]).allreduce is Transport.MPI  # one rank: nothing to share
    whole = router.routes(range(4))
    assert whole.allreduce is Transport.MPI and whole.allgather is Transport.HIERARCHICAL
    hier = Router(4, [0, 1, 2, 3], True, True, False)
    assert hier.routes(range(4)).allreduce is Transport.HIERARCHICAL
    assert hier.routes([0, 1]).allreduce is Transport.SHARED_MEMORY  # subsets run flat
    off = Router(2, [0, 1], False, False, False).routes([0, 1])
    assert off.allreduce is Transport.MPI and off.allgather is Transport.MPI


# ----------------------------------------------------------------------- imports
def test_no_import_cycles_or_layering_violations_among_hvdlites_modules():
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    package = tmp_path / "hvdlite"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n")
    (package / "c.py").write_text("import hvdlite.a\n")
    assert import_graph.cycles(import_graph.graph(tmp_path)) == [["hvdlite.a", "hvdlite.b"]]


def test_the_layering_check_names_an_adapter_that_imports_the_engine(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import import_graph
    finally:
        sys.path.remove(str(ROOT / "tools"))
    for package in ("hvdlite", "hvdlite/engine", "hvdlite/torch"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "hvdlite/collectives.py").write_text("from .engine import runtime\n")
    (tmp_path / "hvdlite/engine/runtime.py").write_text("")
    (tmp_path / "hvdlite/engine/cycle.py").write_text("from .. import collectives\n")
    (tmp_path / "hvdlite/torch/optimizer.py").write_text(
        "def f():\n    from hvdlite.engine import runtime\n"
    )
    found = import_graph.layering_violations(import_graph.graph(tmp_path))
    assert len(found) == 2
    assert found[0].startswith("hvdlite.engine.cycle imports hvdlite.collectives")
    assert found[1].startswith("hvdlite.torch.optimizer imports hvdlite.engine.runtime")
