"""hvdlite.runner.process_state: how a task wrapper tells that a rank's process is stopped."""

import os
import signal
import subprocess
import time

import pytest

from hvdlite.runner import process_state
from hvdlite.runner.process_state import StoppedWatch, is_stopped, stopped_in_group


@pytest.mark.parametrize(
    "text,expected",
    [
        ("12 (python) S 1 12 12 0 -1", ("S", 12)),
        ("12 (a (b) c) T 1 40 40 0 -1", ("T", 40)),  # a command name with parentheses
        ("12 (x) y) t 1 7 7", ("t", 7)),
        ("12 (python", None),
        ("12 (python) R 1 x", None),
        ("", None),
    ],
)
def test_state_and_group_from_proc_stat(text, expected):
    assert process_state._state_and_group(text) == expected


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _until(check, seconds=5.0):
    end = time.monotonic() + seconds
    while not check() and time.monotonic() < end:
        time.sleep(0.02)
    return check()


@pytest.mark.timeout(30)
def test_a_real_process_is_seen_stopped_and_continued(sleeper):
    assert not is_stopped(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    assert _until(lambda: is_stopped(sleeper.pid))
    assert stopped_in_group(sleeper.pid) == [sleeper.pid]
    os.kill(sleeper.pid, signal.SIGCONT)
    assert _until(lambda: not is_stopped(sleeper.pid))
    assert stopped_in_group(sleeper.pid) == []


@pytest.mark.timeout(30)
def test_the_watch_counts_from_the_first_look_that_saw_the_stop(sleeper):
    now = [100.0]
    watch = StoppedWatch(sleeper.pid, clock=lambda: now[0])
    assert watch.look() == 0.0
    os.kill(sleeper.pid, signal.SIGSTOP)
    assert _until(lambda: is_stopped(sleeper.pid))
    now[0] = 101.0
    assert watch.look() == 0.0 and watch.pids == [sleeper.pid]
    now[0] = 104.5
    assert watch.look() == 3.5
    os.kill(sleeper.pid, signal.SIGCONT)  # a look that finds it running starts over
    assert _until(lambda: not is_stopped(sleeper.pid))
    now[0] = 105.0
    assert watch.look() == 0.0 and watch.pids == []


@pytest.mark.timeout(30)
def test_a_stopped_process_of_the_group_is_found_by_the_scan_not_every_look():
    # The leader is a shell; the process stopped is its child, in the same group.
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        assert _until(lambda: len(_group(proc.pid)) == 2)
        child = next(pid for pid in _group(proc.pid) if pid != proc.pid)
        now = [0.0]
        watch = StoppedWatch(proc.pid, scan_every=10.0, clock=lambda: now[0])
        assert watch.look() == 0.0  # scans at once, finds nothing
        os.kill(child, signal.SIGSTOP)
        assert _until(lambda: is_stopped(child))
        now[0] = 5.0
        assert watch.look() == 0.0 and watch.pids == []  # no scan due yet
        now[0] = 10.0
        assert watch.look() == 0.0 and watch.pids == [child]
        now[0] = 11.0  # once stopped, every look scans
        assert watch.look() == 1.0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _group(group):
    return [
        int(name)
        for name in os.listdir("/proc")
        if name.isdigit()
        and process_state._read(name, "/proc") is not None
        and process_state._read(name, "/proc")[1] == group
    ]


def test_without_proc_nothing_is_ever_stopped(tmp_path):
    assert stopped_in_group(1, proc=str(tmp_path / "none")) == []
    assert not is_stopped(1, proc=str(tmp_path / "none"))
