"""Failure paths under real MPI, each checked from one outer process: init that
one rank cannot finish, waits on a peer that is alive but not taking part,
interrupts, exceptions in threads, fork, timeline write errors, and memory over
100,000 collectives.

Each test runs ``mpiexec -n N python tests/mpi_scripts/core_failures.py MODE``
and checks the exit code, the time taken and the ranks' lines (see the script
for what each mode does).  Unit-level checks of the same parts are in
tests/test_config_unit.py, test_init_agreement_unit.py, test_driver_unit.py,
test_submissions_unit.py and test_timeline_unit.py.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
from test_parallel import ROOT, run_mpi

SCRIPT = ROOT / "tests" / "mpi_scripts" / "core_failures.py"

#: A job that must end does so this fast (MPI start-up and a 3 s limit included).
ENDS_WITHIN = 30.0


def run(n: int, mode: str, env=None, timeout: float = 90):
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    for name in ("HVDLITE_COLLECTIVE_TIMEOUT", "HVDLITE_TIMELINE", "HVDLITE_OVERLAP"):
        if env is None or name not in env:
            full_env.pop(name, None)
    start = time.monotonic()
    rc, out = run_mpi(n, [sys.executable, str(SCRIPT), mode], timeout=timeout, env=full_env)
    return rc, out, time.monotonic() - start


def lines_of(out: str, rank: int) -> list[str]:
    """What *rank* said (the script tags its lines ``<rN>``; mpiexec may join them)."""
    return re.findall(rf"<r{rank}> (.*?)(?=<r\d+> |\n|$)", out)


# ------------------------------------------------------------------ init agreement
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    "mode,words",
    [
        ("knob-mismatch", ["HVDLITE_FUSION_THRESHOLD differs between ranks", "rank 1: 1024"]),
        ("bad-knob", ["failed on 1 of", "HVDLITE_CYCLE_TIME='nan' is not valid"]),
        (
            "timeline-unopenable",
            [
                "rank 0: FileNotFoundError",
                "the timeline file '/nonexistent-dir/timeline.json' (set by HVDLITE_TIMELINE",
            ],
        ),
        ("sets-differ", ["process_sets=...) must list the same sets"]),
    ],
)
def test_an_init_that_fails_anywhere_fails_everywhere_then_works(n, mode, words):
    rc, out, elapsed = run(n, mode)
    assert rc == 0, out[-4000:]
    for rank in range(n):
        mine = " ".join(lines_of(out, rank))
        assert "init refused" in mine, out[-4000:]
        for word in words:
            assert word in mine, (word, out[-4000:])
        assert f"init after the refusal works: {n}" in mine, out[-4000:]


# ---------------------------------------------------------------------- wait limits
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    "mode,words",
    [
        ("stopped-peer", ["in the engine's status exchange", "HVDLITE_COLLECTIVE_TIMEOUT=3"]),
        (
            "silent-peer",
            [
                "to submit collective 'never.completes'",
                "HVDLITE_COLLECTIVE_TIMEOUT=3",
                "Missing ranks",
            ],
        ),
    ],
)
def test_a_peer_that_does_not_take_part_ends_the_job_after_the_limit(n, mode, words):
    rc, out, elapsed = run(n, mode, timeout=90)
    assert rc != 0, out[-4000:]
    assert elapsed < ENDS_WITHIN, f"took {elapsed:.0f}s:\n{out[-4000:]}"
    for word in words:
        assert word in out, (word, out[-4000:])
    assert "completed without" not in out and "woke up" not in out
    # The timeout is reported as its message, without the engine's frames.
    assert "hvdlite engine failed" not in out and "driver.py" not in out, out[-4000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_the_shared_memory_barrier_gives_up_after_the_limit(n):
    rc, out, elapsed = run(n, "shm-barrier")
    for rank in range(n - 1):  # every rank but the last waits at the barrier
        mine = " ".join(lines_of(out, rank))
        assert "CollectiveTimeoutError after 3." in mine, out[-4000:]
        assert "shared-memory allreduce's barrier" in mine


# ------------------------------------------------------ errors that end the job
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_an_exception_in_another_thread_ends_the_job(n):
    rc, out, elapsed = run(n, "thread-raises")
    assert rc != 0 and elapsed < ENDS_WITHIN, out[-4000:]
    assert "deliberate failure in a worker thread" in out
    assert "went on after" not in out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_ctrl_c_inside_a_cycle_reaches_the_caller_then_ends_the_job(n):
    rc, out, elapsed = run(n, "interrupt-sigint")
    assert rc != 0 and elapsed < ENDS_WITHIN, out[-4000:]
    mine = " ".join(lines_of(out, 0))
    assert "KeyboardInterrupt reached the caller" in mine, out[-4000:]
    assert "the next collective fails: hvdlite engine stopped on rank 0: KeyboardInterrupt" in mine
    assert "finally ran" in mine


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_sys_exit_inside_a_cycle_runs_finally_blocks_and_keeps_its_code(n):
    rc, out, elapsed = run(n, "interrupt-exit")
    assert rc == 3 and elapsed < ENDS_WITHIN, (rc, out[-4000:])
    assert "finally ran" in " ".join(lines_of(out, 0))


@pytest.mark.timeout(120)
def test_an_interrupt_alone_is_not_swallowed_and_init_starts_again():
    rc, out, elapsed = run(1, "interrupt-alone")
    assert rc == 0, out[-4000:]
    mine = " ".join(lines_of(out, 0))
    assert "KeyboardInterrupt reached the caller" in mine, out[-4000:]
    assert "the next collective fails" in mine and "restarted: 1" in mine


# -------------------------------------------------------------------------- fork
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_a_forked_child_is_refused_and_the_parent_goes_on(n):
    rc, out, elapsed = run(n, "fork")
    assert rc == 0, out[-4000:]
    assert out.count("child: is_initialized=False") == n, out[-4000:]
    assert out.count("child: refused: hvdlite was initialized in the parent") == 2 * n
    assert "a call worked" not in out
    assert out.count("child: exit hook done") == n
    for rank in range(n):
        assert f"parent still works: {n}" in " ".join(lines_of(out, rank)), out[-4000:]


# --------------------------------------------------------------------- timeline
@pytest.mark.timeout(120)
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_timeline_on_a_full_disk_turns_off_and_the_job_goes_on():
    rc, out, elapsed = run(2, "timeline-full")
    assert rc == 0, out[-4000:]
    assert out.count("the timeline could not be written") == 1, out[-4000:]
    assert out.count("300 collectives done") == 2


# ----------------------------------------------------------------------- memory
@pytest.mark.timeout(240)
def test_a_long_run_of_unnamed_collectives_keeps_memory_flat(tmp_path):
    rc, out, elapsed = run(
        2, "memory", env={"HVDLITE_TIMELINE": str(tmp_path / "t.json")}, timeout=200
    )
    assert rc == 0, out[-4000:]
    for rank in range(2):
        found = dict(re.findall(rf"<r{rank}> after (\d+): rss=([\d.]+)MB", out))
        assert set(found) == {"10000", "100000"}, out[-4000:]
        growth = float(found["100000"]) - float(found["10000"])
        assert growth < 8.0, f"rank {rank} grew {growth:.1f} MB:\n{out[-4000:]}"
        tables = re.findall(
            rf"<r{rank}> after 100000: .*?table=(\d+) pending=(\d+) "
            rf"cache=(\d+) pool=(\d+) timeline_rows=(\d+)",
            out,
        )
        table, pending, cache, pool, rows = map(int, tables[0])
        assert table == 0 and pending == 0 and cache <= 1024 and pool < 1 << 20
        assert rows <= 4
