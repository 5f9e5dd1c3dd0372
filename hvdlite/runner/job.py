"""Run a launcher command (mpiexec or srun) and watch it until every rank is done.

Contract of :func:`run_job`:

- the launcher runs in its own session, so a terminal's Ctrl-C reaches only
  hvdrun, which then stops the job in order: SIGTERM to the launcher (which
  passes it to every rank; each task wrapper gives its command
  ``task_wrapper.GRACE_SECONDS`` before SIGKILL), then, ``STOP_GRACE_SECONDS``
  later, SIGKILL to the launcher's process group (its proxies take their ranks
  with them).  A second Ctrl-C skips the wait.  The handlers for SIGINT,
  SIGTERM and SIGHUP are in place before the launcher starts, so a signal that
  arrives while it starts stops the job the same way;
- should hvdrun die without a chance to stop the job (SIGKILL), the ranks die
  too: the launcher gets SIGTERM from the kernel, and the task wrappers on this
  machine see hvdrun gone (see :mod:`lifeline`);
- the ranks' output is passed through (stdout to stdout, stderr to stderr),
  minus the wrappers' status lines, which hvdrun reads instead: lines with this
  job's token (``$HVDLITE_JOB_TOKEN``, made up here unless *env* has one) and
  valid fields (see :mod:`protocol`).  A line without a newline is passed on in
  pieces of at most ``MAX_PENDING_BYTES``, so its length never costs memory;
- the first rank that ends with a non-zero status stops the job the same way,
  and hvdrun prints a report of that rank (host, exit code or signal, last
  lines) and returns its exit code; the output before it is passed on with
  each rank's traceback in one piece and without MPICH's own notice of the
  failure (see :mod:`.output`);
- the start is bounded by ``start_timeout`` seconds twice over: every rank's
  process must have started that long after the launch, and, once the first
  rank's ``hvdlite.init()`` began to start MPI (``mpi-begin``), every rank must
  report MPI up (``mpi-ready``) within that long.  Otherwise the job is stopped,
  hvdrun names the ranks still missing and their hosts (as *placed*, rank ->
  host, where no status line named it) and returns 1.  A program that never
  calls ``hvdlite.init()`` has only the first bound;
- with ``silent_timeout`` (the task wrappers then say ``alive`` every
  ``protocol.beat_interval(silent_timeout)`` seconds), a rank that started and has not
  exited, from which no status line came for that long while other ranks were
  still heard, is taken as cut off:
  its host stopped, or its network link went down, and TCP would retry in
  silence while every other rank waits on it.  The job is stopped, hvdrun names
  those ranks and their hosts and returns 1, and :class:`JobOutcome` lists the
  hosts (``silent_hosts``);
- the return value is 0 when the launcher and all ranks succeeded, 128+N after
  signal N to hvdrun, otherwise non-zero;
- *quiet_codes* (elastic jobs): exit codes with which every rank leaves together
  on purpose (see :mod:`hvdlite.elastic.layout`); a rank that exits with one of
  them does not stop the job and is not reported as a failure, but should the
  other ranks not follow within ``QUIET_GRACE_SECONDS`` the job is stopped.
  :func:`run_job_outcome` returns what happened in detail (:class:`JobOutcome`);
  its *host_names* (rank -> host) names each rank's host as the caller placed it
  (the elastic loop's host list) instead of as the rank's machine calls itself,
  so that the report and the caller's decisions use one name.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from . import lifeline, protocol
from .output import OutputOrder
from .report import Failure, exit_code_of, first_failure, format_failure, format_launcher_failure

__all__ = [
    "run_job",
    "run_job_outcome",
    "JobOutcome",
    "format_start_timeout",
    "format_silent_hosts",
    "STOP_GRACE_SECONDS",
    "MAX_PENDING_BYTES",
]

STOP_GRACE_SECONDS = 8.0
QUIET_GRACE_SECONDS = 30.0
MAX_PENDING_BYTES = 64 * 1024  # more than any status line
_EOF_WAIT_SECONDS = 3.0
_TAIL_LINES = 200  # the fallback report picks one rank's lines out of these
_DUE_LOOK = 0.25  # how often a quiet stream lets go of held lines (see .output)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _LineBuffer:
    """Cuts one output stream into the pieces hvdrun passes on, holding at most *limit* bytes.

    :meth:`feed` returns ``(piece, whole_line)`` pairs: whole lines (which may be
    status lines), the progress-bar part of a line (up to its last ``\\r``), and,
    once a line without a newline outgrows *limit*, that line so far -- except
    for a status line that may still be arriving at its end.
    """

    def __init__(self, marker: bytes, limit: int = MAX_PENDING_BYTES) -> None:
        self.marker, self.limit = marker, limit
        self.pending = b""

    def _held_from(self, data: bytes) -> int:
        """Where the part of an over-long *data* that may be a status line begins."""
        at = data.rfind(self.marker)
        if at > 0 and len(data) - at <= self.limit:
            return at
        for size in range(min(len(self.marker) - 1, len(data)), 0, -1):
            if self.marker.startswith(data[-size:]):  # the read cut a marker short
                return len(data) - size
        return len(data)

    def feed(self, chunk: bytes) -> list[tuple[bytes, bool]]:
        data = self.pending + chunk
        cut = data.rfind(b"\n") + 1
        pieces = [(line + b"\n", True) for line in data[: cut - 1].split(b"\n")] if cut else []
        rest = data[cut:]
        bar = rest.rfind(b"\r") + 1  # a progress bar goes through at once
        if bar and self.marker not in rest:
            pieces.append((rest[:bar], False))
            rest = rest[bar:]
        if len(rest) > self.limit:
            held = self._held_from(rest)
            pieces.append((rest[:held], False))
            rest = rest[held:]
        self.pending = rest
        return pieces


class _Reader(threading.Thread):
    """Passes one output stream of the launcher through, picking out status lines."""

    def __init__(
        self,
        name: str,
        pipe: BinaryIO,
        sink: BinaryIO,
        events: queue.Queue,
        tail: collections.deque,
        token: str,
        np: int,
    ) -> None:
        super().__init__(daemon=True)
        self._name, self._pipe, self._sink = name, pipe, sink
        self._events, self._tail = events, tail
        self._token, self._np = token, np
        self.buffer = _LineBuffer(protocol.marker(token).encode())
        self.order = OutputOrder()
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
        message = protocol.decode(text, self._token, self._np)
        if message is not None:
            self._events.put(("status", message))
            return
        left_out = self.order.lines_left_out
        self._write_all(self.order.line(raw, text))
        if text.strip() and self.order.lines_left_out == left_out:
            self._tail.append((self._name, text.rstrip("\r\n")[: protocol.MAX_LINE_CHARS]))

    def _write_all(self, lines: list[bytes]) -> None:
        if lines:
            self._write(b"".join(lines))

    def run(self) -> None:
        fd = self._pipe.fileno()
        while True:
            try:
                ready = select.select([fd], [], [], _DUE_LOOK)[0]
                chunk = os.read(fd, 65536) if ready else None
            except InterruptedError:
                continue
            except (OSError, ValueError):
                break
            if chunk is None:
                self._write_all(self.order.due())
                continue
            if not chunk:
                break
            for piece, whole_line in self.buffer.feed(chunk):
                if whole_line:
                    self._line(piece)
                else:
                    self._write_all(self.order.flush() + [piece])
            self._write_all(self.order.due())
        if self.buffer.pending:
            self._line(self.buffer.pending)
        self._write_all(self.order.flush())
        self._events.put(("eof", None))


class _Job:
    def __init__(
        self,
        proc: subprocess.Popen,
        np: int,
        start_timeout: float,
        launcher: str,
        err: BinaryIO,
        signals: list[int],
        quiet_codes: Sequence[int] = (),
        host_names: Mapping[int, str] | None = None,
        placed: Mapping[int, str] | None = None,
        silent_timeout: float = 0.0,
    ) -> None:
        self.proc, self.np, self.start_timeout, self.launcher = proc, np, start_timeout, launcher
        self.silent_timeout = silent_timeout
        self.heard: dict[int, float] = {}  # rank -> when its last status line came
        self.silent: list[int] = []  # the ranks a silent-host stop was for
        self.err = err
        self.started: set[int] = set()
        self.failures: list[Failure] = []
        self.reason: str | None = None  # "failure", "signal", "start-timeout"
        self.signum: int | None = None
        self.stop_at: float | None = None
        self.killed = False
        self.pending_signals = signals  # filled by the signal handlers
        self.quiet_codes = frozenset(quiet_codes)
        self.quiet_exits: dict[int, int] = {}  # rank -> its quiet exit code
        self.quiet_since: float | None = None
        self.host_names = dict(host_names or {})
        self.placed = dict(placed or {})
        self.hosts: dict[int, str] = {}  # rank -> host, as its status lines say
        self.exited: set[int] = set()
        self.mpi_begun_at: float | None = None  # when the first rank began to start MPI
        self.mpi_begun: set[int] = set()
        self.mpi_ready: set[int] = set()
        self.start_phase: str | None = None  # "process" or "mpi", for a start-timeout
        self.start_missing: tuple[list[int], list[int]] = ([], [])  # see silent_and_stuck

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
        if rank in self.host_names:
            message = {**message, "host": self.host_names[rank]}
        event = message.get("event")
        if isinstance(rank, int) and message.get("host"):
            self.hosts[rank] = message["host"]
        if isinstance(rank, int):
            self.heard[rank] = time.monotonic()
        if event == "exit":
            self.exited.add(rank)
        if event == "start" and isinstance(rank, int):
            self.started.add(rank)
        elif event == "mpi-begin":
            self.mpi_begun.add(rank)
            if self.mpi_begun_at is None:
                self.mpi_begun_at = time.monotonic()
        elif event == "mpi-ready":
            self.mpi_ready.add(rank)
        elif message.get("event") == "exit" and message.get("code") in self.quiet_codes:
            self.quiet_exits[rank] = message["code"]
            if self.quiet_since is None:
                self.quiet_since = time.monotonic()
        elif message.get("event") == "exit" and message.get("code"):
            self.failures.append(Failure.from_message(message))
            if self.reason is None:
                self.stop("failure")

    def mpi_waiting(self) -> list[int]:
        """Ranks whose MPI start is still awaited (not ready, not exited)."""
        return sorted(set(range(self.np)) - self.mpi_ready - self.exited)

    def silent_and_stuck(self) -> tuple[list[int], list[int]]:
        """The ranks a timed-out start waited for: those never heard from in that
        phase (no process; no word from hvdlite.init()), and those that began to
        start MPI but did not finish (often waiting on the silent ones)."""
        if self.start_phase == "process":
            return sorted(set(range(self.np)) - self.started), []
        waiting = self.mpi_waiting()
        silent = [rank for rank in waiting if rank not in self.mpi_begun]
        return silent, [rank for rank in waiting if rank in self.mpi_begun]

    def silent_ranks(self, now: float, bound: float | None = None) -> list[int]:
        """Ranks that started, have not exited, and said nothing for *bound* seconds
        (default ``silent_timeout``) while another rank was heard in the last half of
        ``silent_timeout``.  When every rank is quiet
        the fault is on the path to hvdrun itself (its output not read, the launcher
        hung), which no relaunch on other hosts would mend: that is no silent host."""
        quiet = {rank: now - self.heard.get(rank, now) for rank in self.started - self.exited}
        if not any(age < self.silent_timeout / 2 for age in quiet.values()):
            return []
        bound = self.silent_timeout if bound is None else bound
        return sorted(rank for rank, age in quiet.items() if age > bound)

    def silent_hosts(self) -> tuple[str, ...]:
        """The hosts of the silent ranks, each once, in rank order."""
        return tuple(_ranks_by_host(self, self.silent)) if self.reason == "silent-host" else ()

    def host_of(self, rank: int) -> str | None:
        return self.host_names.get(rank) or self.hosts.get(rank) or self.placed.get(rank)

    def on_tick(self, started_at: float) -> None:
        while self.pending_signals:
            signum = self.pending_signals.pop(0)
            if self.reason == "failure":  # already stopping because a rank failed
                self.kill()
            elif self.signum is None:
                self.signum = signum
                self.reason = "signal"
                self.say(
                    f"hvdrun: got {signal.Signals(signum).name}: stopping all ranks "
                    "(again to kill them at once)\n"
                )
                self.stop("signal")
            else:
                self.kill()
        now = time.monotonic()
        if self.reason is None and self.start_phase is None:
            if len(self.started) < self.np and now - started_at > self.start_timeout:
                self.start_phase = "process"
            elif (
                self.mpi_begun_at is not None
                and self.mpi_waiting()
                and now - self.mpi_begun_at > self.start_timeout
            ):
                self.start_phase = "mpi"
            if self.start_phase is not None:
                self.start_missing = self.silent_and_stuck()  # before the stop's exits
                self.stop("start-timeout")
        if self.reason is None and self.silent_timeout > 0:
            silent = self.silent_ranks(now)
            if silent:  # the report adds their host-mates that fell quiet with them
                hosts = {self.host_of(rank) for rank in silent}
                quiet = self.silent_ranks(now, self.silent_timeout / 2)
                self.silent = sorted(set(silent) | {r for r in quiet if self.host_of(r) in hosts})
                self.stop("silent-host")
        if (
            self.reason is None
            and self.quiet_since is not None
            and now - self.quiet_since > QUIET_GRACE_SECONDS
        ):
            self.stop("quiet-timeout")  # some ranks left on purpose, the others hang
        if self.stop_at is not None and now - self.stop_at > STOP_GRACE_SECONDS:
            self.kill()


def _launch(cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start the launcher in its own session; it gets SIGTERM should this process die."""
    return subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        start_new_session=True,
        preexec_fn=lifeline.parent_death_signal(signal.SIGTERM),
    )


