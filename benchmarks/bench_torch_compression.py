"""Bytes sent and step time of DistributedOptimizer per gradient compression.

Run as ``python benchmarks/bench_torch_compression.py``: it starts its own
2-rank jobs with the mpiexec beside this Python.  Compared, side by side:

- ``none``: plain averaged allreduce of float32 gradients (the baseline);
- ``fp16``: the same allreduce with gradients cast to float16 on the wire;
- ``topk``: ``Compression.topk(0.01)``: 1 % of each gradient's entries
  (float32 values + int64 indices) allgathered, error feedback;
- ``powersgd``: ``Compression.powersgd(rank=4, start_step=0)``: rank-4
  factors of each weight matrix in two allreduces, biases uncompressed;
- ``local``: the same step without any communication (for reference).

Workload: MLP 784-1024-1024-10, batch 64 per rank, SGD with momentum, one
torch thread per rank.  Every job trains one model per mode and times them in
interleaved blocks of steps (so load from elsewhere on the machine hits all
modes alike); a mode's step time is the median over its blocks, and the best
over the jobs.  Bytes per step are ``optimizer.bytes_sent_last_step``: the
payload each rank hands to the engine per step.  Printed with the ratio to
``none`` from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 64
RANKS = 2
MODES = ("none", "fp16", "topk", "powersgd", "local")
LABELS = {
    "none": "none (float32)",
    "fp16": "fp16",
    "topk": "top-k 1 %",
    "powersgd": "PowerSGD rank 4",
    "local": "no communication",
}


# ------------------------------------------------------------------ worker side


def _compression(hvd, mode: str):
    if mode == "topk":
        return hvd.Compression.topk(0.01)
    if mode == "powersgd":
        return hvd.Compression.powersgd(rank=4, start_step=0)
    return getattr(hvd.Compression, mode)


def worker(steps: int, block: int) -> None:
    import torch
    import torch.nn.functional as F
    from torch import nn

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    setups = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if mode != "local":
            opt = hvd.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), compression=_compression(hvd, mode)
            )
        setups[mode] = (model, opt)
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(BATCH, 784, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)

    def run(mode: str, n: int) -> None:
        model, opt = setups[mode]
        for _ in range(n):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

    for mode in MODES:
        run(mode, 10)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    hvd.barrier()
    for _ in range(steps // block):
        for mode in MODES:
            hvd.barrier()  # start each block together: no rank's wait is charged to the next
            t0 = time.perf_counter()
            run(mode, block)
            times[mode].append((time.perf_counter() - t0) / block)
    hvd.barrier()
    if hvd.rank() == 0:
        result = {
            m: {
                "step": statistics.median(times[m]),
                "bytes": getattr(setups[m][1], "bytes_sent_last_step", 0),
            }
            for m in MODES
        }
        print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------ launcher side


def _mpiexec() -> str:
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


def run_job(steps: int, block: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [
        _mpiexec(),
        "-n",
        str(RANKS),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        "--steps",
        str(steps),
        "--block",
        str(block),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(
        f"job failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per mode and job")
    parser.add_argument("--block", type=int, default=10, help="steps per timing block")
    parser.add_argument("--rounds", type=int, default=3, help="jobs")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.steps, args.block)
        return 0

    jobs = []
    for r in range(args.rounds):
        jobs.append(run_job(args.steps, args.block))
        print(
            f"job {r + 1}/{args.rounds}: "
            + ", ".join(f"{m} {jobs[-1][m]['step'] * 1e3:.2f} ms" for m in MODES),
            flush=True,
        )
    step = {m: min(j[m]["step"] for j in jobs) for m in MODES}
    sent = {m: jobs[-1][m]["bytes"] for m in MODES}

    print(
        f"\nMLP 784-1024-1024-10, batch {BATCH}/rank, SGD momentum, 1 thread/rank, "
        f"{RANKS} ranks; best of {args.rounds} jobs x {args.steps} steps per mode "
        f"(median of blocks of {args.block})"
    )
    print(
        f"{'compression':20s}{'bytes/step/rank':>17s}{'vs none':>10s}"
        f"{'step time':>13s}{'vs none':>10s}"
    )
    for m in MODES:
        bytes_col = (
            f"{sent[m]:>17,d}{sent[m] / sent['none']:>10.4f}"
            if m != "local"
            else f"{'0':>17s}{'':>10s}"
        )
        print(f"{LABELS[m]:20s}{bytes_col}{step[m] * 1e3:>11.2f}ms{step[m] / step['none']:>10.3f}")
    print(
        "bytes: what each rank hands to the engine per step.  fp16: the adapter widens "
        "float16 to float32\nwith torch's cast before the engine (MPI has no fast float16 "
        "sum), so MPI moves as many bytes\nas for none, and the two casts make up its extra "
        "step time.\nOn one machine MPI is a memory copy: "
        "compression trades compute for bytes a network would carry."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
