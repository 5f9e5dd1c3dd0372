"""torch CUDA tensors on a GPU: every collective and dtype (bf16 and fp16 included)
returns CUDA tensors with the CPU path's values; DistributedOptimizer, the broadcast
helpers, SyncBatchNorm and compression work on CUDA; a small CNN on digits trains
to the same accuracy on the GPU as on the CPU; mixed devices fail on every rank."""

import numpy as np
import pytest

hvd = None  # hvdlite.torch, imported by the fixture (CPU collection stays cheap)


@pytest.fixture(scope="module")
def torch():
    global hvd
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    yield torch
    hvd.shutdown()


def _dtypes(torch):
    return [
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    ]


def test_every_collective_every_dtype(torch):
    rank, size = hvd.rank(), hvd.size()
    for dtype in _dtypes(torch):
        tag = str(dtype).split(".")[-1]
        x = (torch.arange(6, device="cuda") + rank).to(dtype)
        ref = sum((torch.arange(6) + r).to(torch.float64) for r in range(size))
        out = hvd.allreduce(x, op=hvd.Sum, name=f"t.sum.{tag}")
        assert out.is_cuda and out.dtype == dtype
        torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-2, atol=1e-2)
        if dtype.is_floating_point:
            avg = hvd.allreduce(x, name=f"t.avg.{tag}")
            torch.testing.assert_close(avg.cpu().double(), ref / size, rtol=1e-2, atol=1e-2)
            y = x.clone()
            hvd.allreduce_(y, op=hvd.Sum, name=f"t.inplace.{tag}")
            torch.testing.assert_close(y.cpu().double(), ref, rtol=1e-2, atol=1e-2)
        g = hvd.allgather(
            torch.full((rank + 1, 2), rank, device="cuda").to(dtype), name=f"t.ag.{tag}"
        )
        assert g.is_cuda and g.dtype == dtype and g.shape[0] == size * (size + 1) // 2
        b = hvd.broadcast(
            torch.full((3,), rank, device="cuda").to(dtype), size - 1, name=f"t.bc.{tag}"
        )
        assert b.is_cuda and b.cpu().double().tolist() == [size - 1] * 3
        a = hvd.alltoall(torch.full((size,), rank, device="cuda").to(dtype), name=f"t.a2a.{tag}")
        assert a.is_cuda and a.cpu().double().tolist() == list(range(size))
        if dtype.is_floating_point or dtype in (torch.int32, torch.int64):
            rs = hvd.reducescatter(
                torch.ones((size * 2, 3), device="cuda").to(dtype), op=hvd.Sum, name=f"t.rs.{tag}"
            )
            assert rs.is_cuda and rs.shape == (2, 3)
            assert rs.cpu().double().unique().tolist() == [size]


def test_grouped_and_async(torch):
    size = hvd.size()
    tensors = [torch.ones(100 + i, device="cuda") for i in range(20)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    assert all(o.is_cuda and float(o.sum()) == size * (100 + i) for i, o in enumerate(outs))
    handles = [
        hvd.allreduce_async_(t, op=hvd.Sum, name=f"t.async.{i}") for i, t in enumerate(tensors)
    ]
    for i, h in enumerate(handles):
        # the grouped call above left its inputs as they were (ones): Sum gives size each
        assert float(hvd.synchronize(h).sum()) == size * (100 + i)


def test_broadcast_helpers_and_sync_batch_norm(torch):
    rank = hvd.rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(8, 4, device="cuda")).sum().backward()
    opt.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    weights = hvd.allgather(model[0].weight.detach().reshape(1, -1))
    assert torch.equal(weights, weights[:1].expand_as(weights))
    bn = hvd.SyncBatchNorm(3).cuda()
    out = bn(torch.randn(5, 3, device="cuda") + rank)
    assert out.is_cuda and out.shape == (5, 3)


def _digits(torch):
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target)
    return x[hvd.rank() :: hvd.size()], y[hvd.rank() :: hvd.size()], x[-300:], y[-300:]


def _train(torch, device, compression):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 16, 10),
    ).to(device)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        compression=compression,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x, y, tx, ty = _digits(torch)
    x, y, tx, ty = x.to(device), y.to(device), tx.to(device), ty.to(device)
    for _ in range(8):
        for i in range(0, len(x), 32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x[i : i + 32]), y[i : i + 32]).backward()
            opt.step()
    with torch.no_grad():
        return float((model(tx).argmax(1) == ty).float().mean())


