"""GPU benchmark: hvdlite's device path beside the hardware's cost, same run.

Run as ``python benchmarks/bench_gpu.py`` on a machine with a CUDA GPU, CuPy and
(for the torch lines) CUDA torch; under ``mpiexec -n 2`` the ranks share one GPU
and run over MPI (staged through pinned host memory unless the MPI is
CUDA-aware).  Without a GPU it says so and exits 0.  Every figure is a median
over repetitions run alternately with its baseline; the first line names the
link the global set actually used.

1 rank (NCCL):

- 200 x 64 KB arrays, ``allreduce_async`` + ``synchronize``, CuPy and torch:
  against the host path's cost for the same 200 numpy arrays (target <= 1.3x)
  and against a fair raw baseline, one ``torch.cat`` pack, one NCCL allreduce,
  one ``torch._foreach_copy_`` unpack (target <= 2x it plus 15 us per tensor),
  and against its floor, 2x raw plus what the host path itself costs for the
  200 (its Python, per tensor, in this run);
- torch ``grouped_allreduce_`` of the same 200 (target <= 1.0 ms), in the
  six-way alternation and again alternated with its host baseline only, and
  beside its floor: the host path's grouped call of 200 one-element arrays
  (its Python) plus the raw baseline;
- one 64 KB array, CuPy and torch (target <= 60 us), and one 64 MB array
  (target <= 1.05x raw NCCL; one rank's NCCL moves nothing, so also beside
  its floor: the call's fixed cost, measured on the 64 KB array, plus raw);
- a small CNN step with DistributedOptimizer against the step without
  communication (target <= 1.10x).

2 ranks on one GPU (MPI):

- 200 x 64 KB against the same done by hand (pack, copy to host, MPI
  allreduce, copy back, unpack; target <= 1.2x) and 64 MB likewise;
- ResNet-18 and a 4-layer transformer step with DistributedOptimizer against
  DDP (gloo, CUDA tensors) and against no communication;
- AdamW on a 50 M-parameter MLP with ``shard_optimizer_state=True`` against the
  unsharded optimizer: step time, state bytes, the weights' largest difference.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time

SMALL, COUNT = 16384, 200  # 64 KB float32 arrays


def _no_gpu() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install hvdlite[cuda12] or hvdlite[cuda13])"
    from hvdlite.device.capabilities import cuda_available

    return None if cuda_available() else "CuPy sees no CUDA device"


def _alternating(fns, reps: int = 30) -> list[float]:
    """Medians of each of *fns*, run alternately (load hits them alike)."""
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _line(label: str, ours: float, base: float, target: float | None, base_label="") -> str:
    ratio = ours / base
    verdict = "" if target is None else ("  ok" if ratio <= target else f"  OVER {target:.2f}x")
    return (
        f"{label:<52} {ours * 1e3:8.3f} ms vs {base * 1e3:8.3f} ms{base_label}"
        f" = {ratio:5.2f}x{verdict}"
    )


def _burst(hvd, arrays, tag: str, finish=None) -> None:
    """allreduce_async of every array in place, then synchronize each (and *finish*)."""
    handles = [
        hvd.allreduce_async(a, op=hvd.Sum, name=f"{tag}.{i}", output=a)
        for i, a in enumerate(arrays)
    ]
    for h in handles:
        hvd.synchronize(h)
    if finish is not None:
        finish()


def _absolute(label: str, ours: float, target_s: float) -> str:
    verdict = "  ok" if ours <= target_s else f"  OVER {target_s * 1e3:.3f} ms"
    return f"{label:<52} {ours * 1e3:8.3f} ms (target <= {target_s * 1e3:.3f} ms){verdict}"


class RawNccl:
    """A communicator of hvdlite's ranks for the hand-made baselines (1 rank)."""

    def __init__(self):
        import cupy as cp
        from cupy.cuda import nccl

        self.cp, self.nccl = cp, nccl
        self.comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)

    def allreduce(self, ptr: int, count: int, stream_ptr: int) -> None:
        nccl = self.nccl
        self.comm.allReduce(ptr, ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream_ptr)


