"""A nemesis for elastic jobs: faults injected on a seeded schedule, invariants checked.

Each run starts an elastic training job under hvdrun (``tests/elastic_scripts/
chaos_train.py``: deterministic data, a commit every few steps) and, while it trains,
injects the faults of a schedule drawn from its seed.  Each fault waits until the job
has trained a few steps since it last (re)started, then:

- ``kill``: a rank SIGKILLs itself; ``freeze``: a rank SIGSTOPs itself and is never
  continued.  Each at a phase drawn from the schedule: at the start of a step, inside
  the backward pass, while the gradients' allreduce runs, or while a commit is being
  written.  hvdrun relaunches the job from its last commit (a frozen rank after
  ``--frozen-timeout``);
- ``hvdrun``: hvdrun itself is killed (SIGKILL; its ranks go with it); the tool starts
  a new hvdrun with ``--elastic-resume`` and the job's id;
- ``enospc``: the elastic state directory (a small tmpfs of its own) fills up, so the
  next commit fails; the job must end with exit 74 naming the file and the error,
  and, once the space is freed, resume with ``--elastic-resume``.

Invariants, checked after every run: the job finishes; its final weights equal, bit
for bit, those of an uninterrupted run of the same size (so every sample was trained
exactly once after the commit each launch resumed from); every launch resumed from
the newest commit written before its fault (no committed step lost); no process of
the job is left.  Each fault's recovery time (fault to the next launch's first step)
is measured.

    python tools/chaos.py --seeds 1-25 --faults 4        # make chaos
    python tools/chaos.py --seeds 7 --faults 3            # one short run
    python tools/chaos.py --hosts 3 --seeds 1-10          # make chaos, multi-host part

``--hosts N`` (``chaos_hosts.py``, root only) runs the job on N network-namespace hosts
of 2 ranks each under a host-discovery script, and adds the faults ``leave`` (a host
leaves the discovery list, the job shrinks from its commit; later it is listed again and
the job grows back) and ``linkcut`` (a host's link goes down, found by hvdrun when
the host's task wrappers fall silent, ``--silent-host-timeout``; hvdrun leaves the
host out and goes on from the last commit; the link comes back up and so does the
host).  The job then trains with
``--global-batch``, which makes its weights independent of the world size, so a run
whose size changed must still end with an uninterrupted run's weights, bit for bit.

Needs Linux (``/proc``); ``enospc`` needs root to mount a tmpfs and is left out, saying
why, elsewhere.  Exits 1 when any invariant fails, naming the seed and the fault.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

if __name__ == "__main__":  # one module, whether run or imported (chaos_hosts imports it)
    sys.modules.setdefault("chaos", sys.modules[__name__])

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "elastic_scripts" / "chaos_train.py"
KINDS = ("kill", "freeze", "hvdrun", "enospc")
PHASES = ("step", "backward", "collective", "commit")
ENOSPC_EXIT = 74  # hvdlite.elastic's exit code for a commit that cannot be written


@dataclasses.dataclass
class Fault:
    kind: str
    rank: int
    phase: str
    after_steps: int  # steps trained since the last (re)start before it fires
    host: str = ""  # leave, linkcut (multi-host runs): the host it happens to
    injected_at: float | None = None
    recovered_at: float | None = None
    restored_at: float | None = None  # leave, linkcut: the host listed again / link up
    rejoined_at: float | None = None  # ... and the first step of a launch with it back
    note: str = ""

    def describe(self) -> str:
        if self.host:
            return f"{self.kind} {self.host}"
        where = f" rank {self.rank} at {self.phase}" if self.kind in ("kill", "freeze") else ""
        return f"{self.kind}{where}"

    @property
    def recovery(self) -> float | None:
        if self.injected_at is None or self.recovered_at is None:
            return None
        return self.recovered_at - self.injected_at

    @property
    def rejoin(self) -> float | None:
        if self.restored_at is None or self.rejoined_at is None:
            return None
        return self.rejoined_at - self.restored_at


def schedule(seed: int, count: int, np: int, kinds: tuple[str, ...]) -> list[Fault]:
    """The faults of run *seed*: the same on every machine for the same arguments."""
    rng = random.Random(seed)
    return [
        Fault(rng.choice(kinds), rng.randrange(np), rng.choice(PHASES), rng.randint(1, 4))
        for _ in range(count)
    ]


class Invariant(Exception):
    """An invariant that did not hold."""


@dataclasses.dataclass
class Job:
    """One elastic job under hvdrun (perhaps several hvdrun processes, resumed)."""

    args: argparse.Namespace
    work: Path
    marker: str
    state_dir: Path
    proc: subprocess.Popen | None = None
    log_handles: list = dataclasses.field(default_factory=list)
    launches: int = 0
    # multi-host runs (chaos_hosts.py): hvdrun's size and host options instead of -np,
    # the command as run on the first host, more variables for the job
    size_args: list[str] | None = None
    wrap: Callable[[list[str]], list[str]] = lambda cmd: cmd
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def chaos_dir(self) -> Path:
        return self.work / "chaos"

    def command(self, resume: str | None) -> list[str]:
        a = self.args
        cmd = [sys.executable, "-m", "hvdlite.runner"]
        cmd += ["-np", str(a.np)] if self.size_args is None else self.size_args
        cmd += ["--max-restarts", "100", "--elastic-state-dir", str(self.state_dir)]
        cmd += ["--frozen-timeout", f"{a.frozen_timeout:g}"]
        if resume:
            cmd += ["--elastic-resume", resume]
        cmd += [sys.executable, str(SCRIPT), *train_args(a)]
        return cmd + ["--chaos-dir", str(self.chaos_dir), "--out", str(self.work / "out")]

    def start(self, resume: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CHAOS_MARKER": self.marker, **self.env}
        env.setdefault("HVDLITE_ELASTIC_DISCOVERY_INTERVAL", "0.2")
        out = open(self.work / f"hvdrun.{self.launches}.log", "wb")  # noqa: SIM115
        self.log_handles.append(out)
        self.proc = subprocess.Popen(
            self.wrap(self.command(resume)),
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.launches += 1

    def log_text(self) -> str:
        return "".join(
            (self.work / f"hvdrun.{n}.log").read_text(errors="replace")
            for n in range(self.launches)
        )

    def job_id(self) -> str:
        (job,) = [p.name for p in self.state_dir.iterdir() if p.is_dir()]
        return job

    def events(self) -> list[dict]:
        path = self.chaos_dir / "progress.jsonl"
        if not path.exists():
            return []
        lines = path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.endswith("}")]

    def leftovers(self) -> list[int]:
        found = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError):
                    if self.marker.encode() in Path(f"/proc/{name}/environ").read_bytes():
                        found.append(int(name))
        return found

    def kill_all(self) -> None:
        for pid in self.leftovers():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def train_args(a: argparse.Namespace) -> list[str]:
    size_free = ["--global-batch", str(a.global_batch)] if a.global_batch else []
    return size_free + [
        "--epochs",
        str(a.epochs),
        "--batches",
        str(a.batches),
        "--commit-every",
        str(a.commit_every),
        "--step-sleep",
        f"{a.step_sleep:g}",
    ]


def _wait(check, seconds: float, what: str):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise Invariant(f"{what} did not happen within {seconds:g} s")


class TmpfsStateDir:
    """A small tmpfs for the elastic state, so that it can be filled (root only)."""

    def __init__(self, path: Path, size_kib: int = 4096) -> None:
        self.path, self.size_kib = path, size_kib
        self.mounted = False
        self.ballast = path / "ballast"

    def mount(self) -> str | None:
        """Mount it; the reason it cannot be, or None."""
        self.path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return "not root: cannot mount a tmpfs to fill"
        done = subprocess.run(
            [
                "mount",
                "-t",
                "tmpfs",
                "-o",
                f"size={self.size_kib}k,mode=0700",
                "tmpfs",
                str(self.path),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            return f"mount failed: {done.stderr.strip()}"
        self.mounted = True
        return None

    def fill(self) -> None:
        with open(self.ballast, "wb") as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 65536)
                f.flush()

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)
            self.mounted = False


def baseline(a: argparse.Namespace, work: Path, np: int | None = None) -> Path:
    """The final weights of an uninterrupted run (on this machine, of *np* ranks, by
    default the job's size) with the same schedule of steps."""
    np = a.np if np is None else np
    out = work / f"baseline-{np}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "chaos").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(np), sys.executable, str(SCRIPT)]
    cmd += [*train_args(a), "--chaos-dir", str(out / "chaos"), "--out", str(out)]
    cmd[cmd.index("--step-sleep") + 1] = "0"
    done = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=a.run_timeout,
    )
    if done.returncode != 0:
        raise SystemExit(f"chaos: the uninterrupted run failed:\n{done.stdout}{done.stderr}")
    return out / "final.pt"


