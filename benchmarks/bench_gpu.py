"""GPU benchmark: hvdlite's device path beside raw NCCL / no communication, same run.

Run as ``python benchmarks/bench_gpu.py`` on a machine with a CUDA GPU and CuPy
(``pip install hvdlite[cuda12]``); under ``mpiexec -n 2`` it reports the 2-rank
figures through MPI (two ranks sharing one GPU: NCCL refuses that).  Without a
GPU it says so and exits 0.

Figures (medians over repetitions, each beside its baseline):
- 1 rank, NCCL: 200 x 64 KB CUDA arrays, allreduce_async + synchronize, against
  one raw ``cupy.cuda.nccl`` allreduce of a hand-packed buffer (target <= 1.2x);
  one 64 MB array against a raw allreduce of it (target <= 1.05x);
- a torch CNN training step on 1 GPU with DistributedOptimizer, against the same
  step without communication (target <= 1.10x);
- 2 ranks through MPI: the same allreduce figures, reported without a target.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time


def _no_gpu() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install hvdlite[cuda12] or hvdlite[cuda13])"
    from hvdlite.device.capabilities import cuda_available

    return None if cuda_available() else "CuPy sees no CUDA device"


def _median(fn, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _alternating(ours, base, reps: int = 30) -> tuple[float, float]:
    """Medians of *ours* and *base*, run alternately (load hits both alike)."""
    a, b = [], []
    for _ in range(reps):
        for fn, out in ((ours, a), (base, b)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(a), statistics.median(b)


def _line(label: str, ours: float, base: float, target: float | None) -> str:
    ratio = ours / base
    verdict = "" if target is None else ("  ok" if ratio <= target else f"  OVER {target}x")
    return f"{label:<44} {ours * 1e3:9.3f} ms  vs {base * 1e3:9.3f} ms  = {ratio:5.2f}x{verdict}"


def bench_allreduce(hvd, cp, raw) -> list[str]:
    size = hvd.size()
    small = [cp.ones(16384, dtype=cp.float32) for _ in range(200)]  # 64 KB each
    packed = cp.empty(16384 * 200, dtype=cp.float32)
    stream = cp.cuda.get_current_stream()

    def ours_small():
        handles = [
            hvd.allreduce_async(t, op=hvd.Sum, name=f"b.{i}", output=t) for i, t in enumerate(small)
        ]
        for h in handles:
            hvd.synchronize(h)
        stream.synchronize()

    def base_small():
        cp.concatenate([t.reshape(-1) for t in small], out=packed)
        raw(packed)
        offset = 0
        for t in small:
            t[...] = packed[offset : offset + t.size]
            offset += t.size
        stream.synchronize()

    big = cp.ones(16 << 20, dtype=cp.float32)  # 64 MB

    def ours_big():
        hvd.synchronize(hvd.allreduce_async(big, op=hvd.Sum, name="b.big", output=big))
        stream.synchronize()

    def base_big():
        raw(big)
        stream.synchronize()

    ours_small(), base_small(), ours_big(), base_big()  # warm up (NCCL, pools)
    targets = (1.2, 1.05) if size == 1 else (None, None)
    lines = [
        _line(
            f"{size} rank(s): 200 x 64 KB async + synchronize",
            *_alternating(ours_small, base_small),
            targets[0],
        ),
        _line(f"{size} rank(s): 64 MB", *_alternating(ours_big, base_big, 10), targets[1]),
    ]
    return lines


def bench_torch_step(hvd_torch) -> list[str]:
    import torch

    torch.manual_seed(0)

    def model():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4),
            torch.nn.Flatten(),
            torch.nn.Linear(64 * 16, 10),
        ).cuda()

    x = torch.randn(64, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (64,), device="cuda")
    plain_model, dist_model = model(), model()
    plain = torch.optim.SGD(plain_model.parameters(), lr=0.01)
    dist = hvd_torch.DistributedOptimizer(
        torch.optim.SGD(dist_model.parameters(), lr=0.01),
        named_parameters=dist_model.named_parameters(),
    )

    def step(m, opt):
        def run():
            opt.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
            opt.step()
            torch.cuda.synchronize()

        return run

    for _ in range(5):
        step(dist_model, dist)(), step(plain_model, plain)()
    return [
        _line(
            "torch CNN step, DistributedOptimizer",
            *_alternating(step(dist_model, dist), step(plain_model, plain)),
            1.10,
        )
    ]


def main() -> int:
    reason = _no_gpu()
    if reason:
        print(f"bench_gpu: skipped, no GPU run possible here: {reason}.")
        return 0
    import cupy as cp
    from cupy.cuda import nccl

    import hvdlite as hvd

    hvd.init()
    cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    from hvdlite.engine.transport import routes_of

    lines = [f"device path: {routes_of(hvd.global_process_set).device.describe()}"]
    if hvd.size() == 1:
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)

        def raw(buf):
            comm.allReduce(
                buf.data.ptr,
                buf.data.ptr,
                buf.size,
                nccl.NCCL_FLOAT32,
                nccl.NCCL_SUM,
                cp.cuda.get_current_stream().ptr,
            )
    else:
        from mpi4py import MPI

        def raw(buf):  # the baseline for 2 ranks on one GPU: staged MPI by hand
            host = cp.asnumpy(buf)
            MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, host, MPI.SUM)
            buf.set(host)

    lines += bench_allreduce(hvd, cp, raw)
    if hvd.size() == 1 and importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            import hvdlite.torch as hvd_torch

            lines += bench_torch_step(hvd_torch)
    if hvd.rank() == 0:
        print("\n".join(lines))
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HVDLITE_CYCLE_TIME", "1")
    sys.exit(main())
