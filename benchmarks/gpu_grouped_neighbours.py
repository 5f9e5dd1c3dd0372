"""A diagnostic, not a benchmark (``make bench`` does not run it): what torch's
``grouped_allreduce_`` of 200 x 64 KB CUDA tensors costs depending on what ran just
before it.

Run as ``python benchmarks/gpu_grouped_neighbours.py`` on a machine with a CUDA GPU,
CuPy and CUDA torch (1 rank, NCCL).  It times the grouped call back to back, then
alternated with each other case of ``bench_gpu.py``'s 1-rank section in turn (and with
a 5 ms sleep and a 5 ms spin), then in that section's six-way order.  Without a GPU it
says so and exits 0.
"""

from __future__ import annotations

import os
import sys
import time

import bench_gpu as bg


def _median_ms(fns, reps: int = 30) -> list[float]:
    return [t * 1e3 for t in bg._alternating(fns, reps)]


def main() -> int:
    reason = bg._no_gpu()
    if reason:
        print(f"gpu_grouped_neighbours: skipped, no GPU here: {reason}.")
        return 0
    import cupy as cp
    import numpy as np
    import torch

    import hvdlite as hvd
    import hvdlite.torch as ht

    hvd.init()
    raw = bg.RawNccl()
    small, count = bg.SMALL, bg.COUNT
    host = [np.ones(small, np.float32) for _ in range(count)]
    arrays = [cp.ones(small, cp.float32) for _ in range(count)]
    tensors = [torch.ones(small, device="cuda") for _ in range(count)]
    packed = torch.empty(small * count, device="cuda")

    def host_path():
        bg._burst(hvd, host, "h")

    def cupy_path():
        bg._burst(hvd, arrays, "c", cp.cuda.get_current_stream().synchronize)

    def torch_path():
        handles = [ht.allreduce_async_(t, op=ht.Sum, name=f"t.{i}") for i, t in enumerate(tensors)]
        for handle in handles:
            ht.synchronize(handle)
        torch.cuda.current_stream().synchronize()

    def grouped():
        ht.grouped_allreduce_(tensors, op=ht.Sum, name="t.grouped")
        torch.cuda.current_stream().synchronize()

    def host_grouped():
        hvd.grouped_allreduce(host, op=hvd.Sum, name="h.grouped", outputs=host)

    def raw_fair():
        torch.cat(tensors, out=packed)
        raw.allreduce(packed.data_ptr(), packed.numel(), torch.cuda.current_stream().cuda_stream)
        torch._foreach_copy_(tensors, packed.split(small))
        torch.cuda.current_stream().synchronize()

    def sleep_5ms():
        time.sleep(0.005)

    def spin_5ms():
        end = time.perf_counter() + 0.005
        while time.perf_counter() < end:
            pass

    six = [host_path, cupy_path, torch_path, grouped, host_grouped, raw_fair]
    for fn in six:
        fn()
        fn()
    print(f"back to back: grouped {_median_ms([grouped])[0]:.3f} ms")
    for other in (host_path, cupy_path, torch_path, host_grouped, raw_fair, sleep_5ms, spin_5ms):
        before, after = _median_ms([other, grouped])
        print(
            f"after {other.__name__:<13}: grouped {after:.3f} ms ({other.__name__} {before:.3f} ms)"
        )
    order = _median_ms(six)
    print(
        "six-way, as bench_gpu: " + ", ".join(f"{f.__name__} {t:.3f}" for f, t in zip(six, order))
    )
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HVDLITE_CYCLE_TIME", "1")
    sys.exit(main())
