"""Hierarchical vs flat allreduce on simulated nodes, in one run.

Usage: ``python benchmarks/bench_hierarchical.py [--np 4] [--node-size 2]
[--sizes-mb 4 64] [--iters 10]``.  The script starts ``mpiexec`` (the one beside
this Python, else the one on PATH) on itself with HVDLITE_TEST_NODE_SIZE, so
consecutive ranks form simulated nodes.  Each rank then times, interleaved on
the same float32 buffers:

- flat: ``MPI.Comm.Allreduce`` on a duplicate of COMM_WORLD (the baseline);
- hierarchical: the engine's two-level algorithm called directly
  (``hvdlite.engine.transports.hierarchical.Hierarchical.allreduce``);
- hvdlite.allreduce: the full path (negotiation, engine thread) with
  HVDLITE_HIERARCHICAL_ALLREDUCE=1.

Each iteration's time is the slowest rank's; the table shows medians and the
ratio to flat (below 1 is faster).  Simulated nodes share one machine's memory,
so this measures the algorithm's overhead, not a network's inter-node cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _mpiexec() -> str:
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


def _launch(args) -> int:
    env = dict(os.environ)
    env["HVDLITE_TEST_NODE_SIZE"] = str(args.node_size)
    env["HVDLITE_HIERARCHICAL_ALLREDUCE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = [
        _mpiexec(),
        "-n",
        str(args.np),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--iters",
        str(args.iters),
        "--sizes-mb",
        *[str(s) for s in args.sizes_mb],
    ]
    return subprocess.call(cmd, env=env)


def _worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite
    from hvdlite.engine.runtime import state

    hvdlite.init()
    helper = state().engine.executor.hierarchical
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    rows = []
    for mb in args.sizes_mb:
        n = int(mb * 1024 * 1024) // 4
        data = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
        buf = np.empty_like(data)
        runs = {
            "flat": lambda b=buf: comm.Allreduce(MPI.IN_PLACE, b, MPI.SUM),
            "hierarchical": lambda b=buf: helper.allreduce(b, MPI.SUM),
            "hvdlite.allreduce": lambda d=data, m=mb: hvdlite.allreduce(
                d, op=hvdlite.Sum, name=f"bench.{m}"
            ),
        }
        times = {k: [] for k in runs}
        for it in range(args.iters + 1):  # the first round warms up
            for name, run in runs.items():
                np.copyto(buf, data)
                comm.Barrier()
                start = time.perf_counter()
                run()
                elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
                if it:
                    times[name].append(elapsed)
        rows.append((mb, {k: statistics.median(v) for k, v in times.items()}))
    if rank == 0:
        print(
            f"allreduce float32 SUM, {comm.Get_size()} ranks as simulated nodes of "
            f"{hvdlite.local_size()} (median of {args.iters}, slowest rank)"
        )
        print(
            f"{'size':>8} {'flat ms':>9} {'hier ms':>9} {'ratio':>6} "
            f"{'hvdlite ms':>11} {'ratio':>6}"
        )
        for mb, t in rows:
            flat = t["flat"]
            print(
                f"{mb:>6g}MB {flat * 1e3:9.2f} {t['hierarchical'] * 1e3:9.2f} "
                f"{t['hierarchical'] / flat:6.2f} {t['hvdlite.allreduce'] * 1e3:11.2f} "
                f"{t['hvdlite.allreduce'] / flat:6.2f}"
            )
    comm.Free()
    hvdlite.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--node-size", type=int, default=2)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[4, 64])
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return 0
    return _launch(args)


if __name__ == "__main__":
    sys.exit(main())