def _catch_stop_signals(into: list[int]) -> dict:
    """Queue SIGINT/SIGTERM/SIGHUP in *into* from now on; the previous handlers by signal."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {
        signum: signal.signal(signum, lambda s, _frame: into.append(s)) for signum in _STOP_SIGNALS
    }


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a job ended: ``code`` is what :func:`run_job` returns; ``reason`` is None
    (the ranks ended by themselves), "failure", "signal", "start-timeout",
    "silent-host" or "quiet-timeout"; ``failure`` the first failing rank (None
    when none failed); ``quiet_exits`` rank -> quiet code for the ranks that left
    with one; ``failures`` every rank that reported a non-zero status;
    ``silent_hosts`` the hosts a "silent-host" stop was for."""

    code: int
    reason: str | None
    failure: Failure | None
    quiet_exits: dict
    signum: int | None = None
    failures: tuple = ()
    silent_hosts: tuple = ()


def run_job(
    cmd: Sequence[str],
    env: Mapping[str, str],
    *,
    np: int,
    start_timeout: float = 30.0,
    out: BinaryIO | None = None,
    err: BinaryIO | None = None,
    placed: Mapping[int, str] | None = None,
    silent_timeout: float = 0.0,
) -> int:
    """Run *cmd* (a launcher command whose ranks run the task wrapper); see the module doc."""
    return run_job_outcome(
        cmd,
        env,
        np=np,
        start_timeout=start_timeout,
        out=out,
        err=err,
        placed=placed,
        silent_timeout=silent_timeout,
    ).code


