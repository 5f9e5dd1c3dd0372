"""A soak: one long training job, its processes sampled while it runs, leaks judged.

A job that trains for hours must not grow: a few bytes kept per step, a file
descriptor or a thread per negotiation, a shared-memory segment per window are
invisible in a test that runs for seconds and fatal after a day.  This tool runs a
real training job (``tools/soak_train.py``: digits with ``hvd.DistributedOptimizer``,
plus allgather, broadcast, reducescatter, alltoall, async, grouped, unnamed and
process-set traffic each epoch) under ``hvdrun -np N`` for ``--minutes``, and every
``--interval`` seconds reads from ``/proc`` for each process of the job:

- its resident memory (``VmRSS``), its open file descriptors (``fd/``), its threads
  (``task/``), these two as the fewest of three reads 20 ms apart (a file held open
  for a moment is not a leak);
- the shared-memory segments it maps or holds open (files under ``/dev/shm``).
  hvdlite's shared-memory collectives live in windows that MPI allocates
  (``MPI_Win_allocate_shared``), so they carry MPI's names (MPICH: ``mpich_shar_tmp*``,
  unlinked once mapped, beside MPICH's own ``mpich_shm_*`` and UCX's
  ``ucx_shm_posix_*``); every segment of the job counts.

The ranks' figures go into one table row per sample.  At the end the samples after a
warm-up (the first ``max(2, 20%)`` samples) are judged, each resource PASS or FAIL
with its figures:

- RSS: each rank's last sample within ``--rss-pct`` percent plus ``--rss-mb`` MB of
  its first sample after the warm-up;
- file descriptors, threads: each rank's count the same in every sample after the
  warm-up; shared-memory segments: the job's count the same;
- the launcher (hvdrun, mpiexec, its proxy, the rank wrappers), which also runs for
  the whole job: RSS, descriptors and threads by the same rules.

After the job: it exited 0 and rank 0 printed its last line; no process of the job is
left (those found are named, then killed); no segment that the job created is left
in ``/dev/shm``.  Exits 1 when anything fails; the job's log is then kept.

    python tools/soak.py                            # make soak: 30 minutes, 4 ranks
    python tools/soak.py --minutes 5 --np 2 --interval 30

Knobs in the environment (``HVDLITE_*``) reach the job: ``HVDLITE_SHM_ALLREDUCE_DISABLE=1``
soaks the MPI paths instead.  Needs Linux (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tools" / "soak_train.py"
DONE = "soak-train: done"  # the training script's last line (tools/soak_train.py)
MARKER_VAR = "HVDLITE_SOAK_MARKER"
SHM_DIR = "/dev/shm/"
DELETED = " (deleted)"
MB = 1024.0  # VmRSS is in kB
EXIT_GRACE = 20.0  # seconds the job's processes get to be gone after hvdrun exits


# ------------------------------------------------------------------------ samples
@dataclasses.dataclass(frozen=True)
class ProcSample:
    """One process of the job at one moment."""

    rss_kb: int
    fds: int
    threads: int
    shm: frozenset = frozenset()  # names under /dev/shm it maps or holds open
    shm_named: frozenset = frozenset()  # those of them not (yet) unlinked


@dataclasses.dataclass
class Sample:
    """Every process of the job, by label (``rank 0``, ``wrapper 0``, ``hvdrun`` ...)."""

    seconds: float
    procs: dict[str, ProcSample]

    @property
    def ranks(self) -> dict[str, ProcSample]:
        return {k: v for k, v in self.procs.items() if k.startswith("rank ")}

    @property
    def launcher(self) -> dict[str, ProcSample]:
        return {k: v for k, v in self.procs.items() if not k.startswith("rank ")}

    @property
    def shm(self) -> frozenset:
        """The job's segments: those any rank maps or holds open."""
        return frozenset().union(*(p.shm for p in self.ranks.values()))


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def job_pids(marker: str) -> list[int]:
    """Live (not zombie) processes whose environment carries *marker*."""
    found = []
    needle = f"{MARKER_VAR}={marker}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if needle not in Path(f"/proc/{name}/environ").read_bytes():
                continue
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(name))
    return sorted(found)


