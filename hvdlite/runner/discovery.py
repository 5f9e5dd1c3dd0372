"""Where an elastic job's hosts come from: a discovery script, a fixed list, SLURM.

Every source has ``discover() -> list[Host]`` (the hosts usable now, in the
source's order) and ``dynamic`` (whether the answer can change while the job
runs, so that hvdrun polls it and blacklists hosts where ranks failed):

- :class:`ScriptDiscovery` -- Horovod's ``--host-discovery-script``: a program
  printing one ``host`` or ``host:slots`` per line (``--slots-per-host`` for
  lines without slots; blank lines and ``#`` comments are skipped);
- :class:`SlurmDiscovery` -- inside an allocation: its nodes and tasks per node,
  minus the nodes ``sinfo`` reports drained, draining, down or failing;
- :class:`FixedHosts` -- ``-H``/``--hostfile`` or this machine: never changes.

A source that fails raises :class:`DiscoveryError` with a one-line reason.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence

from . import slurm
from .errors import UsageError
from .hosts import Host, _check_name, _check_slots

__all__ = ["DiscoveryError", "parse_discovered", "ScriptDiscovery", "SlurmDiscovery",
           "FixedHosts", "UNUSABLE_NODE_STATES"]

SCRIPT_TIMEOUT_SECONDS = 30.0
# sinfo's short node states in which a node takes no new job step.
UNUSABLE_NODE_STATES = ("drain", "drng", "drained", "draining", "down", "fail", "failg",
                        "maint", "npc", "pow_dn", "powered_down", "powering_down", "boot",
                        "reboot", "futr", "future", "inval", "unk")


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


class ScriptDiscovery:
    """The hosts a discovery script prints (run through the shell, as horovodrun does)."""

    dynamic = True

    def __init__(self, script: str, default_slots: int = 1,
                 timeout: float = SCRIPT_TIMEOUT_SECONDS) -> None:
        self.script, self.default_slots, self.timeout = script, default_slots, timeout
        self.label = f"--host-discovery-script {script!r}"

    def discover(self) -> list[Host]:
        try:
            proc = subprocess.run(self.script, shell=True, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise DiscoveryError(f"{self.label} did not finish within {self.timeout:g} s") \
                from None
        except OSError as exc:
            raise DiscoveryError(f"{self.label} cannot run: {exc.strerror}") from None
        if proc.returncode != 0:
            said = (proc.stderr.strip().splitlines() or ["nothing on stderr"])[-1]
            raise DiscoveryError(f"{self.label} exited with code {proc.returncode}: {said}")
        try:
            return parse_discovered(proc.stdout, self.default_slots, self.label)
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
            proc = subprocess.run([self._sinfo, "-h", "-N", "-n", names, "-o", "%N %t"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=SCRIPT_TIMEOUT_SECONDS, env=self.environ)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise DiscoveryError(f"sinfo failed: {exc}") from None
        if proc.returncode != 0:
            said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise DiscoveryError(f"sinfo exited with code {proc.returncode}: {said}")
        states = _node_states(proc.stdout)
        return [host for host in self.hosts if node_usable(states.get(host.name, "idle"))]