def _steps_since_start(events: list[dict]) -> int:
    """Steps the job trained since its latest (re)start."""
    starts = [i for i, e in enumerate(events) if "resumed" in e]
    if not starts:
        return 0
    return sum(1 for e in events[starts[-1] :] if "step" in e)


def _trained(events: list[dict], steps: int) -> bool:
    """Whether the job has started and trained *steps* steps since its latest start."""
    return _resumes(events) > 0 and _steps_since_start(events) >= steps


def _resumes(events: list[dict]) -> int:
    return sum(1 for e in events if "resumed" in e)


def _inject(job: Job, fault: Fault, tmpfs: TmpfsStateDir | None) -> None:
    fault.injected_at = time.time()
    if fault.kind in ("kill", "freeze"):
        target = job.chaos_dir / f"inject.{fault.rank}"
        part = target.with_suffix(".part")
        part.write_text(json.dumps({"kind": fault.kind, "phase": fault.phase}))
        part.rename(target)
        return
    if fault.kind == "hvdrun":
        job.proc.send_signal(signal.SIGKILL)
        job.proc.wait()
        # hvdrun's ranks follow it (their wrappers watch it); then a new hvdrun resumes.
        _wait(lambda: not job.leftovers(), 30, "the ranks ending after hvdrun was killed")
        job.start(resume=job.job_id())
        return
    tmpfs.fill()
    code = job.proc.wait(timeout=job.args.run_timeout)
    log = job.log_text()
    if code != ENOSPC_EXIT or "No space left on device (errno 28, ENOSPC)" not in log:
        raise Invariant(
            f"a full state directory: hvdrun exited {code}, not {ENOSPC_EXIT} "
            f"with the ENOSPC message:\n{log[-3000:]}"
        )
    tmpfs.free()
    _wait(lambda: not job.leftovers(), 30, "the ranks ending after the failed commit")
    job.start(resume=job.job_id())


