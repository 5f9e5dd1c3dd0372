"""The per-rank task wrapper on its own (no MPI): output, status lines, signals, orphans."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from helpers_runner.common import ROOT, clean_env, processes_with, run

from hvdlite.runner import protocol
from hvdlite.runner.cli import WRAPPER

PY = sys.executable


def _statuses(stderr):
    return [protocol.decode(line) for line in stderr.splitlines() if protocol.MARKER in line]


@pytest.mark.timeout(60)
def test_output_exit_code_and_status_lines():
    child = ("import sys; print('out line'); print('err line', file=sys.stderr); "
             "sys.stdout.write('no newline'); sys.exit(4)")
    result = run([PY, str(WRAPPER), "--tail", "3", "--", PY, "-c", child],
                 env=clean_env(PMI_RANK="3", PMI_SIZE="4"))
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
    proc = subprocess.Popen([PY, str(WRAPPER), "--", PY, "-c", child], cwd=ROOT, env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
    proc = subprocess.Popen(["sh", "-c", f'"{PY}" "{WRAPPER}" -- "{PY}" -c "{script}"; true'],
                            env=clean_env(HVDLITE_TEST_MARKER=marker),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(processes_with(marker)) == 3  # sh, wrapper, command
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 15
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left


def test_protocol_round_trip():
    message = {"event": "exit", "rank": 1, "tail": ["ünïcode", "x" * 10]}
    line = protocol.encode(message).decode()
    assert line.endswith("\n") and line.isascii()
    assert protocol.decode("[1] " + line) == message
    assert protocol.decode("[1,1]<stderr>: " + line) == message
    assert protocol.decode("an ordinary line") is None
    assert protocol.decode(protocol.MARKER + " {not json") is None
    assert json.loads(line.split(" ", 1)[1]) == message
