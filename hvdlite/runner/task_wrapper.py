"""The per-rank wrapper hvdrun starts under mpiexec/srun: ``task_wrapper.py [opts] -- cmd...``.

Contract, for each rank:

- runs *cmd* as a child (same environment, plus ``PYTHONUNBUFFERED=1`` unless
  set, so a crash does not swallow the last lines, ``TF_CPP_MIN_LOG_LEVEL=1``
  unless set, so TensorFlow's C++ INFO lines stay out, and torchrun's ``RANK``,
  ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` from what the launcher
  said), with every inherited file descriptor kept (PMI passes its socket as
  ``PMI_FD``);
- copies the child's stdout and stderr to its own, whole lines at a time (the
  MPI launcher adds the rank prefix), optionally also to
  ``<output-dir>/rank.<N>/stdout|stderr``, and keeps the last lines; with
  ``--timestamp`` every line it passes on starts with the time it was read
  (``Mon Jan 20 12:00:01 2020``, as horovodrun's ``--prefix-output-with-timestamp``);
- forwards SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to the child's
  process group; after a stop signal the child gets ``GRACE_SECONDS`` to exit,
  then SIGKILL.  If the launcher above it disappears, or hvdrun itself (named
  by ``$HVDLITE_JOB_OWNER`` and running on this machine, see :mod:`lifeline`),
  that counts as SIGTERM, and the child is set to receive SIGKILL should the
  wrapper itself be killed: no rank outlives its job;
- with ``--frozen-after S`` (hvdrun's ``--frozen-timeout``), kills the child's
  process group once one of its processes has been stopped (SIGSTOP) for S
  seconds (:mod:`process_state`): a frozen rank would hold its peers forever,
  and its exit line then says how long it was stopped (``frozen``);
- with ``--beat S`` (hvdrun's ``--silent-host-timeout``), writes an ``alive``
  status line every S seconds while the child runs: the wrapper, not the
  child, so a rank busy in a long step or stopped is still heard; what stops
  the lines is a host, or its network link, that stopped answering;
- hands the child a pipe named by ``$HVDLITE_START_FD``, on which ``hvdlite.init()``
  says when it begins and when it has finished starting MPI
  (``hvdlite/start_report.py``), and passes each word on to hvdrun as a status
  line, which is how hvdrun's ``--start-timeout`` sees an MPI start that hangs;
- writes a status line (see :mod:`protocol`; the job's token comes from
  ``$HVDLITE_JOB_TOKEN``) to stderr when the child starts and when it ends
  (rank, host, exit code or signal, whether it was told to stop, the last
  lines) and exits with the child's code (128+N for signal N).  The child's
  environment has neither ``HVDLITE_JOB_*`` variable;
- applies ``TF_CPP_MIN_LOG_LEVEL`` to the C++ log lines (absl's format) of the
  child's stderr: TensorFlow writes some before it reads that variable itself
  (:func:`quiet_native_lines`).

It is run as a plain file, not as ``-m hvdlite.runner.task_wrapper``, so that it
imports nothing but the standard library and its sibling modules: importing the
``hvdlite`` package (numpy, possibly MPI) in every wrapper would cost start-up
time and must never initialize MPI in the wrong process.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

try:
    from . import lifeline, process_state, protocol, rankenv
    from ..util.safe_files import open_for_writing
except ImportError:  # run as a plain file: siblings are on sys.path[0], and hvdlite/util
    import lifeline  # type: ignore[no-redef]
    import protocol  # type: ignore[no-redef]
    import process_state  # type: ignore[no-redef]
    import rankenv  # type: ignore[no-redef]

    # safe_files sits in hvdlite/util (below the engine's writers too): standard library only
    sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "util"))
    from safe_files import open_for_writing  # type: ignore[no-redef]

__all__ = ["main", "GRACE_SECONDS"]

GRACE_SECONDS = 5.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
FORWARD_SIGNALS = STOP_SIGNALS + (signal.SIGUSR1, signal.SIGUSR2)
_CHUNK = 65536


_WRITE_LOCK = threading.Lock()  # a status line never lands inside a block of output


def _write_all(fd: int, data: bytes) -> bool:
    """Write *data* to *fd* in one piece among this wrapper's threads; False once the
    reader is gone."""
    view = memoryview(data)
    with _WRITE_LOCK:
        while view:
            try:
                view = view[os.write(fd, view) :]
            except InterruptedError:
                continue
            except OSError:
                return False
    return True


class _Tail:
    """The last lines a rank printed (both streams, in arrival order)."""

    def __init__(self, size: int) -> None:
        self.size = max(size, 1)
        self._lines: collections.deque[str] = collections.deque(maxlen=self.size)
        self._lock = threading.Lock()

    def add(self, line: bytes) -> None:
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        with self._lock:
            self._lines.append(text[: protocol.MAX_LINE_CHARS])

    def lines(self) -> list[str]:
        with self._lock:
            return list(self._lines)


# A line of absl's C++ log format (TensorFlow, XLA): severity letter, date, time
# (before absl is set up: date 0000 and the seconds since 1970), thread,
# file:line].  TensorFlow writes such lines before its own log set-up has read
# TF_CPP_MIN_LOG_LEVEL, announced by absl's one-line notice.
_ABSL_LINE = re.compile(rb"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [^\s:\]]+:\d+\] ")
_ABSL_NOTICE = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}


def native_log_level(environ) -> int:
    """TF_CPP_MIN_LOG_LEVEL as a number (0 shows everything; unset or bad: 0)."""
    try:
        return max(0, int(environ.get("TF_CPP_MIN_LOG_LEVEL", "0")))
    except ValueError:
        return 0


def quiet_native_lines(block: bytes, level: int) -> bytes:
    """*block* (whole lines) without the absl-format lines below *level* and, from
    level 1, absl's notice that precedes them: TF_CPP_MIN_LOG_LEVEL applied to the
    lines TensorFlow writes before it reads that variable itself."""
    if level <= 0 or (b"] " not in block and _ABSL_NOTICE not in block):
        return block
    kept = []
    for line in block.splitlines(keepends=True):
        if line.rstrip(b"\r\n") == _ABSL_NOTICE:
            continue
        match = _ABSL_LINE.match(line)
        if match and _SEVERITY[match.group(1)] < level:
            continue
        kept.append(line)
    return b"".join(kept)


class _Pump(threading.Thread):
    """Copies one pipe to *out_fd* (and a log file) in whole lines."""

    def __init__(
        self,
        pipe,
        out_fd: int,
        tail: _Tail,
        log_path: str | None,
        timestamp: bool = False,
        native_level: int = 0,
    ) -> None:
        super().__init__(daemon=True)
        self._pipe, self._out_fd, self._tail = pipe, out_fd, tail
        self._log = open_for_writing(log_path, binary=True) if log_path else None
        self._alive = True
        self._timestamp = timestamp
        self._native_level = native_level

    def _stamped(self, block: bytes) -> bytes:
        if not self._timestamp:
            return block
        stamp = time.strftime("%a %b %d %H:%M:%S %Y ").encode()
        return b"".join(stamp + line for line in block.splitlines(keepends=True))

    def _emit(self, block: bytes) -> None:
        block = quiet_native_lines(block, self._native_level)
        if not block:
            return
        out = self._stamped(block)
        if self._alive:
            self._alive = _write_all(self._out_fd, out)
        if self._log is not None:
            self._log.write(out)
            self._log.flush()
        for line in block.replace(b"\r", b"\n").split(b"\n")[-self._tail.size :]:
            if line.strip():
                self._tail.add(line)

    def run(self) -> None:
        fd = self._pipe.fileno()
        pending = b""
        try:
            while True:
                try:
                    chunk = os.read(fd, _CHUNK)
                except InterruptedError:
                    continue
                if not chunk:
                    break
                pending += chunk
                # Pass on complete lines only ('\r' ends a progress-bar line too),
                # so the launcher's rank prefix never lands mid-line.
                cut = max(pending.rfind(b"\n"), pending.rfind(b"\r")) + 1
                if cut == 0 and len(pending) > _CHUNK:  # an endless line: let it through
                    cut = len(pending)
                if cut:
                    self._emit(pending[:cut])
                    pending = pending[cut:]
            if pending:
                self._emit(pending)
        finally:
            if self._log is not None:
                self._log.close()


def _child_setup():
    """What the child runs between fork and exec: its own process group (so signals
    reach everything it starts) and, on Linux, SIGKILL when the wrapper dies."""
    on_wrapper_death = lifeline.parent_death_signal(signal.SIGKILL)

    def setup() -> None:
        os.setpgid(0, 0)
        on_wrapper_death()

    return setup


class _Supervisor:
    """Owns the child: forwards signals, escalates to SIGKILL, watches launcher and
    hvdrun, and kills a child that stays stopped for *frozen_after* seconds (0: never)."""

    def __init__(self, child: subprocess.Popen, owner: str | None, frozen_after: float = 0.0):
        self.child, self._owner = child, owner
        self.stopped = False
        self.frozen: float | None = None  # seconds the child was stopped when killed for it
        self._frozen_after = frozen_after
        self._parent = os.getppid()
        self._lock = threading.Lock()

    def signal_child(self, signum: int) -> None:
        try:
            os.killpg(self.child.pid, signum)
        except (ProcessLookupError, PermissionError):
            try:
                self.child.send_signal(signum)
            except OSError:
                pass

    def stop(self, signum: int) -> None:
        with self._lock:
            first = not self.stopped
            self.stopped = True
        self.signal_child(signum)
        if first:
            timer = threading.Timer(GRACE_SECONDS, self.signal_child, (signal.SIGKILL,))
            timer.daemon = True
            timer.start()

    def on_signal(self, signum: int, _frame) -> None:
        if signum in STOP_SIGNALS:
            self.stop(signum)
        else:
            self.signal_child(signum)

    def watch(self) -> None:
        """Stop the child once the launcher (our parent) or hvdrun (the owner) is gone;
        kill it once it has been stopped (SIGSTOP) for the frozen bound."""
        frozen = process_state.StoppedWatch(self.child.pid) if self._frozen_after > 0 else None
        while self.child.poll() is None:
            if os.getppid() != self._parent or (self._owner and not lifeline.alive(self._owner)):
                self.stop(signal.SIGTERM)
                return
            if frozen is not None and self.frozen is None:
                seconds = frozen.look()
                if seconds >= self._frozen_after:
                    # A stopped process takes SIGKILL at once; SIGTERM would wait for SIGCONT.
                    self.frozen = seconds
                    self.signal_child(signal.SIGKILL)
            time.sleep(0.5)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="task_wrapper", allow_abbrev=False)
    parser.add_argument("--tail", type=int, default=10)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--timestamp", action="store_true")
    parser.add_argument("--frozen-after", type=float, default=0.0)
    parser.add_argument("--beat", type=float, default=0.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given")
    return args


_START_WORDS = {b"begin": "mpi-begin", b"ready": "mpi-ready"}


def _relay_start_report(read_fd: int, token: str, rank: int, host: str) -> None:
    """Pass the child's start words (see hvdlite/start_report.py) on as status lines,
    until every holder of the pipe's write end has closed it."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while True:
            try:
                chunk = pipe.read(64)
            except OSError:
                return
            if not chunk:
                return
            pending += chunk
            *words, pending = pending.split(b"\n")
            for word in words:
                if word in _START_WORDS:
                    _status(token, _START_WORDS[word], rank, host)
            pending = pending[-64:]  # never more than one word's worth