def _check_resumes(events: list[dict]) -> None:
    """Every launch after the first resumed from the newest commit written before it."""
    last_commit, last_step = 0, -1
    for event in events:
        if "commit" in event:
            last_commit = event["commit"]
        elif "step" in event:
            last_step = event["step"]
        elif "resumed" in event:
            if not last_commit <= event["resumed"] <= last_step + 1:
                raise Invariant(
                    f"a launch resumed from step {event['resumed']}, but commit "
                    f"{last_commit} had been written (and step {last_step} trained): "
                    "a committed step was lost"
                )


def _fire_and_recover(job: Job, fault: Fault, seed: int, inject: Callable[[Fault], None]) -> None:
    """Inject *fault* into the running job (``inject``), then wait for the first step of
    a launch after it (its recovery) and note the times on *fault*; Invariant when the
    job neither recovers nor finishes well within ``--run-timeout``."""
    timeout = job.args.run_timeout
    resumes = _resumes(job.events())
    inject(fault)
    if fault.kind in ("kill", "freeze"):
        fired = job.chaos_dir / f"fired.{fault.rank}"
        _wait(
            lambda: (
                fired.exists() or job.proc.poll() is not None or _resumes(job.events()) > resumes
            ),
            timeout,
            f"seed {seed}: rank {fault.rank} firing its fault",
        )
        if not fired.exists():
            # the job finished, or its launch ended (hosts changed) before the phase came
            fault.note = "not injected: the job had finished or relaunched first"
            return
        fault.injected_at = float(fired.read_text() or fault.injected_at)
        fired.unlink()
    _wait(
        lambda: _resumes(job.events()) > resumes or job.proc.poll() is not None,
        timeout,
        f"seed {seed}: recovery from {fault.describe()}",
    )
    later = [e for e in job.events()[1:] if "resumed" in e and e["time"] > fault.injected_at]
    if later:
        fault.recovered_at = later[0]["time"]
    elif job.proc.poll() is None or job.proc.returncode != 0:
        raise Invariant(f"seed {seed}: no recovery from {fault.describe()}")
    else:
        fault.note = "the job finished before it needed to recover"