def bench_one_rank(hvd, hvd_torch, torch, raw: RawNccl) -> list[str]:
    import cupy as cp
    import numpy as np

    lines = []
    host = [np.ones(SMALL, np.float32) for _ in range(COUNT)]
    arrays = [cp.ones(SMALL, cp.float32) for _ in range(COUNT)]
    tensors = [torch.ones(SMALL, device="cuda") for _ in range(COUNT)]
    packed = torch.empty(SMALL * COUNT, device="cuda")

    def host_path():
        _burst(hvd, host, "h")

    def cupy_path():
        _burst(hvd, arrays, "c", cp.cuda.get_current_stream().synchronize)

    def torch_path():
        handles = [
            hvd_torch.allreduce_async_(t, op=hvd_torch.Sum, name=f"t.{i}")
            for i, t in enumerate(tensors)
        ]
        for h in handles:
            hvd_torch.synchronize(h)
        torch.cuda.current_stream().synchronize()

    def torch_grouped():
        hvd_torch.grouped_allreduce_(tensors, op=hvd_torch.Sum, name="t.grouped")
        torch.cuda.current_stream().synchronize()

    def host_grouped():  # the floor the grouped figure sits on: the host path's own
        hvd.grouped_allreduce(host, op=hvd.Sum, name="h.grouped", outputs=host)

    def raw_fair():  # one pack, one NCCL allreduce, one unpack: the hardware's cost
        torch.cat(tensors, out=packed)
        raw.allreduce(packed.data_ptr(), packed.numel(), torch.cuda.current_stream().cuda_stream)
        torch._foreach_copy_(tensors, packed.split(SMALL))
        torch.cuda.current_stream().synchronize()

    fns = [host_path, cupy_path, torch_path, torch_grouped, host_grouped, raw_fair]
    for fn in fns:
        fn()  # warm up: NCCL, kernels, pools, the response cache
    t_host, t_cupy, t_torch, t_grouped, t_host_grouped, t_raw = _alternating(fns)
    n = f"{COUNT} x 64 KB"
    lines += [
        _line(f"1 rank: {n} CuPy async+sync", t_cupy, t_host, 1.3, " host path"),
        _line(f"1 rank: {n} torch allreduce_async_", t_torch, t_host, 1.3, " host path"),
        _line(
            f"1 rank: {n} CuPy async+sync",
            t_cupy,
            t_raw,
            (2 * t_raw + COUNT * 15e-6) / t_raw,
            " raw",
        ),
        _line(
            f"1 rank: {n} torch allreduce_async_",
            t_torch,
            t_raw,
            (2 * t_raw + COUNT * 15e-6) / t_raw,
            " raw",
        ),
        _line(f"1 rank: {n} torch allreduce_async_", t_torch, 2 * t_raw + t_host, None, " floor"),
        f"{'   (floor: 2x raw + the host path for the 200)':<52} "
        f"{(2 * t_raw + t_host) * 1e3:8.3f} ms",
        _absolute(f"1 rank: {n} torch grouped_allreduce_", t_grouped, 1.0e-3),
        _line(f"1 rank: {n} torch grouped_allreduce_", t_grouped, t_host_grouped, None, " host"),
        f"{'   (raw baseline: cat + NCCL + foreach_copy)':<52} {t_raw * 1e3:8.3f} ms",
        f"{'   (host path floor: 200 numpy arrays, per tensor)':<52} "
        f"{t_host / COUNT * 1e6:8.1f} us",
    ]

    # The grouped call again, alternated with its host baseline only (the six-way
    # alternation above puts it right after 200 asynchronous submissions), and its
    # floor: the same grouped call's Python (200 one-element numpy arrays:
    # submission, negotiation, bookkeeping, next to no bytes) plus the raw baseline.
    tiny = [np.ones(1, np.float32) for _ in range(COUNT)]

    def host_grouped_tiny():
        hvd.grouped_allreduce(tiny, op=hvd.Sum, name="h.grouped.tiny", outputs=tiny)

    host_grouped_tiny()
    t_grouped2, t_host_grouped2, t_tiny = _alternating(
        [torch_grouped, host_grouped, host_grouped_tiny]
    )
    paired = f"1 rank: {n} torch grouped_allreduce_, paired"
    lines += [
        _absolute(paired, t_grouped2, 1.0e-3),
        _line(paired, t_grouped2, t_host_grouped2, None, " host"),
        _line(paired, t_grouped2, t_tiny + t_raw, None, " floor"),
        f"{'   (floor: host grouped of 200 x 4 B + raw)':<52} {(t_tiny + t_raw) * 1e3:8.3f} ms",
    ]

    one_cp, one_t = cp.ones(SMALL, cp.float32), torch.ones(SMALL, device="cuda")

    def cupy_one():
        hvd.synchronize(hvd.allreduce_async(one_cp, op=hvd.Sum, name="c.one", output=one_cp))
        cp.cuda.get_current_stream().synchronize()

    def torch_one():
        hvd_torch.synchronize(hvd_torch.allreduce_async_(one_t, op=hvd_torch.Sum, name="t.one"))
        torch.cuda.current_stream().synchronize()

    def raw_one():
        raw.allreduce(one_t.data_ptr(), SMALL, torch.cuda.current_stream().cuda_stream)
        torch.cuda.current_stream().synchronize()

    one_host = np.ones(SMALL, np.float32)

    def host_one():
        hvd.synchronize(hvd.allreduce_async(one_host, op=hvd.Sum, name="h.one", output=one_host))

    def cupy_one_sync():  # the blocking form: the caller runs the engine's cycle itself
        hvd.allreduce(one_cp, op=hvd.Sum, name="c.one.sync", output=one_cp)
        cp.cuda.get_current_stream().synchronize()

    fns = [cupy_one, torch_one, cupy_one_sync, host_one, raw_one]
    for fn in fns:
        fn()
    t_c1, t_t1, t_c1s, t_h1, t_r1 = _alternating(fns, reps=200)
    lines += [
        _absolute("1 rank: one 64 KB CuPy array", t_c1, 60e-6),
        _absolute("1 rank: one 64 KB torch tensor", t_t1, 60e-6),
        _absolute("1 rank: one 64 KB CuPy array, hvd.allreduce", t_c1s, 60e-6),
        f"{'   (raw NCCL of it)':<52} {t_r1 * 1e3:8.3f} ms",
        f"{'   (host path floor: one 64 KB numpy array)':<52} {t_h1 * 1e3:8.3f} ms",
    ]

    big = cp.ones(16 << 20, dtype=cp.float32)  # 64 MB

    def ours_big():
        hvd.synchronize(hvd.allreduce_async(big, op=hvd.Sum, name="b.big", output=big))
        cp.cuda.get_current_stream().synchronize()

    def base_big():
        raw.allreduce(big.data.ptr, big.size, cp.cuda.get_current_stream().ptr)
        cp.cuda.get_current_stream().synchronize()

    ours_big(), base_big()
    t_big, t_big_raw = _alternating([ours_big, base_big], 10)
    lines += [
        _line("1 rank: 64 MB", t_big, t_big_raw, 1.05, " raw"),
        # one rank's NCCL moves nothing: the call's fixed cost (one 64 KB array's,
        # less its raw NCCL) plus the raw call is the floor
        _line("1 rank: 64 MB", t_big, t_c1 - t_r1 + t_big_raw, None, " floor"),
    ]
    return lines


