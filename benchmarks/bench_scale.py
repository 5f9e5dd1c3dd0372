"""What a training step costs the control plane at 2 to 32 ranks, counted, not timed.

Usage: ``python benchmarks/bench_scale.py [--ranks 2 4 8 16 32] [--tensors 16]
[--steps 20]``.  It starts one job per size (the mpiexec beside this Python,
oversubscribed on a small machine: timings there are noise, so none are
printed).  Each rank wraps the engine's communicators in counters:

- control: the engine's private communicator (the status exchange's
  ``Iallreduce``, the coordinator's ``gather`` and ``bcast``, the doorbell's
  sends and posted receives); bytes are the payload a rank hands to MPI (the
  status vector; the pickled requests and responses; one byte per ring), and
  rank 0's gather counts what it receives from every rank;
- data: the global process set's communicator (the fused allreduce); bytes
  are the payload per rank, before MPI's own algorithm (a ring allreduce puts
  about twice that on the wire).

The workload is a training step: ``--tensors`` named allreduces of mixed sizes
(about 1 MB together), submitted asynchronously and then waited on, as a
DistributedOptimizer does.  *Steady* is the mean over ``--steps`` steps whose
names the response cache knows; *cold* the mean over three steps of names no
rank has submitted before (the coordinator negotiates each; where every rank
sent the same requests in a cycle, rank 0 decides alone and the gather is
skipped, see hvdlite/engine/negotiation.py).  Shared memory is
off so that every size takes the same MPI path.  RSS is each rank's resident
memory after the steps.

The targets (checked at the end): steady negotiation per rank independent of
N (the allreduce's log N rounds are MPI's, not counted here); cold bytes on
rank 0 at most proportional to N x tensors and on the other ranks to tensors;
RSS per rank flat in N.

Then it trains at ``--training`` sizes (8, 16 and 32 by default; ``--training``
alone skips it): a torch DistributedOptimizer and a Keras ``fit`` at each size,
each checked against one process on the global batch
(``benchmarks/_scale_training.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_RESULT = "RESULT "
_CONTROL = ("Iallreduce", "Allreduce", "gather", "bcast", "Send", "Isend", "Irecv")
_DATA = (
    "Allreduce",
    "Iallreduce",
    "Allgather",
    "Allgatherv",
    "Bcast",
    "Alltoallv",
    "Reduce_scatter",
    "Reduce_scatter_block",
)


def _mpiexec() -> str:
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


# ------------------------------------------------------------------ worker side
def _pickled(obj) -> int:
    return len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _buffer_bytes(args) -> int:
    """The payload of an uppercase (buffer) call: its first real buffer's size."""
    for arg in args:
        if isinstance(arg, (list, tuple)) and arg:
            arg = arg[0]
        nbytes = getattr(arg, "nbytes", None)
        if nbytes is not None:
            return int(nbytes)
    return 0


class Counts:
    """Calls and bytes, by name of the MPI call."""

    def __init__(self):
        self.calls: dict[str, int] = {}
        self.bytes: dict[str, int] = {}

    def add(self, name: str, nbytes: int) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        self.bytes[name] = self.bytes.get(name, 0) + nbytes

    def snapshot(self) -> tuple[int, int, dict]:
        return sum(self.calls.values()), sum(self.bytes.values()), dict(self.calls)


