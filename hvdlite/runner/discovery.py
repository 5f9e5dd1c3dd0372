"""Where an elastic job's hosts come from: a discovery script, a fixed list, SLURM.

Every source has ``discover() -> list[Host]`` (the hosts usable now, in the
source's order) and ``dynamic`` (whether the answer can change while the job
runs, so that hvdrun polls it and blacklists hosts where ranks failed):

- :class:`ScriptDiscovery` -- Horovod's ``--host-discovery-script``: a program
  printing one ``host`` or ``host:slots`` per line (``--slots-per-host`` for
  lines without slots; blank lines and ``#`` comments are skipped).  It runs
  without a shell (:func:`script_argv`): a value that names an existing file is
  that program, whatever characters its path holds (spaces, ``;``); any other
  value is split into words as a shell would (``python discover.py --zone a``),
  but no shell interprets it -- no pipes, redirections or variables: put those
  in a script.  It runs in its own session: on a timeout, or when it prints
  more than ``MAX_OUTPUT_BYTES``, its whole process group is killed, and so is
  whatever it left running in the background once it exits;
- :class:`SlurmDiscovery` -- inside an allocation: its nodes and tasks per node,
  minus the nodes ``sinfo`` reports drained, draining, down or failing;
- :class:`FixedHosts` -- ``-H``/``--hostfile`` or this machine: never changes.

A source that fails raises :class:`DiscoveryError` with a one-line reason.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from . import slurm
from .errors import UsageError
from .hosts import Host, _check_name, _check_slots

__all__ = [
    "DiscoveryError",
    "parse_discovered",
    "ScriptDiscovery",
    "SlurmDiscovery",
    "FixedHosts",
    "UNUSABLE_NODE_STATES",
    "script_argv",
    "MAX_OUTPUT_BYTES",
]

SCRIPT_TIMEOUT_SECONDS = 30.0
MAX_OUTPUT_BYTES = 1 << 20  # a host list of 1 MiB is tens of thousands of hosts
_STDERR_KEPT = 64 * 1024
# sinfo's short node states in which a node takes no new job step.
UNUSABLE_NODE_STATES = (
    "drain",
    "drng",
    "drained",
    "draining",
    "down",
    "fail",
    "failg",
    "maint",
    "npc",
    "pow_dn",
    "powered_down",
    "powering_down",
    "boot",
    "reboot",
    "futr",
    "future",
    "inval",
    "unk",
)


class DiscoveryError(RuntimeError):
    """A host source could not say which hosts there are; the message says why."""


def parse_discovered(text: str, default_slots: int, source: str) -> list[Host]:
    """Hosts from a discovery script's output (see the module doc); UsageError on a bad
    line or a host listed twice."""
    hosts: list[Host] = []
    seen: set[str] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, output line {lineno}"
        name, sep, slots = line.partition(":")
        name = _check_name(name.strip(), where)
        count = _check_slots(slots.strip(), name, where) if sep else default_slots
        if name in seen:
            raise UsageError(f"{where}: host {name!r} is listed more than once")
        seen.add(name)
        hosts.append(Host(name, count))
    return hosts


def script_argv(script: str) -> list[str]:
    """The argument list that runs the discovery *script* (see the module doc); ValueError
    when a value that is not a file cannot be split into words."""
    if os.path.isfile(script):
        return [script if os.sep in script else os.path.join(".", script)]
    return shlex.split(script)


class _Capture(threading.Thread):
    """Reads one pipe to its end, keeping at most *limit* bytes; ``over`` is set once more
    came (the rest is read and dropped, so the writer never blocks)."""

    def __init__(self, pipe, limit: int) -> None:
        super().__init__(daemon=True)
        self.pipe, self.limit = pipe, limit
        self.data = bytearray()
        self.over = threading.Event()

    def run(self) -> None:
        while True:
            try:
                chunk = self.pipe.read1(65536)
            except (OSError, ValueError):
                return
            if not chunk:
                return
            room = self.limit - len(self.data)
            self.data += chunk[: max(room, 0)]
            if len(chunk) > room:
                self.over.set()


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


class ScriptDiscovery:
    """The hosts a discovery script prints (see the module doc: no shell, its own session,
    a time limit and an output limit)."""

    dynamic = True

    def __init__(
        self,
        script: str,
        default_slots: int = 1,
        timeout: float = SCRIPT_TIMEOUT_SECONDS,
        max_output: int = MAX_OUTPUT_BYTES,
    ) -> None:
        self.script, self.default_slots, self.timeout = script, default_slots, timeout
        self.max_output = max_output
        self.label = f"--host-discovery-script {script!r}"

    def _run(self) -> tuple[int, str, str]:
        try:
            argv = script_argv(self.script)
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except ValueError as exc:
            raise DiscoveryError(f"{self.label} cannot be split into words ({exc})") from None
        except OSError as exc:
            raise DiscoveryError(
                f"{self.label} cannot run: {exc.strerror} (give the path of "
                "an executable file: chmod +x it)"
            ) from None
        out, err = _Capture(proc.stdout, self.max_output), _Capture(proc.stderr, _STDERR_KEPT)
        out.start()
        err.start()
        deadline = time.monotonic() + self.timeout
        try:
            while proc.poll() is None and not out.over.is_set():
                if time.monotonic() >= deadline:
                    raise DiscoveryError(
                        f"{self.label} did not finish within "
                        f"{self.timeout:g} s (it and what it started were "
                        "killed)"
                    )
                time.sleep(0.01)
            if out.over.is_set():
                raise DiscoveryError(
                    f"{self.label} printed more than {self.max_output} bytes "
                    "(it and what it started were killed): it should print "
                    "one host a line"
                )
        finally:
            _kill_group(proc)  # also what it left running in the background
            proc.wait()
            for capture in (out, err):
                capture.join(timeout=1.0)
            proc.stdout.close()
            proc.stderr.close()
        return (
            proc.returncode,
            out.data.decode(errors="replace"),
            err.data.decode(errors="replace"),
        )

    def discover(self) -> list[Host]:
        returncode, stdout, stderr = self._run()
        if returncode != 0:
            said = (stderr.strip().splitlines() or ["nothing on stderr"])[-1]
            raise DiscoveryError(f"{self.label} exited with code {returncode}: {said}")
        try:
            return parse_discovered(stdout, self.default_slots, self.label)
        except UsageError as exc:
            raise DiscoveryError(str(exc)) from None


class FixedHosts:
    """A host list that does not change (``-H``, ``--hostfile``, or this machine)."""

    dynamic = False

    def __init__(self, hosts: Sequence[Host], label: str) -> None:
        self.hosts, self.label = list(hosts), label

    def discover(self) -> list[Host]:
        return list(self.hosts)


def _node_states(text: str) -> dict[str, str]:
    states = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            states[fields[0]] = fields[1].lower()
    return states


def node_usable(state: str) -> bool:
    """False for a node state (``sinfo %t``) in which SLURM starts nothing new there; a
    trailing ``*`` (not responding) counts as unusable too."""
    if state.endswith("*"):
        return False
    bare = state.rstrip("~#!%$@^-+")
    return not any(bare.startswith(word) for word in UNUSABLE_NODE_STATES)


class SlurmDiscovery:
    """The allocation's nodes (and tasks per node) that SLURM still runs steps on."""

    dynamic = True
    label = "the SLURM allocation"

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = dict(environ)
        self.hosts = slurm.allocation_hosts(self.environ)
        self._sinfo = shutil.which("sinfo", path=self.environ.get("PATH"))

    def discover(self) -> list[Host]:
        if self._sinfo is None:  # cannot ask: every node of the allocation counts
            return list(self.hosts)
        names = ",".join(host.name for host in self.hosts)
        try:
            proc = subprocess.run(
                [self._sinfo, "-h", "-N", "-n", names, "-o", "%N %t"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=SCRIPT_TIMEOUT_SECONDS,
                env=self.environ,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DiscoveryError(f"sinfo failed: {exc}") from None
        if proc.returncode != 0:
            said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise DiscoveryError(f"sinfo exited with code {proc.returncode}: {said}")
        states = _node_states(proc.stdout)
        return [host for host in self.hosts if node_usable(states.get(host.name, "idle"))]