def run_job_outcome(
    cmd: Sequence[str],
    env: Mapping[str, str],
    *,
    np: int,
    start_timeout: float = 30.0,
    out: BinaryIO | None = None,
    err: BinaryIO | None = None,
    quiet_codes: Sequence[int] = (),
    host_names: Mapping[int, str] | None = None,
    placed: Mapping[int, str] | None = None,
    silent_timeout: float = 0.0,
) -> JobOutcome:
    """:func:`run_job`, returning a :class:`JobOutcome` (see the module doc)."""
    signals: list[int] = []
    previous = _catch_stop_signals(signals)  # first: nothing may start unguarded
    try:
        return _run(
            cmd,
            env,
            np,
            start_timeout,
            out if out is not None else sys.stdout.buffer,
            err if err is not None else sys.stderr.buffer,
            signals,
            quiet_codes,
            host_names,
            placed,
            silent_timeout,
        )
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _run(
    cmd: Sequence[str],
    env: Mapping[str, str],
    np: int,
    start_timeout: float,
    out: BinaryIO,
    err: BinaryIO,
    signals: list[int],
    quiet_codes: Sequence[int] = (),
    host_names: Mapping[int, str] | None = None,
    placed: Mapping[int, str] | None = None,
    silent_timeout: float = 0.0,
) -> JobOutcome:
    token = env.get(protocol.TOKEN_VARIABLE) or protocol.new_token()
    env = {
        **env,
        protocol.TOKEN_VARIABLE: token,
        lifeline.OWNER_VARIABLE: lifeline.identity() or "",
    }
    events: queue.Queue = queue.Queue()
    tail: collections.deque[tuple[str, str]] = collections.deque(maxlen=_TAIL_LINES)
    started_at, wall_start = time.monotonic(), time.time()
    proc = _launch(cmd, env)
    job = _Job(
        proc,
        np,
        start_timeout,
        os.path.basename(cmd[0]),
        err,
        signals,
        quiet_codes,
        host_names,
        placed or host_names,
        silent_timeout,
    )
    readers = [
        _Reader("stdout", proc.stdout, out, events, tail, token, np),
        _Reader("stderr", proc.stderr, err, events, tail, token, np),
    ]
    for reader in readers:
        reader.start()
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
                    job.kill()  # what the launcher left behind holds its pipes open
                    break
        returncode = proc.wait()
        while True:  # statuses that arrived with the last output
            try:
                kind, payload = events.get_nowait()
            except queue.Empty:
                break
            if kind == "status":
                job.on_status(payload)
    finally:
        if proc.poll() is None:
            job.kill()
            proc.wait()
    notices = sum(reader.order.notices_left_out for reader in readers)
    code = _conclude(job, returncode, wall_start, tail, notices)
    return JobOutcome(
        code,
        job.reason,
        first_failure(job.failures),
        dict(job.quiet_exits),
        job.signum,
        tuple(job.failures),
        job.silent_hosts(),
    )