class CountingComm:
    """A communicator that counts the calls named in *counted* and forwards everything."""

    def __init__(self, comm, counts: Counts, counted):
        self._comm = comm
        self._counts = counts
        self._counted = frozenset(counted)
        self._rank = comm.Get_rank()

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in self._counted:
            return attr
        counts, rank = self._counts, self._rank
        if name == "gather":

            def gather(obj, root=0):
                out = attr(obj, root=root)
                nbytes = _pickled(obj)
                if rank == root:  # what arrives from the other ranks
                    nbytes += sum(_pickled(item) for r, item in enumerate(out) if r != root)
                counts.add(name, nbytes)
                return out

            return gather
        if name == "bcast":

            def bcast(obj, root=0):
                out = attr(obj, root=root)
                counts.add(name, _pickled(out))
                return out

            return bcast

        def call(*args, **kwargs):
            counts.add(name, _buffer_bytes(args))
            return attr(*args, **kwargs)

        return call


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd
    from hvdlite.engine.runtime import state

    hvd.init()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    st = state()
    engine = st.engine
    control, bell, data = Counts(), Counts(), Counts()
    counting = CountingComm(engine.comm, control, _CONTROL)
    engine.comm = counting  # the coordinator's gather and bcast
    engine._status._comm = counting  # the status exchange
    # Rings, and the receive posted again after each, counted apart.
    engine.doorbell.comm = CountingComm(engine.doorbell.comm, bell, _CONTROL)
    sets = engine.executor._sets
    sets._comms[0] = CountingComm(sets._comms[0], data, _DATA)  # the global set's data

    # About 1 MB of gradients in --tensors tensors of mixed sizes, as a small model's.
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.integers(64, 2 * 2**18 // args.tensors, args.tensors)]
    grads = [np.full(n, rank, np.float32) for n in sizes]
    expected = size * (size - 1) / 2

    def step(prefix: str) -> None:
        handles = [
            hvd.allreduce_async(g, op=hvd.Sum, name=f"{prefix}.{i}") for i, g in enumerate(grads)
        ]
        for handle in handles:
            out = hvd.synchronize(handle)
            assert out[0] == expected, (out[0], expected)

    def measure(prefixes) -> dict:
        world.Barrier()
        c0, b0, d0, cycles0 = control.snapshot(), bell.snapshot(), data.snapshot(), engine.cycles
        rang0 = engine.doorbell.rings
        for prefix in prefixes:
            step(prefix)
        c1, b1, d1 = control.snapshot(), bell.snapshot(), data.snapshot()
        n = len(prefixes)
        sends = {k: (v - b0[2].get(k, 0)) / n for k, v in b1[2].items()}
        negotiation = {k: (v - c0[2].get(k, 0)) / n for k, v in c1[2].items()}
        return {
            "ctrl_calls": (c1[0] - c0[0]) / n,
            "ctrl_bytes": (c1[1] - c0[1]) / n,
            "data_calls": (d1[0] - d0[0]) / n,
            "data_bytes": (d1[1] - d0[1]) / n,
            "cycles": (engine.cycles - cycles0) / n,
            "rang": (engine.doorbell.rings - rang0) / n,
            "gathers": negotiation.get("gather", 0),
            "answers": negotiation.get("bcast", 0),
            "rings": sends.get("Send", 0) + sends.get("Isend", 0),
        }

    step("grad")  # fill the response cache
    steady = measure(["grad"] * args.steps)
    cold = measure([f"cold{k}" for k in range(3)])
    mine = {"steady": steady, "cold": cold, "rss_mb": _rss_mb()}
    everyone = world.gather(mine, root=0)
    hvd.shutdown()
    if rank == 0:
        print(
            _RESULT
            + json.dumps(
                {
                    "ranks": size,
                    "tensors": args.tensors,
                    "data_payload": sum(sizes) * 4,
                    "per_rank": everyone,
                }
            ),
            flush=True,
        )


# ---------------------------------------------------------------- launcher side
def _run(n: int, args) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["HVDLITE_SHM_ALLREDUCE_DISABLE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [
        _mpiexec(),
        "-n",
        str(n),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--tensors",
        str(args.tensors),
        "--steps",
        str(args.steps),
    ]
    out = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout
    )
    records = [
        json.loads(line[len(_RESULT) :])
        for line in out.stdout.splitlines()
        if line.startswith(_RESULT)
    ]
    if out.returncode or not records:
        raise RuntimeError(
            f"{n} ranks: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        )
    return records[0]


def _training(n: int, framework: str, args) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [
        _mpiexec(),
        "-n",
        str(n),
        sys.executable,
        str(Path(__file__).resolve().with_name("_scale_training.py")),
        framework,
    ]
    out = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout
    )
    lines = [line for line in out.stdout.splitlines() if "equal to one process" in line]
    if out.returncode or not lines:
        raise RuntimeError(
            f"{framework} at {n} ranks: exit {out.returncode}\n"
            f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        )
    return lines[0]


def _summary(record: dict, phase: str) -> dict:
    ranks = record["per_rank"]
    rows = [r[phase] for r in ranks]
    others = rows[1:] or rows

    def mean(key, of=rows):
        return statistics.fmean(r[key] for r in of)

    return {
        "n": record["ranks"],
        "cycles": rows[0]["cycles"],
        "calls_rank": mean("ctrl_calls", others),
        "bytes_rank": mean("ctrl_bytes", others),
        "calls_0": rows[0]["ctrl_calls"],
        "bytes_0": rows[0]["ctrl_bytes"],
        "rings_max": max(r["rings"] for r in rows),
        "rings_all": sum(r["rings"] for r in rows),
        "ringers": sum(r["rang"] for r in rows),
        "skipped": 100 * (1 - rows[0]["gathers"] / rows[0]["answers"])
        if rows[0]["answers"]
        else 0.0,
        "data_bytes": mean("data_bytes"),
        "data_calls": mean("data_calls"),
        "rss": statistics.fmean(r["rss_mb"] for r in ranks),
        "rss_max": max(r["rss_mb"] for r in ranks),
    }


