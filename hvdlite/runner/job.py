"""Run a launcher command (mpiexec or srun) and watch it until every rank is done.

Contract of :func:`run_job`:

- the launcher runs in its own session, so a terminal's Ctrl-C reaches only
  hvdrun, which then stops the job in order: SIGTERM to the launcher (which
  passes it to every rank; each task wrapper gives its command
  ``task_wrapper.GRACE_SECONDS`` before SIGKILL), then, ``STOP_GRACE_SECONDS``
  later, SIGKILL to the launcher's process group (its proxies take their ranks
  with them).  A second Ctrl-C skips the wait;
- the ranks' output is passed through (stdout to stdout, stderr to stderr),
  minus the wrappers' status lines, which hvdrun reads instead;
- the first rank that ends with a non-zero status stops the job the same way,
  and hvdrun prints a report of that rank (host, exit code or signal, last
  lines) and returns its exit code;
- if not every rank has started after ``start_timeout`` seconds, the job is
  stopped and hvdrun returns 1;
- the return value is 0 when the launcher and all ranks succeeded, 128+N after
  signal N to hvdrun, otherwise non-zero.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from . import protocol
from .report import (Failure, exit_code_of, first_failure, format_failure,
                     format_launcher_failure)

__all__ = ["run_job", "STOP_GRACE_SECONDS"]

STOP_GRACE_SECONDS = 8.0
_EOF_WAIT_SECONDS = 3.0
_TAIL_LINES = 200  # the fallback report picks one rank's lines out of these
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Reader(threading.Thread):
    """Passes one output stream of the launcher through, picking out status lines."""

    def __init__(self, name: str, pipe: BinaryIO, sink: BinaryIO, events: queue.Queue,
                 tail: collections.deque) -> None:
        super().__init__(daemon=True)
        self._name, self._pipe, self._sink = name, pipe, sink
        self._events, self._tail = events, tail
        self._sink_ok = True

    def _write(self, data: bytes) -> None:
        if self._sink_ok:
            try:
                self._sink.write(data)
                self._sink.flush()
            except (OSError, ValueError):
                self._sink_ok = False

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        message = protocol.decode(text) if protocol.MARKER in text else None
        if message is not None:
            self._events.put(("status", message))
            return
        self._write(raw)
        if text.strip():
            self._tail.append((self._name, text.rstrip("\r\n")))

    def run(self) -> None:
        fd, pending = self._pipe.fileno(), b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            pending += chunk
            lines = pending.split(b"\n")
            pending = lines.pop()
            for line in lines:
                self._line(line + b"\n")
            # A progress bar ('\r' without '\n') goes through at once.
            cut = pending.rfind(b"\r") + 1
            if cut and protocol.MARKER.encode() not in pending:
                self._write(pending[:cut])
                pending = pending[cut:]
        if pending:
            self._line(pending)
        self._events.put(("eof", None))


class _Job:
    def __init__(self, proc: subprocess.Popen, np: int, start_timeout: float,
                 launcher: str, err: BinaryIO) -> None:
        self.proc, self.np, self.start_timeout, self.launcher = proc, np, start_timeout, launcher
        self.err = err
        self.started: set[int] = set()
        self.failures: list[Failure] = []
        self.reason: str | None = None  # "failure", "signal", "start-timeout"
        self.signum: int | None = None
        self.stop_at: float | None = None
        self.killed = False
        self.pending_signals: list[int] = []

    def say(self, text: str) -> None:
        try:
            self.err.write(text.encode())
            self.err.flush()
        except (OSError, ValueError):
            pass

    def stop(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        if self.stop_at is None:
            self.stop_at = time.monotonic()
            try:
                self.proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def kill(self) -> None:
        if not self.killed:
            self.killed = True
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def on_status(self, message: dict) -> None:
        rank = message.get("rank")
        if message.get("event") == "start" and isinstance(rank, int):
            self.started.add(rank)
        elif message.get("event") == "exit" and message.get("code"):
            self.failures.append(Failure.from_message(message))
            if self.reason is None:
                self.stop("failure")

    def on_tick(self, started_at: float) -> None:
        while self.pending_signals:
            signum = self.pending_signals.pop(0)
            if self.reason == "failure":  # already stopping because a rank failed
                self.kill()
            elif self.signum is None:
                self.signum = signum
                self.reason = "signal"
                self.say(f"hvdrun: got {signal.Signals(signum).name}: stopping all ranks "
                         "(again to kill them at once)\n")
                self.stop("signal")
            else:
                self.kill()
        now = time.monotonic()
        if (self.reason is None and len(self.started) < self.np
                and now - started_at > self.start_timeout):
            self.stop("start-timeout")
        if self.stop_at is not None and now - self.stop_at > STOP_GRACE_SECONDS:
            self.kill()


def _launch(cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        list(cmd), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=dict(env), start_new_session=True,
    )


def run_job(cmd: Sequence[str], env: Mapping[str, str], *, np: int,
            start_timeout: float = 30.0, out: BinaryIO | None = None,
            err: BinaryIO | None = None) -> int:
    """Run *cmd* (a launcher command whose ranks run the task wrapper); see the module doc."""
    out = out if out is not None else sys.stdout.buffer
    err = err if err is not None else sys.stderr.buffer
    events: queue.Queue = queue.Queue()
    tail: collections.deque[tuple[str, str]] = collections.deque(maxlen=_TAIL_LINES)
    started_at, wall_start = time.monotonic(), time.time()
    proc = _launch(cmd, env)
    job = _Job(proc, np, start_timeout, os.path.basename(cmd[0]), err)
    readers = [_Reader("stdout", proc.stdout, out, events, tail),
               _Reader("stderr", proc.stderr, err, events, tail)]
    for reader in readers:
        reader.start()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _STOP_SIGNALS:
            previous[signum] = signal.signal(
                signum, lambda s, _f: job.pending_signals.append(s))
    try:
        eofs, exited_at = 0, None
        while eofs < len(readers):
            try:
                kind, payload = events.get(timeout=0.1)
            except queue.Empty:
                kind, payload = None, None
            if kind == "status":
                job.on_status(payload)
            elif kind == "eof":
                eofs += 1
            job.on_tick(started_at)
            if proc.poll() is not None:
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > _EOF_WAIT_SECONDS:
                    break  # something the launcher left behind holds its pipes open
        returncode = proc.wait()
        while True:  # statuses that arrived with the last output
            try:
                kind, payload = events.get_nowait()
            except queue.Empty:
                break
            if kind == "status":
                job.on_status(payload)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if proc.poll() is None:
            job.kill()
            proc.wait()
    return _conclude(job, returncode, wall_start, tail)


def _conclude(job: _Job, returncode: int, wall_start: float, tail) -> int:
    if job.reason == "signal":
        job.say(f"hvdrun: stopped all ranks after {signal.Signals(job.signum).name}\n")
        return 128 + job.signum
    if job.reason == "start-timeout":
        job.say(
            f"hvdrun: only {len(job.started)} of {job.np} ranks started within "
            f"{job.start_timeout:g} s (--start-timeout); stopped the job. Check the host "
            "names, that they are reachable, and the launcher's messages above.\n")
        return 1
    failure = first_failure(job.failures)
    if failure is not None:
        elapsed = max(failure.time - wall_start, 0.0)
        job.say(format_failure(failure, elapsed, len(job.failures), job.np))
        return exit_code_of(failure)
    if returncode != 0:
        job.say(format_launcher_failure(job.launcher, returncode, list(tail)))
        return returncode if 0 < returncode < 256 else 1
    return 0