def _start_report_pipe(env: dict, token: str, rank: int, host: str) -> int | None:
    """A pipe for the child's start report: its write end's number goes in *env*; a
    thread relays what arrives.  Returns the write end (close it once the child runs);
    None when the job has no token (no hvdrun listens)."""
    if not token:
        return None
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)
    env[protocol.START_FD_VARIABLE] = f"{write_fd}:{os.fstat(write_fd).st_ino}"
    threading.Thread(
        target=_relay_start_report, args=(read_fd, token, rank, host), daemon=True
    ).start()
    return write_fd


def _log_paths(output_dir: str | None, rank: int, size: int) -> tuple[str | None, str | None]:
    if not output_dir:
        return None, None
    rank_dir = os.path.join(output_dir, f"rank.{rank:0{len(str(max(size - 1, 0)))}d}")
    os.makedirs(rank_dir, exist_ok=True)
    return os.path.join(rank_dir, "stdout"), os.path.join(rank_dir, "stderr")


def _status(token: str, event: str, rank: int, host: str, **fields) -> None:
    message = {"event": event, "rank": rank, "host": host, **fields}
    _write_all(2, protocol.encode(message, token))


def _beat(token: str, rank: int, host: str, every: float, done: threading.Event) -> None:
    """Say ``alive`` every *every* seconds until *done* is set (see ``--beat``)."""
    while not done.wait(every):
        _status(token, "alive", rank, host)