def _table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'':11} | {'negotiation: a rank, rank 0':<36} | {'doorbell':<26} | data")
    print(
        f"{'N':>4} {'cycles':>6} | {'calls':>5} {'bytes':>6} | {'rank 0 calls':>12} "
        f"{'rank 0 B':>9} | {'ringers':>7} {'msgs':>6} {'max 1 rank':>10} | {'calls':>5} "
        f"{'B per rank':>10}"
    )
    for r in rows:
        print(
            f"{r['n']:>4} {r['cycles']:>6.2f} | {r['calls_rank']:>5.2f} "
            f"{r['bytes_rank']:>6.0f} | {r['calls_0']:>12.2f} {r['bytes_0']:>9.0f} | "
            f"{r['ringers']:>7.2f} "
            f"{r['rings_all']:>6.2f} {r['rings_max']:>10.2f} | {r['data_calls']:>5.2f} "
            f"{r['data_bytes']:>10.0f}"
        )


def _checks(steady: list[dict], cold: list[dict], tensors: int) -> list[str]:
    lines = []
    # Steady: per-rank negotiation (the doorbell's rings, which one rank sends to
    # N - 1 peers, have columns of their own) must not grow with N.
    quiet = [r["bytes_rank"] for r in steady]
    spread = max(quiet) / min(quiet)
    lines.append(
        f"steady negotiation bytes per rank {min(quiet):.0f}-{max(quiet):.0f} B over N:"
        f" max/min {spread:.2f} ({'flat' if spread < 1.5 else 'GROWS with N'})"
    )
    ringers = [r["ringers"] for r in steady]
    lines.append(
        "doorbell: ringers per step "
        + ", ".join(f"{v:.2f}" for v in ringers)
        + "; each ringer sends N - 1 messages (O(N) on the ringer)"
    )
    # At most O(N x tensors): a cold cycle on which every rank sent the same requests
    # skips the gather (rank 0 decides alone), which makes it O(tensors).
    per_nt = [r["bytes_0"] / (r["n"] * tensors) for r in cold]
    lines.append(
        "cold bytes on rank 0 per (N x tensor): "
        + ", ".join(f"{v:.0f}" for v in per_nt)
        + (
            " (at most O(N x tensors));"
            if max(per_nt) <= 1.5 * per_nt[0]
            else " (GROWS faster than N x tensors);"
        )
        + " negotiations that skipped the gather: "
        + ", ".join(f"{r['skipped']:.0f} %" for r in cold)
    )
    per_t = [r["bytes_rank"] / tensors for r in cold]
    lines.append(
        "cold bytes on another rank per tensor: "
        + ", ".join(f"{v:.0f}" for v in per_t)
        + f" ({'O(tensors)' if max(per_t) / min(per_t) < 1.5 else 'GROWS with N'})"
    )
    rss = [r["rss"] for r in steady]
    lines.append(
        f"RSS per rank {min(rss):.0f}-{max(rss):.0f} MB over N "
        f"({'flat' if max(rss) / min(rss) < 1.25 else 'GROWS with N'})"
    )
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--training", type=int, nargs="*", default=[8, 16, 32])
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    records = [_run(n, args) for n in args.ranks]
    steady = [_summary(r, "steady") for r in records]
    cold = [_summary(r, "cold") for r in records]
    payload = records[0]["data_payload"]
    print(
        f"One training step: {args.tensors} allreduces, {payload / 2**20:.2f} MB per rank; "
        "counts per step (mean over steps).\n"
        "negotiation: MPI calls and bytes of the status exchange, gather and bcast, per rank "
        "(mean over ranks 1..N-1) and on rank 0 (the coordinator);\n"
        "doorbell: ranks that rang, ring messages of all ranks, the most one rank sent "
        "(its posted receives are counted in none);\n"
        "data: calls and payload bytes per rank on the global set's communicator."
    )

    _table(f"steady state (response cache hit, {args.steps} steps)", steady)
    _table("cold (every name new: negotiated by rank 0, 3 steps)", cold)
    print(
        "\nRSS per rank (MB, mean / max): "
        + ", ".join(f"N={r['n']}: {r['rss']:.0f} / {r['rss_max']:.0f}" for r in steady)
    )
    print()
    for line in _checks(steady, cold, args.tensors):
        print("check: " + line)
    if args.training:
        print()
    for n in args.training:
        for framework in ("torch", "keras"):
            print("training: " + _training(n, framework, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