def label_of(pid: int) -> str | None:
    """What a process of the job is: ``rank N``, ``wrapper N``, ``hvdrun``, ``proxy``,
    or its program's name (``mpiexec``)."""
    argv = _cmdline(pid)
    env = _environ(pid)
    if not argv or env is None:
        return None
    rank = env.get("PMI_RANK") or env.get("OMPI_COMM_WORLD_RANK") or f"pid {pid}"
    script = argv[1] if len(argv) > 1 else ""
    if script.endswith("task_wrapper.py"):
        return f"wrapper {rank}"
    if script.endswith(TRAIN.name):
        return f"rank {rank}"
    if argv[1:3] == ["-m", "hvdlite.runner"] or script.endswith("/hvdrun"):
        return "hvdrun"
    program = os.path.basename(argv[0])
    return "proxy" if "proxy" in program else program


def read_status(pid: int) -> dict[str, str]:
    """``/proc/<pid>/status`` as a dict (values stripped)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def shm_segments(pid: int) -> tuple[set[str], set[str]]:
    """The /dev/shm files *pid* maps or has open: (all of them, those still named)."""
    paths = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith(SHM_DIR):
            paths.add(fields[5])
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(f"{fd_dir}/{fd}")
            if target.startswith(SHM_DIR):
                paths.add(target)
    names = {p.removesuffix(DELETED)[len(SHM_DIR) :] for p in paths}
    named = {p[len(SHM_DIR) :] for p in paths if not p.endswith(DELETED)}
    return names, named


#: Reads of a process's descriptors and threads per sample, this far apart (s): the
#: sample keeps the fewest, so a file open for a moment (hvdrun's wrapper reads
#: /proc every half second to watch its launcher) or a short-lived thread is not
#: taken for a leak, while what leaks is there at every read.
STEADY_READS, STEADY_GAP = 3, 0.02


def steady_count(path: str) -> int:
    """The fewest entries of directory *path* over :data:`STEADY_READS` reads."""
    counts = []
    for i in range(STEADY_READS):
        if i:
            time.sleep(STEADY_GAP)
        counts.append(len(os.listdir(path)))
    return min(counts)


def sample_process(pid: int) -> ProcSample | None:
    """*pid*'s figures now, or None when it is gone."""
    try:
        status = read_status(pid)
        fds = steady_count(f"/proc/{pid}/fd")
        threads = steady_count(f"/proc/{pid}/task")
        shm, named = shm_segments(pid)
    except OSError:
        return None
    rss_kb = int(status.get("VmRSS", "0 kB").split()[0])
    return ProcSample(rss_kb, fds, threads, frozenset(shm), frozenset(named))


def take_sample(marker: str, seconds: float) -> Sample:
    procs = {}
    for pid in job_pids(marker):
        label = label_of(pid)
        figures = sample_process(pid) if label else None
        if figures is not None:
            procs[label if label not in procs else f"{label} ({pid})"] = figures
    return Sample(seconds, procs)


# -------------------------------------------------------------------------- table
HEADER = (
    f"{'time':>6} {'ranks':>5} {'RSS MB max/min':>16} {'fds max/min':>12} "
    f"{'threads max/min':>16} {'shm segs':>9}"
)


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def format_row(sample: Sample) -> str:
    ranks = list(sample.ranks.values())
    if not ranks:
        return f"{_clock(sample.seconds):>6} {0:>5}  (no rank running)"

    def span(values, fmt="d") -> str:
        return f"{max(values):{fmt}}/{min(values):{fmt}}"

    rss = span([r.rss_kb / MB for r in ranks], ".1f")
    fds = span([r.fds for r in ranks])
    threads = span([r.threads for r in ranks])
    return (
        f"{_clock(sample.seconds):>6} {len(ranks):>5} {rss:>16} {fds:>12} "
        f"{threads:>16} {len(sample.shm):>9}"
    )


# -------------------------------------------------------------------------- judge
@dataclasses.dataclass(frozen=True)
class Verdict:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """How much RSS may grow from the first sample after the warm-up to the last:
    *rss_pct* percent of it plus *rss_mb* MB.  Counts may not change at all."""

    rss_pct: float = 5.0
    rss_mb: float = 4.0
    warmup_fraction: float = 0.2
    min_warmup: int = 2


def warmup_count(n: int, tol: Tolerance) -> int:
    """How many of *n* samples are warm-up: the first max(min_warmup, fraction of n)."""
    return max(tol.min_warmup, math.ceil(tol.warmup_fraction * n))


