"""Flat against hierarchical collectives across hosts joined by a slow link, same run.

Run as root: ``python benchmarks/bench_multihost_tc.py``.  It builds two pretend
machines (network namespaces with their own sshd, ``tests/helpers_runner/netns_hosts.py``),
shapes each one's link to the switch with ``tc netem`` (default 1 Gbit/s and 0.2 ms each
way; a token bucket for the rate alone where the kernel has no netem), and
runs ``hvdrun -np 4 -H h1:2,h2:2`` jobs from h1: ranks on one host share
memory, ranks on different hosts talk over the shaped links (both of each host's
networks are shaped: MPI may pick either).  Jobs alternate between the
flat setting and ``HVDLITE_HIERARCHICAL_ALLREDUCE=1`` /
``HVDLITE_HIERARCHICAL_ALLGATHER=1``.
Each job times allreduce of 4 MB and 64 MB and allgather of 16 MB per rank (median over
iterations of the slowest rank), and the bytes h2 received on its link during the job
are counted, so the table shows the measured cross-host bytes beside the times.  Where
the hosts cannot be built (not root, no ``ip``/``tc``/sshd) it says why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

RESULT = "BENCH-RESULT "
CASES = (("allreduce", 4), ("allreduce", 64), ("allgather", 16))


# ------------------------------------------------------------------ worker side
def worker(iters: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    out = {}

    def received() -> int:  # bytes this host received on its two networks so far
        total = 0
        for iface in ("mgmt0", "data0"):
            with open(f"/sys/class/net/{iface}/statistics/rx_bytes") as f:
                total += int(f.read())
        return total

    for kind, mb in CASES:
        x = np.ones((mb << 20) // 4, np.float32)
        if kind == "allreduce":
            fn = lambda x=x, mb=mb: hvd.allreduce(x, op=hvd.Sum, name=f"b.ar.{mb}")  # noqa: E731
        else:
            fn = lambda x=x, mb=mb: hvd.allgather(x, name=f"b.ag.{mb}")  # noqa: E731
        fn()
        times = []
        comm.Barrier()
        before = received()
        for _ in range(iters):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
        # the last rank is on h2: what its host received, per call
        per_call = (received() - before) / iters if hvd.rank() == hvd.size() - 1 else 0.0
        out[f"{kind} {mb} MB"] = (statistics.median(times), comm.allreduce(per_call))
    if hvd.rank() == 0:
        print(RESULT + json.dumps(out), flush=True)
    hvd.shutdown()


# ------------------------------------------------------------------ launcher side
def _shape(hosts, rate: str, delay: str) -> str:
    """Shape each host's link: netem (rate and delay) where the kernel has it, else a
    token bucket (rate only).  Returns what was applied."""
    from helpers_runner.netns_hosts import DATA_IFACE, MGMT_IFACE

    def tc(host, iface, *qdisc) -> bool:
        cmd = ["ip", "netns", "exec", host.namespace, "tc", "qdisc", "replace", "dev", iface]
        return subprocess.run([*cmd, "root", *qdisc], capture_output=True).returncode == 0

    applied = ""
    for host in hosts.hosts.values():
        for iface in (MGMT_IFACE, DATA_IFACE):  # MPI may pick either network
            if tc(host, iface, "netem", "delay", delay, "rate", rate):
                applied = f"{rate} and {delay} each way (tc netem)"
            elif tc(host, iface, "tbf", "rate", rate, "burst", "256kb", "latency", "100ms"):
                applied = f"{rate} (tc tbf; this kernel has no netem, so no added delay)"
            else:
                raise RuntimeError("tc could not shape the hosts' links (no netem, no tbf)")
    return applied


def run_job(hosts, hierarchical: bool, iters: int) -> tuple[dict, int]:
    from helpers_runner.common import clean_env, hvdrun_cmd, run
    from helpers_runner.netns_hosts import DATA_IFACE, MGMT_IFACE

    flag = "1" if hierarchical else "0"
    env = clean_env(HVDLITE_HIERARCHICAL_ALLREDUCE=flag, HVDLITE_HIERARCHICAL_ALLGATHER=flag)
    before = sum(hosts.rx_bytes("h2", i) for i in (MGMT_IFACE, DATA_IFACE))
    cmd = hvdrun_cmd(
        "-np", "4", "-H", "h1:2,h2:2", sys.executable, __file__, "--worker", "--iters", str(iters)
    )
    result = run(hosts.wrap("h1", cmd), env=env, timeout=900)
    received = sum(hosts.rx_bytes("h2", i) for i in (MGMT_IFACE, DATA_IFACE)) - before
    lines = [line for line in result.stdout.splitlines() if RESULT in line]
    if result.returncode or not lines:
        raise RuntimeError(f"job failed ({result.returncode}):\n{result.output[-4000:]}")
    return json.loads(lines[-1].split(RESULT, 1)[1]), received


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--delay", default="0.2ms")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.iters)
        return 0
    from helpers_runner.netns_hosts import NetnsHosts, reason_unavailable, remove_stale

    reason = reason_unavailable()
    if reason:
        print(f"bench_multihost_tc: skipped: {reason}")
        return 0
    remove_stale()
    hosts = NetnsHosts(Path(tempfile.mkdtemp(prefix="hvd-tc-")), ("h1", "h2")).start()
    try:
        shaped = _shape(hosts, args.rate, args.delay)
        runs = {False: [], True: []}
        for _ in range(args.rounds):
            for hierarchical in (False, True):
                runs[hierarchical].append(run_job(hosts, hierarchical, args.iters))
    finally:
        hosts.stop()
    print(
        f"2 hosts x 2 ranks, each host's link {shaped}; "
        f"median of {args.iters} iterations, best of {args.rounds} jobs per setting"
    )
    print(
        f"{'':18s}{'hierarchical':>14s}{'flat':>10s}{'ratio':>7s}"
        f"{'into h2, hier.':>16s}{'flat':>9s}{'ratio':>7s}"
    )
    for case in runs[False][0][0]:
        flat = min(r[0][case][0] for r in runs[False])
        hier = min(r[0][case][0] for r in runs[True])
        flat_in = min(r[0][case][1] for r in runs[False])
        hier_in = min(r[0][case][1] for r in runs[True])
        print(
            f"{case:18s}{hier * 1e3:12.1f}ms{flat * 1e3:8.1f}ms{hier / flat:7.2f}"
            f"{hier_in / 2**20:14.1f}MB{flat_in / 2**20:7.1f}MB{hier_in / flat_in:7.2f}"
        )
    flat_bytes = min(r[1] for r in runs[False])
    hier_bytes = min(r[1] for r in runs[True])
    print(
        f"{'bytes into h2, a job':22s}{hier_bytes / 2**20:12.0f}MB{flat_bytes / 2**20:10.0f}MB"
        f"{hier_bytes / flat_bytes:8.2f}  (the cross-host bytes the hierarchical path saves)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
