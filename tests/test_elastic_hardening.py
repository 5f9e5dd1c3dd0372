"""Issue 36: elastic state that cannot be lost or forged, files and secrets kept private.

Unit tests (one process, no MPI); the collective behaviour is tested with real
hvdrun jobs in test_elastic_jobs.py and test_runner_jobs.py.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import stat
import time
from pathlib import Path

import pytest

from hvdlite.elastic import layout, persistence
from hvdlite.elastic.checksum import state_sum
from hvdlite.elastic.persistence import CommitStore, ElasticStateError
from hvdlite.runner.discovery import DiscoveryError, ScriptDiscovery
from hvdlite.runner.elastic_hosts import FailureHistory, ranks_on
from hvdlite.runner.hosts import Host


def _reachable(_host):
    return None


def test_a_rank_failure_is_the_hosts_only_on_evidence_about_the_host():
    now = [100.0]
    history = FailureHistory(window=60.0, clock=lambda: now[0])
    placement = [Host("a", 2), Host("b", 2)]
    assert ranks_on(placement, "b") == [2, 3]
    # one rank of two failed, the host answers: a process failure
    assert history.judge("a", [0, 1], {1}, _reachable) is None
    # the other host: both of its ranks failed before hvdrun stopped them
    assert history.judge("b", [2, 3], {2, 3}, _reachable) == "all 2 ranks on it failed at once"
    # a host that cannot be reached
    assert (
        history.judge("b", [2, 3], {3}, lambda h: "no route to host")
        == "it cannot be reached (no route to host)"
    )
    # "a" again within the window: the host's; then forgotten
    now[0] += 30
    assert history.judge("a", [0, 1], {0}, _reachable).startswith(
        "its ranks failed again 30 s after"
    )
    assert history.judge("a", [0, 1], {0}, _reachable) is None
    now[0] += 61  # outside the window: a process failure again
    assert history.judge("a", [0, 1], {0}, _reachable) is None
    # a single rank on a host is no evidence about the host by itself
    assert history.judge("c", [4], {4}, _reachable) is None


def test_the_failure_history_is_bounded():
    history = FailureHistory(window=1e9, limit=3)
    for index in range(10):
        assert history.judge(f"h{index}", [0], {0}, _reachable) is None
    assert len(history._last) == 3


# -- item 1: any number of parts round-trips; item 6: hvdrun reads the header only ----------
def test_a_commit_of_100000_parts_round_trips(tmp_path):
    store = CommitStore(str(tmp_path / "state"), "j")
    parts = [pickle.dumps(None, protocol=5)] + [
        bytes([i % 251]) * (i % 7) for i in range(1, 100_000)
    ]
    store.write(parts, 1, 2, {"epoch": 3})
    commit = store.read()
    assert len(commit.parts) == 100_000 and commit.describe() == "commit 1 (epoch=3)"
    assert bytes(commit.payload) == b"".join(parts)
    with open(tmp_path / "state", "rb") as handle:  # the header line stays short
        handle.readline()
        assert len(handle.readline()) < 400


def test_a_damaged_part_table_is_found(tmp_path):
    path = tmp_path / "state"
    CommitStore(str(path), "j").write([b"ab", b"cd", b"ef"], 1, 1)
    data = bytearray(path.read_bytes())
    start = data.index(b"}\n", len(persistence.MAGIC)) + 2
    data[start], data[start + 8] = 1, 3  # parts 1 and 3 bytes long: same total
    path.write_bytes(bytes(data))
    with pytest.raises(ElasticStateError, match="checksum of its state does not match"):
        CommitStore(str(path), "j").read()


def test_torch_state_with_adam_and_5000_parameters_restores(tmp_path, monkeypatch):
    # 2,500 layers: 5,000 parameters, with Adam's moments and steps 20,000 tensors out of
    # band -- the format-2 header of such a commit was over 64 KiB: it could not be read.
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd

    for name, value in {
        layout.JOB_DIR_VARIABLE: str(tmp_path),
        layout.JOB_ID_VARIABLE: "j",
        "HVDLITE_ELASTIC_SYNC_COMMIT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    layout.write_marker(str(tmp_path), "j")
    model = torch.nn.ModuleList(torch.nn.Linear(30, 30) for _ in range(2_500))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    for layer in model:
        layer.weight.grad = torch.ones(30, 30)
        layer.bias.grad = torch.ones(30)
    optimizer.step()
    state = hvd.elastic.TorchState(model, optimizer, epoch=1)
    state._rank, state._bcast_object = (lambda: 0), (lambda obj: obj)
    state.commit()
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    assert len(commit.parts) > 15_000
    fresh = torch.nn.ModuleList(torch.nn.Linear(30, 30) for _ in range(2_500))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    other = hvd.elastic.TorchState(fresh, fresh_opt, epoch=0)
    other._load_snapshot(commit.load())
    assert other.epoch == 1 and torch.equal(fresh[-1].weight, model[-1].weight)
    assert len(fresh_opt.state_dict()["state"]) == 5_000


def test_an_object_state_of_50000_numpy_arrays_restores(tmp_path, monkeypatch):
    # Many arrays in an ObjectState (per-sample weights, a replay buffer of arrays): small
    # ones travel inside the pickle, so the commit stays one part and restores whole.
    import numpy as np

    from hvdlite.elastic.state import ObjectState

    for name, value in {
        layout.JOB_DIR_VARIABLE: str(tmp_path),
        layout.JOB_ID_VARIABLE: "j",
        "HVDLITE_ELASTIC_SYNC_COMMIT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    layout.write_marker(str(tmp_path), "j")
    arrays = [np.full(3, i, dtype=np.float32) for i in range(50_000)]
    state = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, buffer=arrays, epoch=2)
    state.commit()
    commit = CommitStore(str(tmp_path / layout.STATE_FILE), "j").read()
    assert len(commit.parts) >= 1
    other = ObjectState(bcast_object=lambda obj: obj, get_rank=lambda: 0, buffer=[], epoch=0)
    other._load_snapshot(commit.load())
    assert other.epoch == 2 and len(other.buffer) == 50_000
    assert float(other.buffer[-1][0]) == 49_999.0


def test_a_header_a_reader_would_refuse_is_refused_when_written(tmp_path):
    store = CommitStore(str(tmp_path / "state"), "j" * 70_000)
    with pytest.raises(ElasticStateError, match="its header is .* bytes, more than the 65536"):
        store.write(b"x", 1, 1)
    assert not (tmp_path / "state").exists()


def test_format_2_commits_still_read(tmp_path):
    path = tmp_path / "state"
    header = {
        "job": "j",
        "commit": 2,
        "size": 1,
        "time": 0.0,
        "summary": {},
        "bytes": 4,
        "parts": [2, 2],
        "sum": state_sum([b"ab", b"cd"]),
    }
    path.write_bytes(b"HVDLITE-ELASTIC-STATE 2\n" + json.dumps(header).encode() + b"\nabcd")
    commit = CommitStore(str(path), "j").read()
    assert (commit.number, commit.parts, bytes(commit.payload)) == (2, (2, 2), b"abcd")


def test_hvdrun_reads_only_the_header_of_a_commit(tmp_path):
    from hvdlite.runner.elastic_driver import GiveUp, _commit_on_disk

    store = CommitStore(str(tmp_path / layout.STATE_FILE), "j")
    store.write(b"x" * 1000, 4, 2, {"epoch": 1})
    with open(tmp_path / layout.STATE_FILE, "r+b") as handle:  # a payload of 1 TiB, sparse
        handle.truncate(1 << 40)
    commit = _commit_on_disk(str(tmp_path), "j")
    assert commit.describe() == "commit 4 (epoch=1)" and commit.payload == b""
    with pytest.raises(GiveUp, match="belongs to job 'j'"):
        _commit_on_disk(str(tmp_path), "other")


# -- item 7: state files are private, and a reader refuses what others could have written ----
def test_commits_are_owner_only_whatever_the_umask(tmp_path):
    old = os.umask(0o002)
    try:
        store = CommitStore(str(tmp_path / "job" / "state"), "j")
        store.write(b"one", 1, 1)
        store.write(b"two", 2, 1)
        layout.post_notice(str(tmp_path / "job"), 0, "hosts changed")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "job").st_mode) == 0o700
    for name in ("state", "state.spare", "hosts-updated.0"):
        assert stat.S_IMODE(os.stat(tmp_path / "job" / name).st_mode) == 0o600, name


@pytest.mark.parametrize(
    "target,change,problem",
    [
        (
            "state",
            lambda p: os.chmod(p, 0o664),
            "may be written by its group or others (mode 0664)",
        ),
        ("", lambda p: os.chmod(p, 0o770), "may be written by its group or others (mode 0770)"),
        ("state", lambda p: os.chown(p, 12345, -1), "is owned by user id 12345, not by you"),
    ],
)
def test_a_state_others_could_have_written_is_refused(tmp_path, target, change, problem):
    if target == "state" and "owned" in problem and os.geteuid() != 0:
        pytest.skip("only root can give a file away")
    store = CommitStore(str(tmp_path / "job" / "state"), "j")
    store.write(b"payload", 1, 1)
    path = tmp_path / "job" / target if target else tmp_path / "job"
    change(str(path))
    for read in (store.read, store.read_header):
        with pytest.raises(ElasticStateError) as info:
            read()
        message = str(info.value)
        assert f"{path.as_posix().rstrip('/')} {problem}" in message, message
        assert "refusing to load the state" in message and "run code as you" in message


# -- item 9: files hvdlite streams into are never opened through a link -------------------------
def test_output_files_refuse_links_and_other_names(tmp_path):
    from hvdlite.util.safe_files import open_for_writing

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "timeline.json"
    link.symlink_to(victim)
    with pytest.raises(
        OSError, match="timeline.json is a symbolic link: hvdlite does not write through links"
    ):
        open_for_writing(str(link))
    hard = tmp_path / "log.csv"
    os.link(victim, hard)
    with pytest.raises(OSError, match="log.csv has 2 names"):
        open_for_writing(str(hard), newline="")
    assert victim.read_text() == "precious\n"
    plain = tmp_path / "plain"
    plain.write_text("old and longer\n")
    with open_for_writing(str(plain)) as handle:
        handle.write("new\n")
    assert plain.read_text() == "new\n"


def test_the_autotune_log_and_the_timeline_refuse_a_link(tmp_path):
    from hvdlite.autotune.tuner import SampleLog
    from hvdlite.timeline.recorder import Timeline

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name, opener in (("tune.csv", SampleLog), ("timeline.json", Timeline)):
        (tmp_path / name).symlink_to(victim)
        with pytest.raises(OSError, match="is a symbolic link"):
            opener(str(tmp_path / name))
    assert victim.read_text() == "precious\n"


# -- item 10: the discovery script: no shell, its own session, bounded time and output ---------
def _script(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_a_discovery_script_path_is_never_read_by_a_shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = _script(tmp_path / "d;touch PWNED;" / "my discover.sh", "echo h1:2\n")
    assert ScriptDiscovery(str(script)).discover() == [Host("h1", 2)]
    assert not (tmp_path / "PWNED").exists()
    _script(tmp_path / "local.sh", "echo h2\n")  # a bare file name in the working directory
    assert ScriptDiscovery("local.sh").discover() == [Host("h2", 1)]
    settings_values = {"host_discovery_script": str(script), "np": None}
    from hvdlite.runner.elastic_settings import settings_from

    assert settings_from(settings_values, {}).discovery_script == str(script)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_discovery_script_that_hangs_is_killed_with_what_it_started(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = _script(tmp_path / "slow.sh", f"sleep 300 &\necho $! > {pidfile}\nsleep 300\n")
    started = time.monotonic()
    with pytest.raises(
        DiscoveryError, match="did not finish within 0.5 s .it and what it started were killed"
    ):
        ScriptDiscovery(str(script), timeout=0.5).discover()
    assert time.monotonic() - started < 5
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child), "the script's background child outlived the timeout"


def test_a_discovery_script_that_prints_without_end_is_stopped(tmp_path):
    script = _script(tmp_path / "loud.sh", "exec yes localhost:1\n")
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="printed more than 65536 bytes"):
        ScriptDiscovery(str(script), max_output=65536, timeout=20).discover()
    assert time.monotonic() - started < 5


# -- item 14: bounded host memory, failures said once, notices retried -----------------------
class _Churning:
    """A discovery source whose host names never repeat (cloud instances coming and going)."""

    dynamic, label = True, "churning"

    def __init__(self):
        self.calls = 0

    def discover(self):
        self.calls += 1
        return [Host(f"h{self.calls}-{i}", 1) for i in range(3)]


def test_host_memory_stays_bounded_when_names_churn():
    from hvdlite.runner.blacklist import Blacklist
    from hvdlite.runner.elastic_hosts import HostPool

    pool = HostPool(_Churning(), Blacklist(limit=10), None, limit=10)
    for _ in range(100):
        hosts = pool.available()
        assert len(hosts) == 3  # what is offered now always stays
        pool.record(hosts)
        pool.blacklist.add(hosts[0].name, "failed")
    assert len(pool._order) <= 10 and len(pool.used) <= 10
    assert len(pool.blacklist._entries) <= 100 and pool.blacklist.blocked("h100-0")


def test_a_notice_that_cannot_be_posted_is_retried(tmp_path, capsys):
    from hvdlite.runner.elastic_driver import _HostWatch
    from hvdlite.runner.blacklist import Blacklist
    from hvdlite.runner.discovery import FixedHosts
    from hvdlite.runner.elastic_hosts import HostPool

    job_dir = tmp_path / "job"  # missing at first: posting fails
    pool = HostPool(FixedHosts([Host("a", 2)], "test"), Blacklist(), None)
    watch = _HostWatch(pool, [Host("a", 1)], str(job_dir), 0, 0.05)
    watch.start()
    time.sleep(0.3)
    assert watch.is_alive() and watch.notice is None
    job_dir.mkdir()
    watch.join(timeout=5)
    assert watch.notice == "a:1 -> a:2" and (job_dir / "hosts-updated.0").exists()
    err = capsys.readouterr().err
    assert err.count("cannot post the host-update notice") == 1, err


def test_a_directory_fsync_failure_is_said_once(tmp_path, monkeypatch, capsys):
    def refuse(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(22, "Invalid argument")
        return real(fd)

    real = os.fsync
    monkeypatch.setattr(persistence, "_fsync_warned", False)
    monkeypatch.setattr(os, "fsync", refuse)
    store = CommitStore(str(tmp_path / "state"), "j")
    store.write(b"a", 1, 1)
    store.write(b"b", 2, 1)
    err = capsys.readouterr().err
    assert err.count(f"cannot fsync the directory {tmp_path} (Invalid argument)") == 1, err
    assert store.read().payload == b"b"


# -- item 4: a stale rank 0 of an earlier launch cannot write, and its late commit is refused --
def test_a_rank_of_an_earlier_launch_cannot_overwrite_the_state(tmp_path):
    path = str(tmp_path / layout.STATE_FILE)
    layout.record_launch(str(tmp_path), 0)
    CommitStore(path, "j", launch=0).write(b"first", 1, 2)
    assert CommitStore(path, "j").read().launch == 0
    layout.record_launch(str(tmp_path), 1)  # hvdrun started launch 1; launch 0 lives on
    with pytest.raises(
        persistence.StaleLaunchError, match="hvdrun has started launch 1 of this job since"
    ):
        CommitStore(path, "j", launch=0).write(b"stale", 2, 2)
    assert bytes(CommitStore(path, "j").read().payload) == b"first"
    CommitStore(path, "j", launch=1).write(b"current", 2, 2)  # the current launch writes
    assert CommitStore(path, "j").read().launch == 1


def test_a_commit_written_behind_hvdruns_back_is_refused_at_resume(tmp_path, monkeypatch):
    from hvdlite.elastic import ObjectState

    path = str(tmp_path / layout.STATE_FILE)
    CommitStore(path, "j", launch=1).write(pickle.dumps({"objects": {"step": 9}}), 4, 2)
    for name, value in {
        layout.JOB_DIR_VARIABLE: str(tmp_path),
        layout.JOB_ID_VARIABLE: "j",
        layout.GENERATION_VARIABLE: "2",
        layout.EXPECT_COMMIT_VARIABLE: "3",
    }.items():
        monkeypatch.setenv(name, value)
    state = ObjectState(get_rank=lambda: 0, bcast_object=lambda obj: obj, step=0)
    kind, _number, text = state._load_commit()
    assert (
        kind == "error"
        and "holds commit 4 of launch 1, written after hvdrun saw commit 3" in text
        and "a leftover rank of an earlier launch wrote it" in text
    )


_FULL_DISK_WRITE = """
import errno, json, os, resource, signal, sys
from hvdlite.elastic import layout
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (4, 4))
try:
    layout.record_launch(sys.argv[1], 12345)
except OSError as exc:
    print(json.dumps([exc.errno, exc.filename, sorted(os.listdir(sys.argv[1]))]))
"""


def test_hvdrun_s_own_state_write_that_fails_leaves_no_temporary_and_names_the_file(tmp_path):
    # Writes past a file-size limit fail as a full disk's do, with the file's name on the
    # error and no temporary left; hvdrun turns it into a message and exit 74.
    import subprocess
    import sys

    from hvdlite.runner.elastic_driver import GiveUp, _own_writes

    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_WRITE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    code, filename, left = json.loads(done.stdout)
    assert code == errno.EFBIG and filename == str(tmp_path / layout.LAUNCH_FILE), done
    assert left == [], left
    with pytest.raises(GiveUp) as caught, _own_writes(str(tmp_path), "job-1"):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "launch"))
    assert caught.value.code == layout.STATE_WRITE_EXIT == 74
    assert str(caught.value) == (
        f"hvdrun cannot write {tmp_path / 'launch'}: No space left on device (errno 28, "
        "ENOSPC). Free space or raise the quota there, then resume with --elastic-resume job-1"
    )