def _rss_verdict(name: str, judged: list[dict], tol: Tolerance, when) -> Verdict:
    worst = None  # (growth over allowance, label, base, last, allowed)
    for label, base in judged[0].items():
        last = judged[-1][label]
        allowed = base.rss_kb * tol.rss_pct / 100 + tol.rss_mb * MB
        entry = (last.rss_kb - base.rss_kb - allowed, label, base.rss_kb, last.rss_kb, allowed)
        worst = max(worst or entry, entry)
    over, label, base, last, allowed = worst
    grew = last - base
    detail = (
        f"{label} came closest: {base / MB:.1f} -> {last / MB:.1f} MB from {when[0]} to "
        f"{when[1]} ({grew / MB:+.1f} MB, {100 * grew / max(base, 1):+.1f}%; "
        f"allowed +{allowed / MB:.1f} MB = {tol.rss_pct:g}% + {tol.rss_mb:g} MB)"
    )
    return Verdict(name, over <= 0, detail)


def _count_verdict(name: str, series: list[dict[str, int]], times: list[str]) -> Verdict:
    """*series*: one count per process label in each judged sample; none may change."""
    changes = []
    for label, first in series[0].items():
        for counts, at in zip(series, times):
            if counts[label] != first:
                changes.append(f"{label}: {first} at {times[0]} -> {counts[label]} at {at}")
                break
    if changes:
        return Verdict(name, False, "; ".join(changes))
    low, high = min(series[0].values()), max(series[0].values())
    spread = f"{low}" if low == high else f"{low}..{high}"
    per = " per process" if len(series[0]) > 1 else ""
    return Verdict(name, True, f"{spread}{per}, unchanged from {times[0]} to {times[-1]}")


def _counts(procs: list[dict[str, ProcSample]], key: str) -> list[dict[str, int]]:
    return [{label: getattr(p, key) for label, p in s.items()} for s in procs]


def _missing(samples: list[Sample], labels: set[str], times: list[str]) -> list[str]:
    return [
        f"{label} missing at {at}"
        for s, at in zip(samples, times)
        for label in sorted(labels - set(s.procs))
    ]


def judge(samples: list[Sample], tol: Tolerance = Tolerance()) -> list[Verdict]:
    """PASS/FAIL for each resource over *samples* (a pure function of them).

    The first :func:`warmup_count` samples are left out; of the rest, RSS compares
    the last with the first (per process, see :class:`Tolerance`), the counts must
    not change in any of them.  Fewer than two samples after the warm-up: one FAIL.
    """
    skip = warmup_count(len(samples), tol)
    judged = samples[skip:]
    if len(judged) < 2:
        return [
            Verdict(
                "samples",
                False,
                f"{len(samples)} taken, {skip} of them warm-up: too few to judge "
                "(run longer or sample more often)",
            )
        ]
    times = [_clock(s.seconds) for s in judged]
    when = (times[0], times[-1])
    labels = set(judged[0].procs)
    missing = _missing(judged, labels, times)
    if missing:
        return [Verdict("processes", False, "; ".join(missing))]
    ranks = [s.ranks for s in judged]
    launcher = [s.launcher for s in judged]
    verdicts = [
        Verdict("samples", True, f"{len(judged)} judged from {times[0]}, {skip} of warm-up"),
        _rss_verdict("rss", ranks, tol, when),
        _count_verdict("fds", _counts(ranks, "fds"), times),
        _count_verdict("threads", _counts(ranks, "threads"), times),
        _count_verdict("shm segments", [{"the job": len(s.shm)} for s in judged], times),
    ]
    if launcher[0]:
        verdicts += [
            _rss_verdict("launcher rss", launcher, tol, when),
            _count_verdict("launcher fds", _counts(launcher, "fds"), times),
            _count_verdict("launcher threads", _counts(launcher, "threads"), times),
        ]
    return verdicts


# --------------------------------------------------------------------- after exit
def leftover_verdicts(marker: str, seen_named: set[str], grace: float) -> list[Verdict]:
    """No process of the job left (within *grace* seconds; those left are killed),
    and none of the /dev/shm files the job had created still there."""
    deadline = time.monotonic() + grace
    while job_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = job_pids(marker)
    if left:
        named = ", ".join(f"{pid} {' '.join(_cmdline(pid))[:80]}" for pid in left)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        procs = Verdict("processes left", False, f"{len(left)} (killed now): {named}")
    else:
        procs = Verdict("processes left", True, "none")
    still = sorted(n for n in seen_named if os.path.exists(SHM_DIR + n))
    if still:
        shm = Verdict("shm left", False, f"{len(still)} in {SHM_DIR}: {', '.join(still)}")
    else:
        shm = Verdict(
            "shm left",
            True,
            f"none of the {len(seen_named)} named segments the job created is in {SHM_DIR} "
            "(the others were unlinked while mapped and went with the processes)",
        )
    return [procs, shm]


