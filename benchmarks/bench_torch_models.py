"""DistributedOptimizer on real model shapes (~150 parameter tensors) beside the floor and DDP.

Run as ``python benchmarks/bench_torch_models.py``: it starts every job
itself, 2 ranks each, with the mpiexec beside this Python.  Two kinds of job
take turns, each training both models one after the other:

- ``interleaved``: one process per rank holds one copy of the model per mode
  below and trains them in turns of a few steps each (order reversed every
  other turn), so that whatever the machine does meanwhile falls on every
  mode alike:

  - ``nocomm``: no communication;
  - ``floor``: no communication, but every step what any 2-rank allreduce
    must at least do here: a barrier (the ranks run in lockstep) and one copy
    plus one add over every gradient (``_jobs.torch_floor``).  hvdlite cannot
    be faster than this;
  - ``exchange``: the floor with its copy made in shared memory and its add
    taking the peer's copy (``torch_floor(exchange=True)``): every gradient
    byte crosses between the two processes once, as in any real allreduce,
    so it also pays what moving data between the cores costs at that minute;
  - ``hvdlite``: ``hvdlite.torch.DistributedOptimizer(named_parameters=...)``
    with its defaults (gradient buckets);
  - ``hvdlite-pertensor``: the same with ``bucket_cap_mb=0`` (one allreduce
    per gradient), where ``DistributedOptimizer`` takes that argument;

- ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` over gloo on
  localhost (``broadcast_buffers=False``: neither side syncs BN statistics),
  in jobs of its own.

Workloads (built here, SGD with momentum, one torch thread per rank, CPU-sized
so a step takes tens of ms):

- ``resnet``: ResNet-50's layout (bottleneck blocks 3-4-6-3, conv + BN, no
  conv biases, 161 parameter tensors) at width 8 on 32x32x3 inputs, batch 8
  per rank;
- ``transformer``: ``torch.nn.TransformerEncoder``, 12 layers, d_model 64,
  4 heads, feed-forward 128, sequences of 32 tokens, batch 8 per rank (150
  parameter tensors).

Method: a turn's figure is its median step time; a ratio is the median over
all turns of all jobs of the two modes' ratio in the same turn, and each
job's own median ratio is printed beside it (the machine's speed drifts
from minute to minute, and separate jobs per mode put the modes minutes
apart).  DDP's figure is its best job against hvdlite's best job.  Printed
per model: each figure beside its baseline and the ratio (targets: hvdlite /
floor step time <= 1.05, hvdlite / DDP throughput >= 1.6), and the floor's
own throughput vs DDP: the most any allreduce can reach here, so where it is
below 1.6 the DDP target is out of reach on this machine.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time

import _jobs

RANKS = _jobs.RANKS
JOBS = ("interleaved", "ddp")
INTERLEAVED = ("nocomm", "floor", "exchange", "hvdlite", "hvdlite-pertensor")
MODELS = ("resnet", "transformer")
BATCH = {"resnet": 8, "transformer": 8}
SEQ = 32
VOCAB = 1000
TITLE = {
    "resnet": "ResNet-style CNN (bottlenecks 3-4-6-3, width 8, conv+BN), 32x32x3 inputs",
    "transformer": "nn.TransformerEncoder (12 layers, d_model 64, 4 heads, ff 128), 32 tokens",
}


# ------------------------------------------------------------------ models


def _resnet():
    import torch.nn.functional as F
    from torch import nn

    def conv_bn(cin, cout, kernel, stride=1):
        return nn.Sequential(
            nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout)
        )

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            self.a = conv_bn(cin, width, 1)
            self.b = conv_bn(width, width, 3, stride)
            self.c = conv_bn(width, 4 * width, 1)
            self.down = (
                conv_bn(cin, 4 * width, 1, stride)
                if stride != 1 or cin != 4 * width
                else nn.Identity()
            )

        def forward(self, x):
            y = self.c(F.relu(self.b(F.relu(self.a(x)))))
            return F.relu(y + self.down(x))

    width, blocks, cin = 8, [], 8
    for stage, n in enumerate((3, 4, 6, 3)):
        for i in range(n):
            blocks.append(Bottleneck(cin, width << stage, 2 if i == 0 and stage else 1))
            cin = 4 * (width << stage)
    # A stride-2 stem keeps the first stage at 16x16 (a step in tens of ms).
    return nn.Sequential(
        conv_bn(3, width, 3, 2),
        nn.ReLU(),
        *blocks,
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(cin, 10),
    )


def _transformer():
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self, d_model=64, layers=12):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d_model)
            self.pos = nn.Parameter(torch.zeros(SEQ, d_model))
            layer = nn.TransformerEncoderLayer(d_model, 4, 128, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, 10)

        def forward(self, tokens):
            return self.head(self.norm(self.encoder(self.embed(tokens) + self.pos)).mean(1))

    return Encoder()


def _model_and_batch(name: str, rank: int):
    import torch

    torch.manual_seed(0)  # the same initial weights on every rank
    model = _resnet() if name == "resnet" else _transformer()
    g = torch.Generator().manual_seed(rank)
    batch = BATCH[name]
    if name == "resnet":
        x = torch.randn(batch, 3, 32, 32, generator=g)
    else:
        x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    return model, x, torch.randint(0, 10, (batch,), generator=g)


# ------------------------------------------------------------------ worker side


def worker(job: str, models: list[str], turns: int, block: int, port: int) -> None:
    import torch

    torch.set_num_threads(1)
    rank, size = _jobs.rank_and_size()
    if job == "ddp":
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
        )
        for name in models:
            _time_ddp(name, rank, dist.barrier, turns * block, block)
        dist.destroy_process_group()
        return
    import hvdlite.torch as hvd

    hvd.init()
    for name in models:
        _time_interleaved(name, rank, turns, block)


def _train_step(model, opt, x, y, after_backward=None):
    import torch.nn.functional as F

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if after_backward is not None:
            after_backward()
        opt.step()

    return step


def _time_interleaved(name: str, rank: int, turns: int, block: int) -> None:
    """One model per mode in INTERLEAVED, all in this process, trained in turns of
    *block* steps (the order reversed every other turn)."""
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    steps, tensors = {}, 0
    for mode in _modes():
        model, x, y = _model_and_batch(name, rank)
        params = list(model.parameters())
        tensors = len(params)
        opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)
        after_backward = None
        if mode.startswith("hvdlite"):
            options = {"bucket_cap_mb": 0} if mode == "hvdlite-pertensor" else {}
            named = [(f"{mode}.{name}.{n}", p) for n, p in model.named_parameters()]
            opt = hvd.DistributedOptimizer(opt, named_parameters=named, **options)
        elif mode in ("floor", "exchange"):
            after_backward = _jobs.torch_floor(params, exchange=mode == "exchange")
        steps[mode] = _train_step(model, opt, x, y, after_backward)
        for _ in range(5):
            steps[mode]()
    times: dict[str, list[float]] = {mode: [] for mode in steps}
    order = list(steps)
    for turn in range(turns):
        for mode in order if turn % 2 == 0 else order[::-1]:
            MPI.COMM_WORLD.Barrier()
            times[mode].append(_jobs.median_step(steps[mode], block, 1))
    _jobs.report(model=name, tensors=tensors, turns=times)


def _time_ddp(name: str, rank: int, barrier, steps: int, block: int) -> None:
    import torch

    model, x, y = _model_and_batch(name, rank)
    model = torch.nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    step = _train_step(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), x, y)
    for _ in range(5):
        step()
    barrier()
    seconds = _jobs.median_step(step, steps, block)
    barrier()
    _jobs.report(model=name, step=seconds)


# ------------------------------------------------------------------ launcher side


def _modes() -> tuple[str, ...]:
    """INTERLEAVED, less ``hvdlite-pertensor`` where the optimizer has no ``bucket_cap_mb``."""
    import hvdlite.torch as hvd

    if "bucket_cap_mb" in inspect.signature(hvd.DistributedOptimizer).parameters:
        return INTERLEAVED
    return tuple(m for m in INTERLEAVED if m != "hvdlite-pertensor")


def _print_model(
    name: str, tensors: int, turns: dict, jobs: list[dict], ddp: list[float], block: int
) -> None:
    """*turns*: mode -> every turn's step time over all jobs; *jobs*: each job's
    turns (mode -> list); *ddp*: each DDP job's step time."""
    batch = BATCH[name]
    unit = "img/s" if name == "resnet" else "seq/s"
    n_turns = len(turns["hvdlite"])
    print(
        f"\n{name}: {TITLE[name]}; {tensors} parameter tensors, batch {batch}/rank, "
        f"{RANKS} ranks; {len(jobs)} jobs x {n_turns // len(jobs)} turns of {block} steps "
        "per mode, modes interleaved within each job (median step per turn)"
    )
    print(f"{'':40s}{'hvdlite':>12s}{'baseline':>12s}{'ratio':>8s}  target")
    median = {m: statistics.median(t) for m, t in turns.items()}

    def row(label, mode, base, note=None):
        r = _jobs.paired(turns, mode, base)
        if note is None:  # the target
            note = f"<= 1.05  {'ok' if r <= 1.05 else 'MISSED'}"
        print(
            f"{label:40s}{median[mode] * 1e3:10.2f}ms{median[base] * 1e3:10.2f}ms{r:8.3f}  {note}"
        )

    def per_job(mode, base):
        return ", ".join(f"{_jobs.paired(job, mode, base):.3f}" for job in jobs)

    row("step time vs the floor, per turn", "hvdlite", "floor")
    print(f"{'  the same, each job':40s}{'':24s}  {per_job('hvdlite', 'floor')}")
    row(
        "step time vs the exchange floor",
        "hvdlite",
        "exchange",
        f"(info; each job: {per_job('hvdlite', 'exchange')})",
    )
    crossing = _jobs.paired(turns, "exchange", "floor")
    row(
        "exchange floor vs the floor",
        "exchange",
        "floor",
        "(info; what moving the data between the cores adds; "
        + ("the 1.05 target is below the exchange floor)" if crossing > 1.05 else "room for 1.05)"),
    )
    row(
        "step time vs no communication",
        "hvdlite",
        "nocomm",
        f"(info; floor / no-comm = {_jobs.paired(turns, 'floor', 'nocomm'):.3f})",
    )
    if "hvdlite-pertensor" in turns:
        row("per tensor (bucket_cap_mb=0) vs floor", "hvdlite-pertensor", "floor", "(info)")
    best = {m: min(statistics.median(job[m]) for job in jobs) for m in ("hvdlite", "floor")}
    d = min(ddp)
    r = d / best["hvdlite"]
    print(
        f"{'throughput vs torch DDP (gloo)':40s}{RANKS * batch / best['hvdlite']:7.0f}{unit}"
        f"{RANKS * batch / d:7.0f}{unit}{r:8.3f}  >= 1.6   {'ok' if r >= 1.6 else 'MISSED'}"
        "  (best job of each)"
    )
    # No allreduce beats the floor: where the floor is itself below 1.6x DDP,
    # that target cannot be met here, and the floor's ratio is the ceiling.
    ceiling = d / best["floor"]
    print(
        f"{'floor throughput vs DDP (the ceiling)':40s}{RANKS * batch / best['floor']:7.0f}"
        f"{unit}{RANKS * batch / d:7.0f}{unit}{ceiling:8.3f}  (info; "
        f"{'the 1.6 target is above the floor' if ceiling < 1.6 else 'room for 1.6'})"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument(
        "--turns",
        type=int,
        default=8,
        help="turns per mode and job (modes take turns within a job)",
    )
    parser.add_argument("--block", type=int, default=5, help="steps per turn")
    parser.add_argument("--rounds", type=int, default=3, help="jobs of each kind, alternating")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if not set(models) <= set(MODELS):
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    if args.worker:
        worker(args.worker, models, args.turns, args.block, args.port)
        return 0

    jobs: dict[str, list[dict]] = {name: [] for name in models}
    ddp: dict[str, list[float]] = {name: [] for name in models}
    tensors: dict[str, int] = {}
    try:
        for r in range(args.rounds):
            start = time.perf_counter()
            for job in JOBS:
                for rec in _jobs.run_job(
                    __file__,
                    [
                        job,
                        "--models",
                        args.models,
                        "--turns",
                        args.turns,
                        "--block",
                        args.block,
                        "--port",
                        _jobs.free_ports()[0],
                    ],
                ):
                    if job == "ddp":
                        ddp[rec["model"]].append(rec["step"])
                    else:
                        jobs[rec["model"]].append(rec["turns"])
                        tensors[rec["model"]] = rec["tensors"]
            print(
                f"round {r + 1}/{args.rounds} ({time.perf_counter() - start:.0f}s): "
                + "; ".join(
                    f"{name} "
                    + ", ".join(
                        f"{m} {statistics.median(t) * 1e3:.1f}ms" for m, t in jobs[name][-1].items()
                    )
                    + f", ddp {ddp[name][-1] * 1e3:.1f}ms"
                    for name in models
                ),
                flush=True,
            )
    except _jobs.JobFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    for name in models:
        turns = {m: [t for job in jobs[name] for t in job[m]] for m in jobs[name][0]}
        _print_model(name, tensors[name], turns, jobs[name], ddp[name], args.block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