def _conclude(job: _Job, returncode: int, wall_start: float, tail, notices: int = 0) -> int:
    if job.reason == "signal":
        job.say(f"hvdrun: stopped all ranks after {signal.Signals(job.signum).name}\n")
        return 128 + job.signum
    if job.reason == "start-timeout":
        job.say(format_start_timeout(job))
        return 1
    if job.reason == "silent-host":
        job.say(format_silent_hosts(job))
        return 1
    failure = first_failure(job.failures)
    if failure is None and job.quiet_exits:  # left on purpose: the caller says why
        return next(iter(job.quiet_exits.values()))
    if failure is not None:
        elapsed = max(failure.time - wall_start, 0.0)
        job.say(format_failure(failure, elapsed, len(job.failures), job.np, notices))
        return exit_code_of(failure)
    if returncode != 0:
        job.say(format_launcher_failure(job.launcher, returncode, list(tail), notices))
        return returncode if 0 < returncode < 256 else 1
    return 0


def _ranks_by_host(job: _Job, ranks: Sequence[int]) -> dict[str, list[int]]:
    by_host: dict[str, list[int]] = {}
    for rank in ranks:
        by_host.setdefault(job.host_of(rank) or "an unknown host", []).append(rank)
    return by_host


def _where(by_host: Mapping[str, list[int]]) -> str:
    return "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on {host}"
        for host, ranks in by_host.items()
    )


