"""The cost of the timeline: the torch MLP step with it on beside the same step with it off.

Run as ``python benchmarks/bench_timeline.py``: it starts one 2-rank job (the
mpiexec beside this Python) that trains the MLP of ``bench_torch_optimizer.py``
(784-1024-1024-10, batch 64 per rank, SGD with momentum, one torch thread per
rank) through ``hvdlite.torch.DistributedOptimizer``, and alternates blocks of
steps with the timeline off and on (``hvd.start_timeline`` / ``stop_timeline``
between blocks, rank 0 writing with cycle marks to a temporary file), so load
from elsewhere on the machine hits both alike.  Each block's figure is its mean
step time; each mode's figure the median over its blocks.  Printed: both
figures and their ratio (target: on / off <= 1.05), plus the size of the trace.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import _jobs  # noqa: E402
import bench_torch_optimizer as mlp  # noqa: E402 - the same workload


def worker(pairs: int, block: int, trace: str) -> None:
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    model = mlp._model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(mlp.BATCH, 784, generator=g)
    y = torch.randint(0, 10, (mlp.BATCH,), generator=g)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def timed_block() -> float:
        hvd.barrier()
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        return (time.perf_counter() - t0) / block

    for _ in range(20):
        step()
    times: dict[str, list[float]] = {"off": [], "on": []}
    traced_steps = 0
    for i in range(pairs):
        # Alternate which mode goes first, so neither always follows the other.
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            if mode == "on":
                hvd.start_timeline(trace, mark_cycles=True)
                traced_steps += block
            times[mode].append(timed_block())
            if mode == "on":
                hvd.stop_timeline()
    if rank == 0:
        with open(trace) as f:
            lines = sum(1 for _ in f)
        print(
            "RESULT "
            + json.dumps(
                {
                    "off": statistics.median(times["off"]),
                    "on": statistics.median(times["on"]),
                    "ratios": [a / b for a, b in zip(times["on"], times["off"])],
                    "lines_per_step": lines / block,
                }
            ),
            flush=True,
        )
    hvd.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--pairs", type=int, default=40, help="blocks per mode, interleaved")
    parser.add_argument("--block", type=int, default=20, help="steps per block")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.pairs, args.block, args.trace)
        return 0

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            _jobs.mpiexec(),
            "-n",
            str(mlp.RANKS),
            sys.executable,
            str(Path(__file__)),
            "--worker",
            "--pairs",
            str(args.pairs),
            "--block",
            str(args.block),
            "--trace",
            str(Path(tmp) / "timeline.json"),
        ]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    result = next(
        (
            json.loads(line[len("RESULT ") :])
            for line in out.stdout.splitlines()
            if line.startswith("RESULT ")
        ),
        None,
    )
    if result is None:
        print(f"job failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
        return 1
    ratio = result["on"] / result["off"]
    spread = statistics.quantiles(result["ratios"], n=4) if len(result["ratios"]) > 1 else []
    print(
        f"MLP 784-1024-1024-10, batch {mlp.BATCH}/rank, {mlp.RANKS} ranks, "
        f"hvdlite.torch.DistributedOptimizer; {args.pairs} blocks of {args.block} steps per "
        "mode, interleaved in one job (median of block means)"
    )
    print(f"{'':34s}{'timeline on':>12s}{'off':>12s}{'ratio':>9s}  target")
    print(
        f"{'step time':34s}{result['on'] * 1e3:10.3f}ms{result['off'] * 1e3:10.3f}ms"
        f"{ratio:9.3f}  <= 1.05  {'ok' if ratio <= 1.05 else 'MISSED'}"
    )
    if spread:
        print(
            f"{'per-pair ratio, quartiles':34s}{'':24s}{spread[0]:9.3f} {spread[1]:.3f} "
            f"{spread[2]:.3f}  (info: the noise)"
        )
    print(f"{'trace lines per step (info)':34s}{result['lines_per_step']:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
