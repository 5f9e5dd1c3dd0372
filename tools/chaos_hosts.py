"""tools/chaos.py's multi-host runs (``--hosts N``): hosts that leave, links that are cut.

``python tools/chaos.py --hosts 3 --seeds 1-10`` builds hosts h1, h2, h3 once
(``tests/helpers_runner/netns_hosts.py``: a network namespace each, with its own
host name, sshd and interfaces on a private bridge; root only) and, for every seed,
runs hvdrun on h1 with a host-discovery script that lists ``hN:2`` for each host
named in a file.  The job (``chaos_train.py --global-batch 24``) starts on all
N x 2 ranks, with ``--min-np 2``, ``--network-interface mgmt0`` (the interface the
ranks and ssh use), ``--blacklist-cooldown-range 10 30`` and
``--silent-host-timeout 10`` (30 s by default; shorter here so that a seed's faults fit
in minutes).  Before each fault the tool waits until the job
runs on every host again and has trained a few steps.  Fault kinds, besides
``kill``, ``freeze`` (a rank of any host) and ``hvdrun`` (hvdrun on h1 killed, then
resumed there) of the single-host runs (``enospc`` only when ``--kinds`` names it:
the state directory is one the hosts share, so a full one is no different here):

- ``leave``: the file stops listing a host (any host, h1 too).  hvdrun posts the
  host-update notice, the ranks commit and leave together, and the job goes on from
  that commit on the other hosts.  A few steps later the host is listed again and
  the job grows back the same way;
- ``linkcut``: ``ip link set mgmt0 down`` in a host's namespace (h2 ... hN; h1 is
  where hvdrun runs, and cutting it cuts it off from every host).  Nothing errs:
  TCP retries in silence, so the ranks wait for the cut host's ranks, until hvdrun,
  no longer hearing the cut host's task wrappers, ends the launch naming the host
  (``--silent-host-timeout``; no knob of the ranks'); before relaunching, hvdrun's ssh
  check cannot log in to the host, leaves it out for the cooldown (naming it and
  ssh's reason) and launches on the others from the last commit.  Once that launch
  trains, the link goes up again (at once: the cooldown, counted from when hvdrun
  left the host out, is about over by then, a relaunch taking some 10 s here, and
  a link still down when hvdrun offers the host again would cost a relaunch and a
  longer cooldown); once the cooldown ends the job grows back.

Recovery is the time from the fault to the first step of the launch after it; for
``leave`` and ``linkcut`` the tool also measures "host back": from the host listed
again (link up) to the first step of a launch that has it.

Invariants, besides those of the single-host runs (the job finishes, every launch
resumed from the newest commit, no process of the job left on any host): the
launch that recovers from a ``leave``/``linkcut`` runs without that host, and
hvdrun's log names a cut host and why it left it out.  The weights' invariant
holds across sizes: with ``--global-batch`` every step trains on the same samples
whatever the world size, and the gradient is an exact sum (see chaos_train.py), so
the job is a function of its committed steps only.  "Final weights equal a
fault-free replay of the same commits" is then checked as: the final weights equal,
bit for bit, those of an uninterrupted run, of whatever size.  The tool first
checks that premise itself (uninterrupted runs of 2 and 3 ranks on this machine
must agree bit for bit) and compares every chaos run with them.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import chaos
from chaos import Fault, Invariant, Job, _steps_since_start, _trained, _wait

sys.path.insert(0, str(chaos.ROOT / "tests"))
from helpers_runner import netns_hosts  # noqa: E402

__all__ = ["Cluster", "run_one", "baseline", "schedule", "KINDS", "SLOTS", "GLOBAL_BATCH"]

KINDS = ("kill", "freeze", "hvdrun", "leave", "linkcut", "enospc")
DEFAULT_KINDS = ("kill", "freeze", "hvdrun", "leave", "linkcut")
SLOTS = 2  # ranks per host
GLOBAL_BATCH = 24  # splits over 2, 4 and 6 ranks (and 3, for the size check)
LINK = netns_hosts.MGMT_IFACE
SILENT_HOST_TIMEOUT = 10  # seconds: how a cut link is found (hvdrun's default is 30)
COOLDOWN = ("10", "30")  # --blacklist-cooldown-range: a cut host is retried after this
_LAUNCH = re.compile(r"launch (\d+): \d+ rank\(s\) on (\S+), ")


def schedule(seed: int, count: int, names: list[str], kinds: tuple[str, ...]) -> list[Fault]:
    """The faults of run *seed* on hosts *names*: the same on every machine."""
    rng = random.Random(seed)
    faults = []
    for _ in range(count):
        kind = rng.choice(kinds)
        rank, phase = rng.randrange(SLOTS * len(names)), rng.choice(chaos.PHASES)
        after, host = rng.randint(1, 4), rng.choice(names if kind == "leave" else names[1:])
        faults.append(Fault(kind, rank, phase, after, host if kind in ("leave", "linkcut") else ""))
    return faults


class Cluster:
    """The hosts, the discovery file and the links, for every seed of a run."""

    def __init__(self, work: Path, count: int) -> None:
        reason = netns_hosts.reason_unavailable()
        if reason:
            raise SystemExit(f"chaos: --hosts needs network-namespace hosts: {reason}")
        work.mkdir(parents=True, exist_ok=True)
        self.names = [f"h{i}" for i in range(1, count + 1)]
        self.hosts = netns_hosts.NetnsHosts(work, tuple(self.names))
        self.listing, self.discover = work / "hosts.txt", work / "discover.sh"

    def __enter__(self) -> Cluster:
        self.hosts.start()
        self.discover.write_text(f"#!/bin/sh\ncat {self.listing}\n")
        self.discover.chmod(0o755)
        self.reset()
        return self

    def __exit__(self, *exc) -> None:
        self.hosts.stop()

    def reset(self) -> None:
        """Every host listed, every link up."""
        self.list_hosts(self.names)
        for name in self.names[1:]:
            self.set_link(name, up=True)

    def list_hosts(self, names: list[str]) -> None:
        part = self.listing.with_suffix(".part")  # the script never reads half a file
        part.write_text("".join(f"{name}:{SLOTS}\n" for name in names))
        part.rename(self.listing)

    def listed(self) -> list[str]:
        return [line.split(":")[0] for line in self.listing.read_text().split()]

    def set_link(self, name: str, up: bool) -> None:
        namespace = self.hosts[name].namespace
        cmd = ["ip", "-n", namespace, "link", "set", LINK, "up" if up else "down"]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)

    def job(self, a: argparse.Namespace, work: Path, state_dir: Path) -> Job:
        size_args = ["--min-np", str(SLOTS), "--max-np", str(a.np)]
        size_args += ["--host-discovery-script", str(self.discover)]
        size_args += ["--network-interface", LINK, "--blacklist-cooldown-range", *COOLDOWN]
        size_args += ["--silent-host-timeout", str(SILENT_HOST_TIMEOUT)]
        return Job(
            a,
            work,
            f"chaos-{uuid.uuid4().hex}",
            state_dir,
            size_args=size_args,
            wrap=lambda cmd: self.hosts.wrap(self.names[0], cmd),
            env={"HVDLITE_ELASTIC_DISCOVERY_INTERVAL": "0.5"},
        )


def baseline(a: argparse.Namespace, work: Path) -> Path:
    """An uninterrupted run's final weights, after checking that they do not depend on
    the world size (runs of 2 and 3 ranks on this machine agree bit for bit)."""
    import torch

    two, three = chaos.baseline(a, work, 2), chaos.baseline(a, work, 3)
    first, second = torch.load(two), torch.load(three)
    if not all(torch.equal(first[k], second[k]) for k in first):
        raise SystemExit(
            "chaos: uninterrupted runs of 2 and 3 ranks differ: the job's weights depend on "
            "the world size, so runs whose size changes cannot be compared bit for bit"
        )
    return two


def _size(events: list[dict]) -> int:
    sizes = [e["size"] for e in events if "resumed" in e]
    return sizes[-1] if sizes else 0


def _placement(job: Job, launch: int) -> list[str]:
    """The hosts hvdrun started launch *launch* on (its last placement of that number)."""
    found = [m[2] for m in _LAUNCH.finditer(job.log_text()) if int(m[1]) == launch]
    return [entry.split(":")[0] for entry in found[-1].split(",")] if found else []


def _inject(cluster: Cluster, job: Job, fault: Fault, tmpfs) -> None:
    if fault.kind == "leave":
        fault.injected_at = time.time()
        cluster.list_hosts([name for name in cluster.listed() if name != fault.host])
    elif fault.kind == "linkcut":
        fault.injected_at = time.time()
        cluster.set_link(fault.host, up=False)
    else:
        chaos._inject(job, fault, tmpfs)


def _launch_after(job: Job, when: float) -> dict | None:
    later = [e for e in job.events() if "resumed" in e and e["time"] > when]
    return later[0] if later else None


def _host_fault_aftermath(cluster: Cluster, job: Job, fault: Fault, seed: int) -> None:
    """After a leave or linkcut recovered: check the launch ran without the host, then
    list it again after a few steps (link up at once) and wait for a launch that has it."""
    timeout = job.args.run_timeout
    try:
        if fault.recovered_at is not None:
            launch = _launch_after(job, fault.injected_at)["launch"]
            if fault.host in _placement(job, launch):
                raise Invariant(
                    f"seed {seed}: after {fault.describe()}, launch {launch} still ran on "
                    f"{fault.host}: {', '.join(_placement(job, launch))}"
                )
            if fault.kind == "linkcut" and f"host {fault.host} is left out: " not in (
                job.log_text()
            ):
                raise Invariant(f"seed {seed}: hvdrun did not name the cut host {fault.host}")
            if fault.kind == "linkcut" and f"{fault.host} stopped answering" not in (
                job.log_text()
            ):
                raise Invariant(
                    f"seed {seed}: the launch did not end by hvdrun no longer hearing "
                    f"{fault.host} (--silent-host-timeout)"
                )
            if fault.kind == "leave":  # a cut link goes up at once: see the module doc
                _wait(
                    lambda: (
                        job.proc.poll() is not None
                        or _steps_since_start(job.events()) >= fault.after_steps
                    ),
                    timeout,
                    f"seed {seed}: steps without {fault.host}",
                )
    finally:  # the host comes back, whatever happened
        fault.restored_at = time.time()
        if fault.kind == "leave":
            cluster.list_hosts(cluster.names)
        else:
            cluster.set_link(fault.host, up=True)
    if fault.recovered_at is None:
        return

    def back() -> dict | None:
        event = _launch_after(job, fault.restored_at)
        while event is not None and fault.host not in _placement(job, event["launch"]):
            event = _launch_after(job, event["time"])
        return event

    _wait(
        lambda: job.proc.poll() is not None or back() is not None,
        timeout,
        f"seed {seed}: {fault.host} back in the job after {fault.describe()}",
    )
    event = back()
    if event is None:
        fault.note = "the job finished before the host came back"
    else:
        fault.rejoined_at = event["time"]


def _hvdrun_lines(job: Job, count: int = 40) -> str:
    """hvdrun's own lines (not the ranks'), the last *count*: what it decided."""
    lines = [line for line in job.log_text().splitlines() if line.startswith("hvdrun")]
    return "hvdrun's last lines:\n  " + "\n  ".join(lines[-count:])


def run_one(
    cluster: Cluster, a: argparse.Namespace, seed: int, reference: Path, work: Path
) -> list[Fault]:
    """One seeded run on the hosts; raises Invariant on a broken invariant."""
    faults = schedule(seed, a.faults, cluster.names, a.kinds)
    work.mkdir(parents=True)
    (work / "chaos").mkdir()
    (work / "out").mkdir()
    state_dir = work / "state"
    tmpfs = chaos.state_tmpfs(a, state_dir)
    cluster.reset()
    job = cluster.job(a, work, state_dir)
    try:
        job.start()
        for fault in faults:
            _wait(
                lambda f=fault: (
                    job.proc.poll() is not None
                    or (_trained(job.events(), f.after_steps) and _size(job.events()) == a.np)
                ),
                a.run_timeout,
                f"seed {seed}: the job training on every host before {fault.describe()}",
            )
            if job.proc.poll() is not None:
                fault.note = "not injected: the job had finished"
                continue
            chaos._fire_and_recover(job, fault, seed, lambda f: _inject(cluster, job, f, tmpfs))
            if fault.host:
                _host_fault_aftermath(cluster, job, fault, seed)
        chaos.check_end(job, seed, reference)
        return faults
    except Invariant as exc:
        raise Invariant(f"{exc}\n{_hvdrun_lines(job)}") from None
    except subprocess.TimeoutExpired as exc:
        raise Invariant(f"seed {seed}: the job did not end within {a.run_timeout:g} s") from exc
    finally:
        chaos.end(job, tmpfs)
        cluster.reset()