def bench_two_ranks(hvd, cp) -> list[str]:
    """Ranks sharing a GPU: hvdlite against the same MPI staging done by hand."""
    import numpy as np
    from mpi4py import MPI

    arrays = [cp.ones(SMALL, cp.float32) for _ in range(COUNT)]
    packed = cp.empty(SMALL * COUNT, cp.float32)
    host = cp.cuda.alloc_pinned_memory(packed.nbytes)
    staged = np.frombuffer(host, np.float32, packed.size)
    stream = cp.cuda.get_current_stream()

    def ours():
        _burst(hvd, arrays, "s", stream.synchronize)

    def by_hand(buf=None):
        if buf is None:
            cp.concatenate(arrays, out=packed)
            buf = packed
        view = staged[: buf.size]
        buf.get(out=view, stream=stream)
        stream.synchronize()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, view, MPI.SUM)
        buf.set(view, stream=stream)
        if buf is packed:
            offset = 0
            for a in arrays:
                a[...] = packed[offset : offset + SMALL]
                offset += SMALL
        stream.synchronize()

    big = cp.ones(16 << 20, dtype=cp.float32)
    big_host = np.frombuffer(cp.cuda.alloc_pinned_memory(big.nbytes), np.float32, big.size)

    def ours_big():
        hvd.synchronize(hvd.allreduce_async(big, op=hvd.Sum, name="s.big", output=big))
        stream.synchronize()

    def by_hand_big():
        big.get(out=big_host, stream=stream)
        stream.synchronize()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, big_host, MPI.SUM)
        big.set(big_host, stream=stream)
        stream.synchronize()

    host_arrays = [np.ones(SMALL, np.float32) for _ in range(COUNT)]

    def host_path():  # the floor: the host path's own cost for 200 numpy arrays
        _burst(hvd, host_arrays, "s.h")

    size = hvd.size()
    for fn in (ours, by_hand, host_path, ours_big, by_hand_big):
        fn()
    t_ours, t_hand, t_host = _alternating([ours, by_hand, host_path])
    return [
        _line(f"{size} ranks: {COUNT} x 64 KB async+sync", t_ours, t_hand, 1.2, " by hand"),
        _line(f"{size} ranks: {COUNT} x 64 KB async+sync", t_ours, t_host, None, " host path"),
        _line(f"{size} ranks: 64 MB", *_alternating([ours_big, by_hand_big], 10), None, " by hand"),
    ]