def main(argv: list[str] | None = None) -> int:
    """Run one rank's command; return its exit code (128+N when killed by signal N)."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    who = rankenv.from_environ()
    rank, size = (who.rank, who.size) if who else (0, 1)
    host = socket.gethostname()
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # N ranks' C++ INFO lines are noise
    env.update(rankenv.torchrun_variables(who))
    token = env.pop(protocol.TOKEN_VARIABLE, "")
    owner = env.pop(lifeline.OWNER_VARIABLE, "")
    owner = owner if owner and lifeline.alive(owner) else None  # None: hvdrun on another host
    out_log, err_log = _log_paths(args.output_dir, rank, size)
    _status(token, "start", rank, host, pid=os.getpid(), size=size)
    env.pop(protocol.START_FD_VARIABLE, None)  # one from a job around this one is not ours
    report_fd = _start_report_pipe(env, token, rank, host)
    try:
        child = subprocess.Popen(
            args.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=False,
            preexec_fn=_child_setup(),
        )
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        line = f"hvdrun: rank {rank} on {host} cannot run {args.command[0]!r}: {exc.strerror}"
        _write_all(2, (line + "\n").encode())
        _status(
            token,
            "exit",
            rank,
            host,
            code=code,
            signal=None,
            stopped=False,
            time=time.time(),
            tail=[line],
        )
        return code
    finally:
        if report_fd is not None:
            os.close(report_fd)  # the child holds it now; EOF once the child is done
    supervisor = _Supervisor(child, owner, args.frozen_after)
    for signum in FORWARD_SIGNALS:
        signal.signal(signum, supervisor.on_signal)
    tail = _Tail(args.tail)
    pumps = [
        _Pump(child.stdout, 1, tail, out_log, args.timestamp),
        _Pump(child.stderr, 2, tail, err_log, args.timestamp, native_log_level(env)),
    ]
    for pump in pumps:
        pump.start()
    threading.Thread(target=supervisor.watch, daemon=True).start()
    beating = threading.Event()
    if token and args.beat > 0:
        threading.Thread(
            target=_beat, args=(token, rank, host, args.beat, beating), daemon=True
        ).start()
    returncode = child.wait()
    beating.set()
    ended = time.time()
    for pump in pumps:  # a daemonized grandchild may hold a pipe open: do not wait forever
        pump.join(timeout=2.0)
    signum = -returncode if returncode < 0 else None
    code = 128 + signum if signum else returncode
    _status(
        token,
        "exit",
        rank,
        host,
        code=code,
        signal=signum,
        signame=signal.Signals(signum).name if signum else None,
        stopped=supervisor.stopped,
        frozen=supervisor.frozen,
        time=ended,
        tail=tail.lines(),
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
