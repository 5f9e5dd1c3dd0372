"""The per-rank task wrapper on its own (no MPI): output, status lines, signals, orphans."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid

import pytest
from helpers_runner.common import ROOT, clean_env, gone_within, processes_with, run

from hvdlite.runner import lifeline, protocol
from hvdlite.runner.cli import WRAPPER

PY = sys.executable


def _statuses(stderr, token=""):
    return [protocol.decode(line, token) for line in stderr.splitlines() if protocol.MARKER in line]


@pytest.mark.timeout(60)
def test_output_exit_code_and_status_lines():
    child = (
        "import sys; print('out line'); print('err line', file=sys.stderr); "
        "sys.stdout.write('no newline'); sys.exit(4)"
    )
    result = run(
        [PY, str(WRAPPER), "--tail", "3", "--", PY, "-c", child],
        env=clean_env(PMI_RANK="3", PMI_SIZE="4"),
    )
    assert result.returncode == 4
    assert result.stdout == "out line\nno newline"
    start, end = _statuses(result.stderr)
    assert start["event"] == "start" and start["rank"] == 3 and start["size"] == 4
    assert end["event"] == "exit" and end["code"] == 4 and end["signal"] is None
    assert end["stopped"] is False
    assert sorted(end["tail"]) == ["err line", "no newline", "out line"]
    assert "err line" in result.stderr


@pytest.mark.timeout(60)
def test_command_that_cannot_start():
    result = run([PY, str(WRAPPER), "--", "/nonexistent/program"])
    assert result.returncode == 127
    end = _statuses(result.stderr)[-1]
    assert end["code"] == 127 and "cannot run" in end["tail"][0]


@pytest.mark.timeout(60)
def test_sigterm_is_forwarded():
    child = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [PY, str(WRAPPER), "--", PY, "-c", child],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    end = _statuses(err)[-1]
    assert end["signal"] == signal.SIGTERM and end["signame"] == "SIGTERM" and end["stopped"]


@pytest.mark.timeout(60)
def test_rank_does_not_outlive_its_launcher():
    """If whatever started the wrapper dies (even by SIGKILL), the command is stopped."""
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    script = "import time; time.sleep(120)"
    # A shell stands in for the MPI proxy: it starts the wrapper and waits for it.
    proc = subprocess.Popen(
        ["sh", "-c", f'"{PY}" "{WRAPPER}" -- "{PY}" -c "{script}"; true'],
        env=clean_env(HVDLITE_TEST_MARKER=marker),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes_with(marker)) == 3  # sh, wrapper, command
    proc.kill()
    proc.wait()
    assert gone_within(marker, 15)


@pytest.mark.timeout(60)
def test_job_variables_are_used_and_hidden_from_the_command():
    child = (
        "import os; print([os.environ.get(n) for n in ('HVDLITE_JOB_TOKEN', 'HVDLITE_JOB_OWNER')])"
    )
    env = clean_env(HVDLITE_JOB_TOKEN="abc123", HVDLITE_JOB_OWNER=lifeline.identity())
    result = run([PY, str(WRAPPER), "--", PY, "-c", child], env=env)
    assert result.returncode == 0, result.output
    assert result.stdout == "[None, None]\n"
    assert [m["event"] for m in _statuses(result.stderr, "abc123")] == ["start", "exit"]
    assert _statuses(result.stderr, "") == [None, None]  # another job's token: not ours


_TF_NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795736095.233446   13806 port.cc:153] oneDNN custom operations are on.",
    "W0000 00:00:1795736095.233446   13806 cpu_feature_guard.cc:227] a warning",
    "E1126 23:28:34.123456   13806 some_file.cc:1] an error",
]


def test_tf_cpp_min_log_level_applies_to_the_lines_tensorflow_writes_before_reading_it():
    from hvdlite.runner.task_wrapper import native_log_level, quiet_native_lines

    block = "".join(line + "\n" for line in _TF_NOISE + ["an ordinary line"]).encode()
    kept = [quiet_native_lines(block, level).decode().splitlines() for level in range(4)]
    assert kept[0] == _TF_NOISE + ["an ordinary line"]
    assert kept[1] == _TF_NOISE[2:] + ["an ordinary line"]
    assert kept[2] == _TF_NOISE[3:] + ["an ordinary line"]
    assert kept[3] == ["an ordinary line"]
    assert [native_log_level(e) for e in ({}, {"TF_CPP_MIN_LOG_LEVEL": "2"})] == [0, 2]
    assert native_log_level({"TF_CPP_MIN_LOG_LEVEL": "lots"}) == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level", [None, "0"])
def test_a_rank_gets_torchruns_variables_and_tensorflows_info_lines_stay_out(level):
    child = (
        "import os, sys; "
        "print([os.environ.get(n) for n in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', "
        "'LOCAL_WORLD_SIZE', 'TF_CPP_MIN_LOG_LEVEL')]); "
        f"sys.stderr.write({chr(10).join(_TF_NOISE)!r} + chr(10))"
    )
    env = clean_env(PMI_RANK="3", PMI_SIZE="4", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # other tests of this process may have set it
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    result = run([PY, str(WRAPPER), "--", PY, "-c", child], env=env)
    assert result.returncode == 0, result.output
    assert result.stdout == str(["3", "1", "4", "2", level or "1"]) + "\n"
    shown = [line for line in _TF_NOISE if line in result.stderr]
    assert shown == (_TF_NOISE if level == "0" else _TF_NOISE[2:])


@pytest.mark.timeout(60)
def test_rank_does_not_outlive_hvdrun():
    """When hvdrun (the owner named in the environment) dies, the wrapper stops its command."""
    marker = f"hvdrun-test-{uuid.uuid4().hex}"
    owner = subprocess.Popen(["sleep", "60"])  # stands in for hvdrun
    env = clean_env(HVDLITE_TEST_MARKER=marker, HVDLITE_JOB_OWNER=lifeline.identity(owner.pid))
    proc = subprocess.Popen(
        [PY, str(WRAPPER), "--", PY, "-c", "import time; time.sleep(120)"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(processes_with(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(processes_with(marker)) == 2  # wrapper, command
        owner.kill()
        owner.wait()
        _out, err = proc.communicate(timeout=20)
    finally:
        owner.kill()
        clean = gone_within(marker, 10)
    assert proc.returncode == 128 + signal.SIGTERM
    assert _statuses(err)[-1]["stopped"] is True
    assert clean


@pytest.mark.timeout(60)
def test_owner_on_another_host_is_left_alone():
    other = f"not-this-boot:{os.getpid()}:1"
    result = run(
        [PY, str(WRAPPER), "--", PY, "-c", "import time; time.sleep(1.5)"],
        env=clean_env(HVDLITE_JOB_OWNER=other),
    )
    assert result.returncode == 0, result.output


def test_lifeline_identity():
    me = lifeline.identity()
    assert me is not None and me.split(":")[1] == str(os.getpid())
    assert lifeline.alive(me)
    child = subprocess.Popen(["true"])
    gone = lifeline.identity(child.pid)
    child.wait()
    assert gone is None or not lifeline.alive(gone)
    for bad in ("", "x", "a:b:c", me.replace(":", "", 1), "1:2:3:4"):
        assert not lifeline.alive(bad)


def test_protocol_round_trip():
    message = {
        "event": "exit",
        "rank": 1,
        "host": "h",
        "code": 3,
        "signal": None,
        "stopped": False,
        "time": 1.5,
        "tail": ["ünïcode", "x" * 10],
    }
    line = protocol.encode(message, "t0k").decode()
    assert line.endswith("\n") and line.isascii()
    assert protocol.decode("[1] " + line, "t0k") == message
    assert protocol.decode("[1,1]<stderr>: " + line, "t0k", size=2) == message
    assert protocol.decode("[1] " + line, "t0k", size=1) is None  # rank 1 of 1: no
    assert protocol.decode(line, "other") is None
    assert protocol.decode("an ordinary line", "t0k") is None
    assert json.loads(line.split(" ", 1)[1]) == message


_EXIT = {
    "event": "exit",
    "rank": 0,
    "host": "h",
    "code": 1,
    "signal": None,
    "stopped": False,
    "time": 1.0,
    "tail": [],
}


@pytest.mark.parametrize(
    "payload",
    [
        "{not json",
        "[1, 2]",
        '"exit"',
        "null",
        "[" * 100000,
        json.dumps({**_EXIT, "event": "finish"}),
        json.dumps({**_EXIT, "event": ["exit"]}),
        json.dumps({**_EXIT, "event": {"a": 1}}),
        json.dumps({**_EXIT, "rank": "0"}),
        json.dumps({**_EXIT, "rank": -1}),
        json.dumps({**_EXIT, "rank": True}),
        json.dumps({**_EXIT, "rank": 1.0}),
        json.dumps({**_EXIT, "code": "1"}),
        json.dumps({**_EXIT, "code": 256}),
        json.dumps({**_EXIT, "signal": "KILL"}),
        json.dumps({**_EXIT, "signal": 0}),
        json.dumps({**_EXIT, "time": "now"}),
        json.dumps({**_EXIT, "tail": "line"}),
        json.dumps({**_EXIT, "tail": [1]}),
        json.dumps({**_EXIT, "stopped": 1}),
        json.dumps({**_EXIT, "host": None}),
        json.dumps({**_EXIT, "signame": 9}),
        json.dumps({k: v for k, v in _EXIT.items() if k != "code"}),
        json.dumps({**_EXIT, "time": float("nan")}),
        json.dumps({**_EXIT, "time": float("inf")}),
        '{"event": "start", "rank": 0, "host": "h", "pid": 1, "size": 0}',
        '{"event": "start", "rank": 0, "host": "h", "size": 1}',
        '{"event": "mpi-begin", "rank": 0}',
        '{"event": "mpi-ready", "rank": 0, "host": 5}',
    ],
)
def test_protocol_rejects_bad_messages(payload):
    """A line with the right marker but bad JSON or bad fields is ordinary output."""
    assert protocol.decode(f"[0] {protocol.marker('tok')} {payload}", "tok", size=4) is None


def test_protocol_accepts_what_the_wrapper_writes():
    start = {"event": "start", "rank": 3, "host": "h", "pid": 7, "size": 4}
    mpi_begin = {"event": "mpi-begin", "rank": 2, "host": "h"}
    mpi_ready = {"event": "mpi-ready", "rank": 2, "host": "h"}
    for message in (
        start,
        mpi_begin,
        mpi_ready,
        _EXIT,
        {**_EXIT, "signal": 9, "signame": "SIGKILL", "code": 137},
        {**_EXIT, "signal": 9, "signame": "SIGKILL", "code": 137, "frozen": 30.5},
    ):
        assert protocol.decode(protocol.encode(message, "tok").decode(), "tok", 4) == message


_INIT_CHILD = (
    "import os, sys, hvdlite.start_report as r; "
    "assert r.START_FD_VARIABLE == 'HVDLITE_START_FD'; "
    "fd = os.environ.get('HVDLITE_START_FD'); "
    "r.begin(); r.ready(); r.ready(); "
    "print('fd', fd, 'left', os.environ.get('HVDLITE_START_FD'), flush=True)"
)


@pytest.mark.timeout(60)
def test_start_report_reaches_hvdrun_as_status_lines():
    # The child's begin/ready words come out as mpi-begin/mpi-ready status lines in
    # that order, between start and exit; the variable is gone from the child once
    # used, so nothing it starts writes to that descriptor number.
    env = clean_env(PMI_RANK="1", PMI_SIZE="2", HVDLITE_JOB_TOKEN="tok")
    result = run([PY, str(WRAPPER), "--", PY, "-c", _INIT_CHILD], env=env)
    assert result.returncode == 0, result.output
    events = [message["event"] for message in _statuses(result.stderr, "tok")]
    assert events == ["start", "mpi-begin", "mpi-ready", "exit"], result.output
    fd, left = result.stdout.split()[1::2]
    assert fd.split(":")[0].isdigit() and left == "None", result.stdout


@pytest.mark.timeout(60)
def test_start_report_without_hvdrun_does_nothing():
    # No token (not under hvdrun): no pipe and no variable.  A variable naming a
    # descriptor that is not the wrapper's pipe (here stdout, a pipe too) is ignored,
    # never written to.
    plain = run([PY, str(WRAPPER), "--", PY, "-c", _INIT_CHILD], env=clean_env())
    assert plain.returncode == 0 and plain.stdout.split()[1] == "None", plain.output
    other = "import hvdlite.start_report as r, os; r.begin(); r.ready(); print('ok')"
    for value in ("1", "1:1", "1:x", "x", "999:1"):
        result = run([PY, "-c", other], env=clean_env(HVDLITE_START_FD=value))
        assert result.returncode == 0 and result.stdout == "ok\n", (value, result.output)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("through_a_shell", [False, True])
def test_a_command_stopped_past_the_frozen_bound_is_killed_and_says_so(through_a_shell):
    # The command stops itself (SIGSTOP, as a frozen rank would be); with
    # --frozen-after 1 the wrapper kills it about a second later and its exit line
    # says how long it was stopped.  Through a shell the stopped process is not the
    # wrapper's child but a process of its group (found by the group scan).
    child = [PY, "-c", "import os, signal; print('up', flush=True); os.kill(os.getpid(), 19)"]
    if through_a_shell:
        child = ["sh", "-c", shlex.join(child) + "; echo after"]
    began = time.monotonic()
    result = run([PY, str(WRAPPER), "--frozen-after", "1", "--", *child], timeout=50)
    took = time.monotonic() - began
    end = _statuses(result.stderr)[-1]
    assert end["frozen"] is not None and end["frozen"] >= 1, result.output
    assert "up" in result.stdout and took < 40, (took, result.output)
    if not through_a_shell:
        assert result.returncode == 128 + signal.SIGKILL and end["signame"] == "SIGKILL"
    assert end["stopped"] is False, end


@pytest.mark.timeout(60)
def test_a_command_stopped_and_continued_in_time_is_left_alone():
    child = (
        "import os, signal, subprocess, sys, time; print('up', flush=True); "
        "subprocess.Popen(['sh', '-c', f'sleep 0.5; kill -CONT {os.getpid()}']); "
        "os.kill(os.getpid(), signal.SIGSTOP); print('continued', flush=True)"
    )
    result = run([PY, str(WRAPPER), "--frozen-after", "3", "--", PY, "-c", child], timeout=50)
    assert result.returncode == 0, result.output
    assert "continued" in result.stdout
    assert _statuses(result.stderr)[-1]["frozen"] is None