def run_one(a: argparse.Namespace, seed: int, reference: Path, work: Path) -> list[Fault]:
    """One seeded run; raises Invariant on a broken invariant."""
    faults = schedule(seed, a.faults, a.np, a.kinds)
    work.mkdir(parents=True)
    (work / "chaos").mkdir()
    (work / "out").mkdir()
    state_dir = work / "state"
    tmpfs = state_tmpfs(a, state_dir)
    job = Job(a, work, f"chaos-{uuid.uuid4().hex}", state_dir)
    try:
        job.start()
        for fault in faults:
            _wait(
                lambda f=fault: (
                    job.proc.poll() is not None or _trained(job.events(), f.after_steps)
                ),
                a.run_timeout,
                f"seed {seed}: the job training before {fault.describe()}",
            )
            if job.proc.poll() is not None:
                fault.note = "not injected: the job had finished"
                continue
            _fire_and_recover(job, fault, seed, lambda f: _inject(job, f, tmpfs))
        check_end(job, seed, reference)
        return faults
    except subprocess.TimeoutExpired as exc:
        raise Invariant(f"seed {seed}: the job did not end within {a.run_timeout:g} s") from exc
    finally:
        end(job, tmpfs)


def state_tmpfs(a: argparse.Namespace, state_dir: Path) -> TmpfsStateDir | None:
    """The state directory as a tmpfs to fill, when the run has enospc faults."""
    if "enospc" not in a.kinds:
        return None
    tmpfs = TmpfsStateDir(state_dir)
    reason = tmpfs.mount()
    if reason:
        raise SystemExit(f"chaos: enospc faults need a tmpfs ({reason}); leave out enospc")
    return tmpfs


def check_end(job: Job, seed: int, reference: Path) -> None:
    """The invariants at the end of a run: hvdrun exits 0, every launch resumed from the
    newest commit, the final weights are the reference's bit for bit, no process is left."""
    import torch  # the weights' comparison; the job's own interpreter has it too

    code = job.proc.wait(timeout=job.args.run_timeout)
    log = job.log_text()
    if code != 0:
        raise Invariant(f"seed {seed}: hvdrun exited {code}:\n{log[-4000:]}")
    _check_resumes(job.events())
    final = torch.load(job.work / "out" / "final.pt")
    expected = torch.load(reference)
    if not all(torch.equal(final[k], expected[k]) for k in expected):
        raise Invariant(f"seed {seed}: the final weights differ from the uninterrupted run's")
    _wait(lambda: not job.leftovers(), 20, f"seed {seed}: every process of the job ending")