@pytest.mark.parametrize("compression", ["none", "fp16", "bf16"])
def test_cnn_on_digits_matches_cpu_accuracy(torch, compression):
    comp = getattr(hvd.Compression, compression)
    gpu = _train(torch, "cuda", comp)
    cpu = _train(torch, "cpu", comp)
    assert gpu > 0.85 and abs(gpu - cpu) < 0.03, (gpu, cpu)


def test_topk_and_powersgd_on_cuda(torch):
    for comp in (hvd.Compression.topk(0.1), hvd.Compression.powersgd(rank=2, start_step=0)):
        model = torch.nn.Linear(16, 8).cuda()
        opt = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            compression=comp,
        )
        model(torch.randn(4, 16, device="cuda")).sum().backward()
        opt.step()
        assert model.weight.is_cuda and torch.isfinite(model.weight).all()


def test_mixed_devices_fail_on_every_rank(torch):
    if hvd.size() < 2:
        pytest.skip("a device mismatch needs two ranks")
    x = torch.ones(3) if hvd.rank() == 0 else torch.ones(3, device="cuda")
    with pytest.raises(hvd.HorovodInternalError, match=r"Mismatched device.*cpu.*cuda"):
        hvd.allreduce(x, name="t.mixed")
    np.testing.assert_allclose(
        hvd.allreduce(torch.ones(2, device="cuda"), op=hvd.Sum, name="t.after").cpu(), hvd.size()
    )


# ------------------------------------------------ Horovod's CUDA scaling rule
def _horovod_cuda_scaled(torch, tensor, factor, dtype):
    """Horovod's suite's own reference on CUDA: the factor in the tensor's dtype
    (float64 for integers), multiplied on the GPU, cast back to *dtype*."""
    math = torch.float64 if not dtype.is_floating_point else dtype
    f = torch.tensor(factor, dtype=torch.float64, device="cuda").to(math)
    return (f * tensor.to(math)).to(dtype)


def _same_bits(torch, got, want):
    assert got.is_cuda and got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu().view(torch.uint8), want.cpu().view(torch.uint8)), (got, want)


@pytest.mark.parametrize("kind", ["allreduce", "reducescatter", "grouped_reducescatter"])
def test_float16_and_integer_scaling_matches_horovod_bit_for_bit(torch, kind):
    size = hvd.size()
    if size > 3:
        pytest.skip("bit-exact sums hold up to 3 ranks (as in Horovod's suite)")
    for dtype in (torch.float16, torch.int32, torch.int64, torch.float32):
        torch.manual_seed(1234)
        x = torch.empty(2 * size, 17).random_(-100, 100).to(dtype).cuda()
        for pre, post in ((0.6138, 1.0), (1.0, 0.4372), (0.6138, 0.4372)):
            if kind == "allreduce":
                got = hvd.allreduce(x, op=hvd.Sum, prescale_factor=pre, postscale_factor=post)
                rows = slice(None)
            elif kind == "reducescatter":
                got = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=pre, postscale_factor=post)
                rows = slice(2 * hvd.rank(), 2 * hvd.rank() + 2)
            else:
                got = hvd.grouped_reducescatter(
                    [x, x[:size]], op=hvd.Sum, prescale_factor=pre, postscale_factor=post
                )[0]
                rows = slice(2 * hvd.rank(), 2 * hvd.rank() + 2)
            want = _horovod_cuda_scaled(torch, x, pre, dtype)
            want = _horovod_cuda_scaled(torch, want * size, post, dtype)[rows]
            _same_bits(torch, got, want)


def test_alltoall_received_splits_on_the_splits_device(torch):
    size, rank = hvd.size(), hvd.rank()
    x = torch.full((size * (rank + 1),), float(rank), device="cuda")
    splits = torch.tensor([rank + 1] * size, dtype=torch.int32, device="cuda")
    out, received = hvd.alltoall(x, splits)
    assert out.is_cuda and received.is_cuda and received.dtype == torch.int32
    assert received.tolist() == [r + 1 for r in range(size)]
    _, on_cpu = hvd.alltoall(x, splits.cpu())
    assert on_cpu.device.type == "cpu"


def test_a_batch_costs_the_same_launches_for_2_or_200_tensors(torch):
    from hvdlite.device import registry

    copies = registry.backend("cuda").copies

    def launches(n, **kwargs):
        tensors = [torch.full((1000,), float(i), device="cuda") for i in range(n)]
        hvd.grouped_allreduce(tensors, op=hvd.Sum, **kwargs)  # warm: kernels compiled
        before = copies.launches
        hvd.grouped_allreduce(tensors, op=hvd.Sum, **kwargs)
        return copies.launches - before

    for kwargs in ({}, {"prescale_factor": 0.5, "postscale_factor": 3.0}):
        assert launches(2, **kwargs) == launches(200, **kwargs) <= 4, kwargs
