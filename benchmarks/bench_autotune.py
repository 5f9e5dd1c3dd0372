"""Autotune from a bad start: does the torch MLP step come back to the hand-tuned default?

Run as ``python benchmarks/bench_autotune.py`` (``make bench`` runs it too): it
starts every job itself, 2 ranks each, with the mpiexec beside this Python, and
runs the jobs in interleaved rounds (default, bad, autotune, repeated) so load
from elsewhere on the machine hits all of them alike:

- ``default``: hvdlite's default knobs (fusion threshold 64 MiB, cycle time 1 ms);
- ``bad``: a deliberately bad setting, fusion threshold 64 KiB and cycle time 20 ms;
- ``autotune``: the bad setting as the start, with ``HVDLITE_AUTOTUNE=1`` and
  Horovod's defaults (3 warmup samples, 10 steps per sample, 20 samples).

Workload: the MLP of ``bench_torch_optimizer.py`` (784-1024-1024-10, batch 64
per rank, SGD with momentum, one torch thread per rank).  Each job's figure is
the median step time over its last 20 % of steps (for autotune: after it
settled); each mode's figure is the best of its rounds.  Printed: the samples
autotune took, the step at which it settled, the setting it kept, and the
ratio autotune / default (target: <= 1.10).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _jobs  # noqa: E402
import bench_torch_optimizer as mlp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RANKS = 2
MODES = ("default", "bad", "autotune")
_BAD = {"HVDLITE_FUSION_THRESHOLD": str(64 * 1024), "HVDLITE_CYCLE_TIME": "20"}
TARGET = 1.10


def worker(mode: str, steps: int) -> None:
    import torch
    import torch.nn.functional as F

    import hvdlite.torch as hvd
    from hvdlite.engine.runtime import state

    torch.set_num_threads(1)
    hvd.init()
    model = mlp._model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(mlp.BATCH, 784, generator=g)
    y = torch.randint(0, 10, (mlp.BATCH,), generator=g)
    link = state().engine.tuning
    tuner = link.tuner if link is not None else None
    settled_at = None
    hvd.barrier()
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if tuner is not None and settled_at is None and tuner.finished:
            settled_at = step
    hvd.barrier()
    if hvd.rank() == 0:
        tail = times[-max(1, steps // 5) :]
        result = {"mode": mode, "step": statistics.median(tail)}
        if tuner is not None:
            result.update(
                samples=tuner.samples,
                warmups=tuner.warmups,
                settled_at=settled_at,
                setting=link.applied.describe(),
                changes=len(link.history),
            )
        print("RESULT " + json.dumps(result), flush=True)


def run_job(mode: str, steps: int, log_dir: str, round_no: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in list(env):
        if "AUTOTUNE" in name or name.endswith(("_FUSION_THRESHOLD", "_CYCLE_TIME")):
            del env[name]
    if mode != "default":
        env.update(_BAD)
    if mode == "autotune":
        env["HVDLITE_AUTOTUNE"] = "1"
        env["HVDLITE_AUTOTUNE_LOG"] = os.path.join(log_dir, f"autotune-{round_no}.csv")
    cmd = [
        _jobs.mpiexec(),
        "-n",
        str(RANKS),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--steps",
        str(steps),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(
        f"{mode} job failed (exit {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=400, help="steps per job")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per mode, interleaved")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps)
        return 0

    log_dir = tempfile.mkdtemp(prefix="hvdlite-bench-autotune-")
    results: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            results[mode].append(run_job(mode, args.steps, log_dir, r))
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{m} {results[m][-1]['step'] * 1e3:.2f} ms" for m in MODES),
            flush=True,
        )
    step = {m: min(x["step"] for x in v) for m, v in results.items()}
    print(
        f"\nMLP 784-1024-1024-10, batch {mlp.BATCH}/rank, {RANKS} ranks, {args.steps} steps per "
        f"job; median step time of the last 20 % of steps, best of {args.rounds} jobs"
    )
    for tuned in results["autotune"]:
        print(
            f"  autotune job: {tuned['warmups']} warmup + {tuned['samples']} samples, settled "
            f"at step {tuned['settled_at']}, {tuned['changes']} changes of setting; kept "
            f"{tuned['setting']}"
        )
    print(f"  CSV logs: {log_dir}")
    print(f"{'':34s}{'value':>12s}{'default':>12s}{'ratio':>9s}  target")
    for mode in ("bad", "autotune"):
        ratio = step[mode] / step["default"]
        verdict = (
            f"<= {TARGET:.2f}  {'ok' if ratio <= TARGET else 'MISSED'}"
            if mode == "autotune"
            else "(info: the start autotune recovers from)"
        )
        print(
            f"{'step time, ' + mode + ' vs default':34s}{step[mode] * 1e3:10.2f}ms"
            f"{step['default'] * 1e3:10.2f}ms{ratio:9.3f}  {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