def end(job: Job, tmpfs: TmpfsStateDir | None) -> None:
    """Stop whatever is left of *job*, whatever happened."""
    if job.proc is not None and job.proc.poll() is None:
        job.proc.kill()
    job.kill_all()
    for handle in job.log_handles:
        handle.close()
    if tmpfs is not None:
        tmpfs.unmount()


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=_seeds, default=_seeds("1"), help="e.g. 1-20 or 3,5")
    p.add_argument("--faults", type=int, default=4, help="faults per run")
    p.add_argument("--kinds", type=lambda t: tuple(t.split(",")), default=None)
    p.add_argument("--np", type=int, default=3)
    p.add_argument(
        "--hosts",
        type=int,
        default=0,
        help="N > 1: a job on N network-namespace hosts of 2 ranks each (chaos_hosts.py)",
    )
    p.add_argument("--global-batch", type=int, default=0, help="see chaos_train.py")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=0, help="steps an epoch (20; 30 with --hosts)")
    p.add_argument("--commit-every", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.15)
    p.add_argument("--frozen-timeout", type=float, default=3.0)
    p.add_argument("--run-timeout", type=float, default=300.0)
    p.add_argument("--report", type=Path, default=None, help="write the figures as JSON")
    p.add_argument("--keep", action="store_true", help="keep each run's directory")
    a = p.parse_args(argv)
    known, default = KINDS, KINDS
    if a.hosts:
        import chaos_hosts

        if a.hosts < 2:
            p.error("--hosts: at least 2 (leave it out for a job on this machine)")
        known, default = chaos_hosts.KINDS, chaos_hosts.DEFAULT_KINDS
        a.np = chaos_hosts.SLOTS * a.hosts
        a.global_batch = a.global_batch or chaos_hosts.GLOBAL_BATCH
    a.batches = a.batches or (30 if a.hosts else 20)
    a.kinds = a.kinds or default
    unknown = set(a.kinds) - set(known)
    if unknown:
        p.error(f"--kinds: unknown {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    return a


def _summary(fault: Fault) -> str:
    if fault.recovery is None:
        return f"{fault.describe()} {fault.note}"
    text = f"{fault.describe()} {fault.recovery:.1f} s"
    if fault.rejoin is not None:
        text += f" (host back {fault.rejoin:.1f} s after it was restored)"
    elif fault.host:
        text += f" ({fault.note})" if fault.note else ""
    return text


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    top = Path(tempfile.mkdtemp(prefix="hvdlite-chaos-"))
    failures, injected, recovered, slowest = [], 0, 0, (0.0, "")
    by_kind: dict[str, list[float]] = {}
    rows = []
    stack = contextlib.ExitStack()  # the multi-host runs' hosts, built once
    per_kind: dict[str, int] = {}
    try:
        if a.hosts:
            import chaos_hosts

            cluster = stack.enter_context(chaos_hosts.Cluster(top / "hosts", a.hosts))
            reference = chaos_hosts.baseline(a, top)
            run = functools.partial(chaos_hosts.run_one, cluster)
        else:
            reference, run = baseline(a, top), run_one
        for seed in a.seeds:
            began = time.monotonic()
            try:
                faults = run(a, seed, reference, top / f"seed-{seed}")
            except Invariant as exc:
                failures.append(str(exc))
                print(f"chaos: seed {seed}: FAILED: {exc}", flush=True)
                continue
            for fault in faults:
                row = {"seed": seed, "fault": fault.describe(), "kind": fault.kind}
                if fault.injected_at is not None and not fault.note.startswith("not injected"):
                    injected += 1
                    per_kind[fault.kind] = per_kind.get(fault.kind, 0) + 1
                if fault.recovery is not None:
                    recovered += 1
                    by_kind.setdefault(fault.kind, []).append(fault.recovery)
                    if fault.recovery > slowest[0]:
                        slowest = (fault.recovery, f"seed {seed}: {fault.describe()}")
                if fault.rejoin is not None:
                    by_kind.setdefault(f"{fault.kind}, host back", []).append(fault.rejoin)
                row.update(recovery=fault.recovery, rejoin=fault.rejoin, note=fault.note)
                rows.append(row)
            took = time.monotonic() - began
            summary = ", ".join(_summary(f) for f in faults)
            print(f"chaos: seed {seed}: ok in {took:.0f} s: {summary}", flush=True)
    finally:
        stack.close()
        if not a.keep:
            shutil.rmtree(top, ignore_errors=True)
    print(f"chaos: {injected} faults injected over {len(a.seeds)} runs, {recovered} recovered")
    print("chaos:   injected: " + ", ".join(f"{k} {n}" for k, n in sorted(per_kind.items())))
    for kind, times in sorted(by_kind.items()):
        median = sorted(times)[len(times) // 2]
        print(
            f"chaos:   {kind}: {len(times)} recovered, median {median:.1f} s, "
            f"slowest {max(times):.1f} s"
        )
    if slowest[1]:
        print(f"chaos: slowest recovery {slowest[0]:.1f} s ({slowest[1]})")
    if a.report:
        a.report.write_text(json.dumps({"faults": rows, "failures": failures}, indent=1))
    if failures:
        print(f"chaos: {len(failures)} run(s) broke an invariant", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
