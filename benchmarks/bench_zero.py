"""Sharded optimizer state: memory and step time beside the unsharded optimizer and torch's ZeRO.

Run as ``python benchmarks/bench_zero.py``: it starts every job itself, 2 ranks
each, in rounds (one job per mode per round, so load from elsewhere hits all
modes alike):

- ``hvdlite``: ``DistributedOptimizer(AdamW)``, unsharded (the baseline);
- ``sharded``: ``DistributedOptimizer(AdamW, shard_optimizer_state=True)``;
- ``zero``: torch's ``ZeroRedundancyOptimizer(AdamW)`` with DDP over gloo.

Workload: an MLP of 12 layers 2048 x 2048 (about 50 M parameters, 200 MB in
float32), batch 16 per rank, one torch thread per rank.  Printed per mode: the
optimizer state bytes on rank 0, counted from the state's tensors (target for
sharded: <= (1/N + 5 %) of unsharded), peak RSS of rank 0 (``ru_maxrss``), and
the median step time (target for sharded: <= 1.05x unsharded; ZeRO beside it).
"""

from __future__ import annotations

import argparse
import resource
import sys

import _jobs

MODES = ("hvdlite", "sharded", "zero")
WIDTH, LAYERS, BATCH = 2048, 12, 16


def _model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _state_bytes(state) -> int:
    import torch

    return sum(
        v.numel() * v.element_size()
        for per_param in state.values()
        for v in per_param.values()
        if torch.is_tensor(v)
    )


def worker(mode: str, steps: int, port: int) -> None:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    rank, size = _jobs.rank_and_size()
    model = _model()
    make = lambda params: torch.optim.AdamW(params, lr=1e-4)  # noqa: E731
    if mode in ("hvdlite", "sharded"):
        import hvdlite.torch as hvd

        hvd.init()
        opt = hvd.DistributedOptimizer(
            make(model.parameters()),
            named_parameters=model.named_parameters(),
            shard_optimizer_state=mode == "sharded",
        )
        barrier = hvd.barrier
    else:
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer

        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
        )
        model = torch.nn.parallel.DistributedDataParallel(model)
        opt = ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4
        )
        barrier = dist.barrier
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTH, generator=g)
    y = torch.randn(BATCH, WIDTH, generator=g)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()

    for _ in range(2):
        step()
    barrier()
    seconds = _jobs.median_step(step, steps, 1)
    barrier()
    state = {"hvdlite": lambda: opt.state, "sharded": lambda: opt.local.state}.get(
        mode, lambda: opt.optim.state
    )()
    params = sum(p.numel() for p in model.parameters())
    _jobs.report(
        mode=mode,
        step=seconds,
        state=_state_bytes(state),
        rss=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        params=params,
        size=size,
    )
    if mode == "zero":
        import torch.distributed as dist

        dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per job")
    parser.add_argument("--rounds", type=int, default=2, help="jobs per mode, interleaved")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.port)
        return 0
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            try:
                (record,) = _jobs.run_job(
                    __file__,
                    [mode, "--steps", args.steps, "--port", _jobs.free_ports()[0]],
                    timeout=900,
                )
            except _jobs.JobFailed as e:
                print(f"FAILED: {e}", file=sys.stderr)
                return 1
            runs[mode].append(record)
    best = {m: min(r, key=lambda rec: rec["step"]) for m, r in runs.items()}
    base, n = best["hvdlite"], best["hvdlite"]["size"]
    print(
        f"AdamW, MLP {LAYERS} x {WIDTH}x{WIDTH} ({base['params'] / 1e6:.0f} M parameters), "
        f"{n} ranks, batch {BATCH}/rank; best of {args.rounds} jobs x {args.steps} steps"
    )
    print(f"{'':36s}{'this':>12s}{'unsharded':>12s}{'ratio':>8s}  target")
    state_target = 1 / n + 0.05
    for mode, label in (("sharded", "hvdlite sharded"), ("zero", "torch ZeRO (gloo)")):
        rec = best[mode]
        ratio = rec["state"] / base["state"]
        verdict = ("ok" if ratio <= state_target else "MISSED") if mode == "sharded" else "info"
        print(
            f"{label + ': optimizer state, rank 0':36s}{rec['state'] / 2**20:10.0f}MB"
            f"{base['state'] / 2**20:10.0f}MB{ratio:8.3f}  <= {state_target:.3f} {verdict}"
        )
        print(
            f"{label + ': peak RSS, rank 0':36s}{rec['rss'] / 2**20:10.0f}MB"
            f"{base['rss'] / 2**20:10.0f}MB{rec['rss'] / base['rss']:8.3f}  info"
        )
        ratio = rec["step"] / base["step"]
        verdict = ("ok" if ratio <= 1.05 else "MISSED") if mode == "sharded" else "info"
        print(
            f"{label + ': step time':36s}{rec['step'] * 1e3:10.0f}ms"
            f"{base['step'] * 1e3:10.0f}ms{ratio:8.3f}  <= 1.05 {verdict}"
        )
    print(
        f"{'hvdlite sharded vs torch ZeRO: step':36s}{best['sharded']['step'] * 1e3:10.0f}ms"
        f"{best['zero']['step'] * 1e3:10.0f}ms"
        f"{best['sharded']['step'] / best['zero']['step']:8.3f}  info (baseline: ZeRO)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