# ---------------------------------------------------------------------------- run
@dataclasses.dataclass
class Job:
    """The hvdrun job under soak."""

    np: int
    seconds: float
    log: Path
    marker: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env[MARKER_VAR] = self.marker
        cmd = [sys.executable, "-m", "hvdlite.runner", "-np", str(self.np)]
        cmd += [sys.executable, str(TRAIN), "--seconds", f"{self.seconds:g}"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def finished_training(self) -> bool:
        with contextlib.suppress(OSError):
            return DONE in self.log.read_text(errors="replace")
        return False

    def wait(self, seconds: float) -> int | None:
        """The exit code, or None when still running after *seconds*."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=max(seconds, 0))
        return None

    def stop(self) -> None:
        """SIGINT to hvdrun (it stops its ranks), then SIGKILL to the session."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGINT)
            if self.wait(15) is None:
                with contextlib.suppress(OSError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def wait_for_ranks(job: Job, timeout: float) -> float | None:
    """Monotonic time when all the job's ranks are running, None if never."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        labels = [label_of(pid) or "" for pid in job_pids(job.marker)]
        if sum(label.startswith("rank ") for label in labels) >= job.np:
            return time.monotonic()
        time.sleep(0.2)
    return None


def sample_until_done(job: Job, interval: float, limit: float) -> tuple[list[Sample], set]:
    """Sample every *interval* seconds, printing each row, until rank 0 says it is
    done or the job exits; a sample missing a rank (the job ending) is dropped."""
    samples, named = [], set()
    started = time.monotonic()
    tick = 0
    print(HEADER, flush=True)
    while time.monotonic() - started < limit:
        sample = take_sample(job.marker, time.monotonic() - started)
        for proc in sample.procs.values():
            named |= proc.shm_named
        if len(sample.ranks) < job.np or job.finished_training():
            break
        samples.append(sample)
        print(format_row(sample), flush=True)
        tick += 1
        if job.wait(started + tick * interval - time.monotonic()) is not None:
            break
    return samples, named


def run_soak(args) -> tuple[list[Verdict], Path]:
    fd, name = tempfile.mkstemp(prefix="hvdlite-soak-", suffix=".log")
    os.close(fd)
    job = Job(args.np, args.minutes * 60, Path(name))
    print(
        f"soak: {args.np} ranks training for {args.minutes:g} min, sampled every "
        f"{args.interval:g} s; the job's output: {job.log}",
        flush=True,
    )
    job.start()
    verdicts: list[Verdict] = []
    try:
        if wait_for_ranks(job, args.start_timeout) is None:
            verdicts.append(Verdict("start", False, f"{args.np} ranks not running in time"))
            job.stop()
        else:
            limit = job.seconds + args.start_timeout
            samples, named = sample_until_done(job, args.interval, limit)
            verdicts += judge(samples, Tolerance(args.rss_pct, args.rss_mb))
            code = job.wait(args.start_timeout)
            if code is None:
                verdicts.append(Verdict("job", False, "still running past its time; stopped"))
                job.stop()
            else:
                verdicts.append(job_verdict(code, job.log))
            verdicts += leftover_verdicts(job.marker, named, EXIT_GRACE)
    except BaseException:
        job.stop()
        raise
    return verdicts, job.log


def job_verdict(code: int, log: Path) -> Verdict:
    text = log.read_text(errors="replace")
    done = [line for line in text.splitlines() if DONE in line]
    if code == 0 and done:
        return Verdict("job", True, f"exit 0; {done[-1].strip()}")
    tail = "\n    ".join(text.splitlines()[-15:])
    return Verdict("job", False, f"exit {code}, last line of rank 0 missing; tail:\n    {tail}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long the job trains")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--np", type=int, default=4, help="ranks")
    parser.add_argument(
        "--rss-pct", type=float, default=Tolerance.rss_pct, help="RSS growth allowed, percent"
    )
    parser.add_argument(
        "--rss-mb", type=float, default=Tolerance.rss_mb, help="RSS growth allowed, MB on top"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=120.0,
        help="seconds for the ranks to start, and for the job to exit after training",
    )
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    verdicts, log = run_soak(args)
    print()
    for v in verdicts:
        print(v.line())
    failed = [v.name for v in verdicts if not v.ok]
    if failed:
        print(f"soak: FAIL ({', '.join(failed)}); the job's output is kept in {log}")
        return 1
    log.unlink()
    print("soak: PASS: all flat, nothing left after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
