"""Communication hidden behind backward across hosts, read from the timeline, same run.

Run as root: ``python benchmarks/bench_overlap_tc.py``.  It builds the pretend
machines of ``bench_multihost_tc.py`` (``--hosts``, default 3 network namespaces,
each one's links shaped with ``tc``, default 1 Gbit/s and 0.2 ms each way) and
runs two ``hvdrun -H h1:2,h2:2,...`` jobs from h1: ``HVDLITE_OVERLAP=on`` (the
gradient hooks hand each bucket to the engine during backward) and ``off`` (the
hooks only count; ``synchronize()`` starts every bucket), the baseline of the same
run.  Each job trains that bench's MLP (16 MB of gradients) and ResNet-18 (64x64
images, 43 MB) with ``DistributedOptimizer(SGD)``: one step, ``--iters`` steps
timed without a timeline, then ``--iters`` steps with rank 0's timeline on.  Rank 0
reads its trace back (:mod:`hvdlite.timeline.overlap`): per step, the
communication (the union of the gradient batches' collective phases), the part
of it inside the backward span (hidden) and the part after it (exposed: what the
step waited for).  Times are the median over steps of the slowest rank; the
overlap figures are rank 0's view, the mean over the traced steps.  Where the
hosts cannot be built it says why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))

import bench_multihost_tc as tc  # noqa: E402

#: the models trained (bench_multihost_tc's)
MODELS = ("MLP", "ResNet-18")
#: the jobs: HVDLITE_OVERLAP's value; the last is the baseline
OVERLAP = ("on", "off")


def _timed_steps(step, iters: int, comm) -> float:
    """The median over *iters* calls of *step* of the slowest rank's seconds."""
    import statistics
    import time

    from mpi4py import MPI

    times = []
    for _ in range(iters):
        comm.Barrier()
        start = time.perf_counter()
        step()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return statistics.median(times)


# ------------------------------------------------------------------ worker side
def worker(iters: int) -> None:
    """Train each model of :data:`MODELS` for *iters* steps without, then with, rank
    0's timeline; rank 0 prints both step times and the traced steps' overlap (ms
    per step) as a result line."""
    from mpi4py import MPI

    import hvdlite as hvd
    from hvdlite.timeline import Trace
    from hvdlite.timeline.overlap import overlap, totals

    hvd.init()
    comm = MPI.COMM_WORLD
    traces = tempfile.mkdtemp(prefix="hvd-overlap-") if hvd.rank() == 0 else ""
    out = {}
    for name in MODELS:
        step = tc._torch_step(name=name)
        step()  # the first step negotiates every name with the coordinator
        plain = _timed_steps(step, iters, comm)
        path = os.path.join(traces, f"{name}.json")
        hvd.start_timeline(path)  # rank 0 writes; the other ranks return at once
        traced = _timed_steps(step, iters, comm)
        hvd.stop_timeline()
        if hvd.rank() == 0:
            sums = totals(overlap(Trace.load(path))[0])
            count = max(1, sums["steps"])
            out[name] = {
                "step_ms": plain * 1e3,
                "traced_step_ms": traced * 1e3,
                "steps": sums["steps"],
                "hidden_fraction": sums["hidden_fraction"],
                **{k: v / count for k, v in sums.items() if k.endswith("_ms")},
            }
    if hvd.rank() == 0:
        print(tc.RESULT + json.dumps(out), flush=True)
    hvd.shutdown()


# ------------------------------------------------------------------ launcher side
def run_jobs(hosts, iters: int) -> dict:
    """One job per value of :data:`OVERLAP`: its result line, by value."""
    from helpers_runner.common import clean_env, hvdrun_cmd, run

    results = {}
    for overlap in OVERLAP:
        cmd = hvdrun_cmd(
            *tc._placement(hosts), sys.executable, __file__, "--worker", "--iters", str(iters)
        )
        result = run(hosts.wrap("h1", cmd), env=clean_env(HVDLITE_OVERLAP=overlap), timeout=600)
        lines = [line for line in result.stdout.splitlines() if tc.RESULT in line]
        if result.returncode or not lines:
            raise RuntimeError(
                f"HVDLITE_OVERLAP={overlap} job failed ({result.returncode}):\n"
                f"{result.output[-4000:]}"
            )
        results[overlap] = json.loads(lines[-1].split(tc.RESULT, 1)[1])
    return results


def report(results: dict) -> str:
    lines = [
        f"{'model':11s}{'overlap':>8s}{'step':>9s}{'traced':>9s}{'backward':>10s}"
        f"{'sync':>9s}{'comm':>9s}{'hidden':>9s}{'exposed':>9s}{'hidden':>8s}",
        f"{'':19s}" + "".join(f"{'ms':>{w}s}" for w in (9, 9, 10, 9, 9, 9, 9)),
    ]
    for name in MODELS:
        for overlap in OVERLAP:
            r = results[overlap][name]
            lines.append(
                f"{name:11s}{overlap:>8s}{r['step_ms']:9.1f}{r['traced_step_ms']:9.1f}"
                f"{r['backward_ms']:10.1f}{r['synchronize_ms']:9.1f}"
                f"{r['communication_ms']:9.1f}{r['hidden_ms']:9.1f}{r['exposed_ms']:9.1f}"
                f"{r['hidden_fraction']:8.0%}"
            )
    base = OVERLAP[-1]
    for name in MODELS:
        off = results[base][name]
        for overlap in OVERLAP[:-1]:
            on = results[overlap][name]
            lines.append(
                f"{name} step, HVDLITE_OVERLAP={overlap} vs {base}: {on['step_ms']:.1f} vs "
                f"{off['step_ms']:.1f} ms = {on['step_ms'] / off['step_ms']:.2f}x; "
                f"exposed communication {on['exposed_ms']:.1f} vs {off['exposed_ms']:.1f} ms, "
                f"hidden {on['hidden_ms']:.1f} of {on['communication_ms']:.1f} ms"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--hosts", type=int, default=3, choices=(2, 3))
    parser.add_argument("--iters", type=int, default=5, help="steps timed, and steps traced")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--delay", default="0.2ms")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.iters)
        return 0
    from helpers_runner.netns_hosts import NetnsHosts, reason_unavailable, remove_stale

    reason = reason_unavailable()
    if reason:
        print(f"bench_overlap_tc: skipped: {reason}")
        return 0
    remove_stale()
    workdir = Path(tempfile.mkdtemp(prefix="hvd-overlap-tc-"))
    hosts = NetnsHosts(workdir, tuple(f"h{i + 1}" for i in range(args.hosts))).start()
    try:
        shaped = tc._shape(hosts, args.rate, args.delay)
        results = run_jobs(hosts, args.iters)
    finally:
        hosts.stop()
    print(
        f"{args.hosts} hosts x 2 ranks, each host's link {shaped}; median of {args.iters} "
        f"steps of the slowest rank ('step': no timeline, 'traced': rank 0's timeline on); "
        f"the rest is rank 0's trace, per traced step"
    )
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