def format_start_timeout(job: _Job) -> str:
    """hvdrun's report of a start that did not finish within --start-timeout: which
    ranks it waited for, on which hosts (the silent ones named as the hosts that did
    not answer), and what to check."""
    silent, stuck = job.start_missing
    silent_hosts, stuck_hosts = _ranks_by_host(job, silent), _ranks_by_host(job, stuck)
    if job.start_phase == "process":
        lines = [
            f"only {len(job.started)} of {job.np} ranks started within "
            f"{job.start_timeout:g} s (--start-timeout); no word from {_where(silent_hosts)}"
        ]
        check = "Check the host names, that they are reachable, and the launcher's messages above."
    else:
        lines = [
            f"MPI did not start on every rank within {job.start_timeout:g} s "
            "(--start-timeout) of the first rank's hvdlite.init()"
        ]
        if silent:
            lines.append(f"never began to start MPI: {_where(silent_hosts)}")
        if stuck:
            lines.append(f"began but did not finish: {_where(stuck_hosts)}")
        check = (
            "Check that those hosts are up and reach the others over the network MPI "
            "uses (--network-interface), that no rank is stopped, and the MPI messages above."
        )
    answered = [host for host in (silent_hosts or stuck_hosts) if host != "an unknown host"]
    lines.append(
        f"hosts that did not answer: {', '.join(answered) or 'unknown'}; stopped the job. {check}"
    )
    return "".join(f"hvdrun: {line}\n" for line in lines)


def format_silent_hosts(job: _Job) -> str:
    """hvdrun's report of ranks it stopped hearing from (``silent_timeout``): which,
    on which hosts, what it means and what to check."""
    by_host = _ranks_by_host(job, job.silent)
    named = [host for host in by_host if host != "an unknown host"]
    return (
        f"hvdrun: no word for {job.silent_timeout:g} s (--silent-host-timeout) from "
        f"{_where(by_host)}: the host{'s' if len(named) > 1 else ''} "
        f"{', '.join(named) or 'unknown'} stopped answering (down, hung, or its network "
        "link cut), while the other ranks wait on it; stopped the job.\n"
        "hvdrun: Check that the host is up and reaches this one over the network; "
        "an elastic job relaunches without a host ssh cannot log in to.\n"
    )