def _models(torch):
    import torchvision

    def resnet():
        return torchvision.models.resnet18(num_classes=10), (
            torch.randn(32, 3, 64, 64, device="cuda"),
            torch.randint(0, 10, (32,), device="cuda"),
        )

    def transformer():
        layer = torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True)
        model = torch.nn.Sequential(
            torch.nn.TransformerEncoder(layer, 4), torch.nn.Flatten(), torch.nn.Linear(256 * 64, 10)
        )
        return model, (
            torch.randn(16, 64, 256, device="cuda"),
            torch.randint(0, 10, (16,), device="cuda"),
        )

    return {"ResNet-18": resnet, "transformer (4 layers)": transformer}


def bench_training(hvd_torch, torch, against_ddp: bool) -> list[str]:
    """Steps with DistributedOptimizer against DDP (gloo) and no communication."""
    lines = []
    ddp_group = None
    if against_ddp:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=hvd_torch.rank(), world_size=hvd_torch.size())
        ddp_group = dist
    for label, make in _models(torch).items():
        torch.manual_seed(0)
        runs = {}
        model, (x, y) = make()
        model = model.cuda()
        opt = hvd_torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
        )
        runs["hvdlite"] = (model, opt)
        plain, _ = make()
        runs["none"] = (plain.cuda(), torch.optim.SGD(plain.parameters(), lr=0.01))
        if ddp_group is not None:
            base, _ = make()
            ddp = torch.nn.parallel.DistributedDataParallel(base.cuda())
            runs["DDP"] = (ddp, torch.optim.SGD(ddp.parameters(), lr=0.01))

        def step(model, opt, x=x, y=y):
            def run():
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                torch.cuda.synchronize()

            return run

        fns = [step(*runs[k]) for k in runs]
        for _ in range(3):
            for fn in fns:
                fn()
        times = dict(zip(runs, _alternating(fns, reps=10)))
        n = hvd_torch.size()
        if "DDP" in times:
            lines.append(
                _line(
                    f"{n} ranks: {label} step vs DDP (gloo)", times["hvdlite"], times["DDP"], None
                )
            )
        lines.append(
            _line(
                f"{n} ranks: {label} step vs no communication",
                times["hvdlite"],
                times["none"],
                None,
            )
        )
    return lines


def bench_sharded(hvd_torch, torch) -> list[str]:
    """AdamW on a 50 M-parameter MLP on the GPU, ``shard_optimizer_state=True`` against
    the unsharded ``DistributedOptimizer``, steps alternated: step time, optimizer
    state bytes on rank 0, and the largest weight difference after the same steps."""
    import torch.nn.functional as F

    width, layers, batch, reps = 2048, 12, 16, 15

    def model():
        torch.manual_seed(0)
        stack = []
        for _ in range(layers):
            stack += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*stack[:-1]).cuda()

    def state_bytes(opt):
        inner = getattr(opt, "local", opt)  # a sharded optimizer's state is its local one's
        return sum(
            v.numel() * v.element_size()
            for state in inner.state.values()
            for v in state.values()
            if torch.is_tensor(v) and v.dim()
        )

    torch.manual_seed(1)
    x = torch.randn(batch, width, device="cuda")
    y = torch.randn(batch, width, device="cuda")
    runs = []
    for sharded in (False, True):
        net = model()
        opt = hvd_torch.DistributedOptimizer(
            torch.optim.AdamW(net.parameters(), lr=1e-4),
            named_parameters=net.named_parameters(),
            shard_optimizer_state=sharded,
        )

        def step(net=net, opt=opt):
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            opt.step()
            torch.cuda.synchronize()

        step()
        runs.append((step, opt, net))
    t_plain, t_sharded = _alternating([runs[0][0], runs[1][0]], reps)
    differs = max(
        (a - b).abs().max().item()
        for a, b in zip(runs[0][2].parameters(), runs[1][2].parameters(), strict=True)
    )
    size, b_plain, b_sharded = hvd_torch.size(), state_bytes(runs[0][1]), state_bytes(runs[1][1])
    return [
        _line(f"{size} ranks: sharded AdamW step, 50 M", t_sharded, t_plain, None, " unsharded"),
        f"{f'{size} ranks: sharded AdamW state, rank 0':<52} {b_sharded / 2**20:8.1f} MB vs "
        f"{b_plain / 2**20:8.1f} MB unsharded = {b_sharded / b_plain:5.3f}x",
        f"{'   (largest weight difference, same steps)':<52} {differs:.2e}",
    ]


def bench_cnn_step(hvd_torch, torch) -> list[str]:
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
    ours, base = _alternating([step(dist_model, dist), step(plain_model, plain)])
    return [_line("1 rank: torch CNN step, DistributedOptimizer", ours, base, 1.10, " no comm")]


def _links_used() -> str:
    from hvdlite.engine.runtime import state

    device = state().engine.executor.device
    if device is None or not device.used:
        return "no device batch ran"
    return ", ".join(f"{name} ({n} batches)" for name, n in device.used.most_common())


def main() -> int:
    reason = _no_gpu()
    if reason:
        print(f"bench_gpu: skipped, no GPU run possible here: {reason}.")
        return 0
    import cupy as cp

    import hvdlite as hvd

    hvd.init()
    cp.cuda.Device(hvd.local_rank() % cp.cuda.runtime.getDeviceCount()).use()
    torch = hvd_torch = None
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
            import hvdlite.torch as hvd_torch
        else:
            torch = None
    lines = []
    if hvd.size() == 1:
        if torch is None:
            print("bench_gpu: the 1-rank figures need CUDA torch (its baselines use it).")
        else:
            lines += bench_one_rank(hvd, hvd_torch, torch, RawNccl())
            lines += bench_cnn_step(hvd_torch, torch)
    else:
        lines += bench_two_ranks(hvd, cp)
        if torch is not None:
            lines += bench_sharded(hvd_torch, torch)
        if torch is not None and importlib.util.find_spec("torchvision") is not None:
            lines += bench_training(hvd_torch, torch, against_ddp=True)
    lines.insert(
        0,
        f"links used: {_links_used()}  [{cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}]",
    )
    if hvd.rank() == 0:
        print("\n".join(lines), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HVDLITE_CYCLE_TIME", "1")
    sys.exit(main())
