"""hvdlite.torch collectives against references computed locally.

Every rank builds every rank's input from a seeded generator, so the expected
result of each collective is computed locally and compared exactly (or to
float tolerance for reductions).
"""

import numpy as np
import pytest
import torch

import hvdlite.torch as hvd

MPI_SIZES = (2, 3)

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def data(rank, shape=(3, 4), dtype=torch.float32, seed=0):
    """The tensor rank *rank* contributes (reproducible on every rank)."""
    g = torch.Generator().manual_seed(1000 * seed + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    low = 0 if dtype == torch.uint8 else -5
    return torch.randint(low, 6, shape, generator=g, dtype=torch.int64).to(dtype)


def everyone(**kw):
    return [data(r, **kw) for r in range(N)]


def close(a, b, dtype):
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    assert a.dtype == dtype and a.shape == b.shape
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


# ------------------------------------------------------------------ allreduce


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_allreduce_sum_every_dtype(dtype):
    out = hvd.allreduce(data(R, dtype=dtype), op=hvd.Sum)
    expected = torch.stack([t.double() for t in everyone(dtype=dtype)]).sum(0)
    close(out, expected.to(dtype), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_allreduce_average_and_scales(dtype):
    mine = data(R, dtype=dtype, seed=1)
    mean = torch.stack([t.double() for t in everyone(dtype=dtype, seed=1)]).mean(0)
    close(hvd.allreduce(mine), mean.to(dtype), dtype)
    close(hvd.allreduce(mine, average=True), mean.to(dtype), dtype)
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    close(scaled, (mean * N * 1.5).to(dtype), dtype)


@pytest.mark.parametrize(
    "op,fn", [("Min", torch.amin), ("Max", torch.amax), ("Product", torch.prod)]
)
def test_allreduce_min_max_product(op, fn):
    out = hvd.allreduce(data(R, seed=2), op=getattr(hvd, op))
    close(out, fn(torch.stack(everyone(seed=2)), 0), torch.float32)


def test_allreduce_bool_min_max():
    mine = data(R, dtype=torch.bool, seed=3)
    stacked = torch.stack(everyone(dtype=torch.bool, seed=3))
    assert torch.equal(hvd.allreduce(mine, op=hvd.Min), stacked.all(0))
    assert torch.equal(hvd.allreduce(mine, op=hvd.Max), stacked.any(0))
    with pytest.raises(ValueError):
        hvd.allreduce(mine, op=hvd.Sum)


def test_allreduce_in_place_and_async_spellings():
    mine = data(R, seed=4)
    total = torch.stack(everyone(seed=4)).sum(0)
    t = mine.clone()
    assert hvd.allreduce_(t, op=hvd.Sum) is t
    close(t, total, torch.float32)
    t = mine.clone()
    h = hvd.allreduce_async_(t, op=hvd.Sum, name="inplace_async")
    assert hvd.synchronize(h) is t and hvd.poll(h)
    close(t, total, torch.float32)
    h = hvd.allreduce_async(mine, op=hvd.Sum, name="async")
    out = hvd.synchronize(h)
    assert out is not mine
    close(out, total, torch.float32)
    close(mine, data(R, seed=4), torch.float32)  # the input is untouched


def test_allreduce_bfloat16_in_place():
    t = data(R, dtype=torch.bfloat16, seed=5)
    hvd.allreduce_(t, op=hvd.Sum)
    expected = torch.stack([x.float() for x in everyone(dtype=torch.bfloat16, seed=5)]).sum(0)
    assert t.dtype == torch.bfloat16
    assert torch.equal(t, expected.bfloat16())


def test_allreduce_non_contiguous_and_scalar():
    mine = data(R, shape=(4, 6), seed=6).t()
    assert not mine.is_contiguous()
    out = hvd.allreduce(mine, op=hvd.Sum)
    close(out, torch.stack(everyone(shape=(4, 6), seed=6)).sum(0).t(), torch.float32)
    with pytest.raises(ValueError, match="contiguous"):
        hvd.allreduce_(mine)
    scalar = hvd.allreduce(torch.tensor(float(R)), op=hvd.Sum)
    assert scalar.shape == () and scalar.item() == sum(range(N))


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_allreduce_compression(compression):
    mine = data(R, seed=7)
    out = hvd.allreduce(mine, compression=getattr(hvd.Compression, compression))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.stack(everyone(seed=7)).mean(0), rtol=2e-2, atol=2e-2)


def test_grouped_allreduce_spellings():
    mine = [
        data(R, shape=(5,), seed=8),
        data(R, shape=(2, 3), dtype=torch.float64, seed=9),
        data(R, shape=(4,), dtype=torch.bfloat16, seed=10),
    ]
    expected = [
        torch.stack([t.double() for t in everyone(shape=m.shape, dtype=m.dtype, seed=s)])
        .sum(0)
        .to(m.dtype)
        for m, s in zip(mine, (8, 9, 10), strict=True)
    ]
    for out, exp in zip(hvd.grouped_allreduce(mine, op=hvd.Sum), expected, strict=True):
        close(out, exp, exp.dtype)
    outs = hvd.synchronize(hvd.grouped_allreduce_async(mine, op=hvd.Sum))
    for out, exp in zip(outs, expected, strict=True):
        close(out, exp, exp.dtype)
    copies = [m.clone() for m in mine]
    assert hvd.grouped_allreduce_(copies, op=hvd.Sum) == copies
    for out, exp in zip(copies, expected, strict=True):
        close(out, exp, exp.dtype)
    copies = [m.clone() for m in mine]
    hvd.synchronize(hvd.grouped_allreduce_async_(copies, op=hvd.Sum, name="grp"))
    for out, exp in zip(copies, expected, strict=True):
        close(out, exp, exp.dtype)


def test_grouped_allreduce_in_place_of_plain_tensors():
    """Contiguous CPU tensors of numpy dtypes go to the engine as their own
    views (a gradient bucket's case); the results, the scales and the returned
    list are those of the general path, and a tensor that requires grad is
    reduced through a detached view."""
    dtypes = [torch.float32, torch.int64, torch.float64, torch.int32]
    shapes = [(2, 3), (4,), (1,), (2, 2)]
    mine = [
        data(R, shape=s, dtype=d, seed=30 + i)
        for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))
    ]
    copies = [m.clone() for m in mine]
    copies[0].requires_grad_()
    returned = hvd.synchronize(
        hvd.grouped_allreduce_async_(
            copies, op=hvd.Sum, name="grp.plain", prescale_factor=2.0, postscale_factor=0.5
        )
    )
    assert len(returned) == len(copies) and all(a is b for a, b in zip(returned, copies))
    for i, (out, d) in enumerate(zip(copies, dtypes, strict=True)):
        exp = torch.stack(
            [t.double() for t in everyone(shape=shapes[i], dtype=d, seed=30 + i)]
        ).sum(0)
        close(out.detach(), exp.to(d), d)
    averaged = [m.clone() for m in mine[:1]] + [torch.full((3,), float(R), dtype=torch.float64)]
    hvd.grouped_allreduce_(averaged, name="grp.plain.avg")
    close(averaged[1], torch.full((3,), (N - 1) / 2, dtype=torch.float64), torch.float64)


def test_grouped_allreduce_in_place_misuse_is_named():
    """A tensor the lean path cannot take goes to the checks that name the problem."""
    with pytest.raises(ValueError, match="contiguous"):
        hvd.grouped_allreduce_([torch.ones(2), torch.ones(4, 4).t()], name="grp.bad.t")
    with pytest.raises(ValueError, match="sparse"):
        hvd.grouped_allreduce_([torch.ones(2), torch.ones(2).to_sparse()], name="grp.bad.s")
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.grouped_allreduce_([torch.ones(2), [1.0, 2.0]], name="grp.bad.list")


def test_allreduce_is_differentiable():
    x = data(R, seed=11).requires_grad_()
    y = hvd.allreduce(x * (R + 1), op=hvd.Sum)
    (y * data(R, seed=12)).sum().backward()
    # d/dx_r sum_k <g_k, sum_j (j+1) x_j> = (r+1) * sum_k g_k
    expected = (R + 1) * torch.stack(everyone(seed=12)).sum(0)
    close(x.grad, expected, torch.float32)
    a, b = data(R, seed=13).requires_grad_(), data(R, shape=(2,), seed=14).requires_grad_()
    outs = hvd.grouped_allreduce([a, b])
    (outs[0].sum() + 2 * outs[1].sum()).backward()
    close(a.grad, torch.ones_like(a), torch.float32)
    close(b.grad, 2 * torch.ones_like(b), torch.float32)


# ------------------------------------------------------------------ allgather


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8, torch.bool]
)
def test_allgather_uneven_first_dims(dtype):
    mine = data(R, shape=(R + 1, 3), dtype=dtype, seed=15)
    out = hvd.allgather(mine)
    expected = torch.cat([data(r, shape=(r + 1, 3), dtype=dtype, seed=15) for r in range(N)])
    assert out.dtype == dtype and torch.equal(out, expected)  # bit-exact
    out = hvd.synchronize(hvd.allgather_async(mine, name=f"ag.{dtype}"))
    assert torch.equal(out, expected)


def test_grouped_allgather():
    mine = [data(R, shape=(R + 2,), seed=16), data(R, shape=(1, 2), dtype=torch.bfloat16)]
    outs = hvd.grouped_allgather(mine)
    assert torch.equal(outs[0], torch.cat([data(r, shape=(r + 2,), seed=16) for r in range(N)]))
    assert torch.equal(outs[1], torch.cat(everyone(shape=(1, 2), dtype=torch.bfloat16)))
    outs = hvd.synchronize(hvd.grouped_allgather_async(mine))
    assert torch.equal(outs[0], torch.cat([data(r, shape=(r + 2,), seed=16) for r in range(N)]))


def test_allgather_is_differentiable():
    x = data(R, shape=(R + 1, 2), seed=17).requires_grad_()
    gathered = hvd.allgather(x)
    weights = data(R, shape=gathered.shape, seed=18)
    (gathered * weights).sum().backward()
    # Horovod's convention: the averaged output gradient, this rank's rows.
    mean_w = torch.stack([data(r, shape=gathered.shape, seed=18) for r in range(N)]).mean(0)
    start = sum(r + 1 for r in range(R))
    close(x.grad, mean_w[start : start + R + 1], torch.float32)
    a = data(R, shape=(2,), seed=19).requires_grad_()
    b = data(R, shape=(R + 1, 2), seed=20).requires_grad_()
    ga, gb = hvd.grouped_allgather([a, b])
    (ga.sum() + 3 * gb.sum()).backward()
    close(a.grad, torch.ones(2), torch.float32)
    close(b.grad, 3 * torch.ones(R + 1, 2), torch.float32)


# ------------------------------------------------------------------ broadcast


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int8])
def test_broadcast_every_root(dtype):
    for root in range(N):
        mine = data(R, dtype=dtype, seed=21)
        expected = data(root, dtype=dtype, seed=21)
        out = hvd.broadcast(mine, root)
        assert out.dtype == dtype and torch.equal(out, expected)
        assert torch.equal(mine, data(R, dtype=dtype, seed=21))
        assert hvd.broadcast_(mine, root, name=f"b.{root}") is mine
        assert torch.equal(mine, expected)
        t = data(R, dtype=dtype, seed=21)
        hvd.synchronize(hvd.broadcast_async_(t, root))
        assert torch.equal(t, expected)
        assert torch.equal(hvd.synchronize(hvd.broadcast_async(t, root)), expected)


def test_broadcast_is_differentiable():
    x = data(R, seed=22).requires_grad_()
    (hvd.broadcast(x, 1) * (R + 1)).sum().backward()
    expected = (
        torch.full_like(x, sum(r + 1 for r in range(N)) / N) if R == 1 else torch.zeros_like(x)
    )
    close(x.grad, expected, torch.float32)


# -------------------------------------------------------- alltoall, reducescatter


def test_alltoall_equal_and_split():
    mine = torch.arange(N * 2, dtype=torch.float32).view(N * 2, 1) + 100 * R
    out = hvd.alltoall(mine)
    expected = torch.cat(
        [torch.arange(2 * R, 2 * R + 2, dtype=torch.float32) + 100 * r for r in range(N)]
    ).view(-1, 1)
    assert torch.equal(out, expected)

    # rank r sends (r + j + 1) rows to rank j
    def splits(r):
        return [r + j + 1 for j in range(N)]

    def rows(r):
        return data(r, shape=(sum(splits(r)), 2), dtype=torch.bfloat16, seed=23)

    out, received = hvd.alltoall(rows(R), splits=splits(R))
    expected_parts = []
    for r in range(N):
        offset = sum(splits(r)[:R])
        expected_parts.append(rows(r)[offset : offset + splits(r)[R]])
    assert torch.equal(out, torch.cat(expected_parts))
    assert received.dtype == torch.int32 and received.tolist() == [r + R + 1 for r in range(N)]
    out, received = hvd.synchronize(hvd.alltoall_async(rows(R), torch.tensor(splits(R))))
    assert torch.equal(out, torch.cat(expected_parts))


def test_alltoall_refuses_splits_that_are_not_integers():
    # Horovod refuses a float splits tensor whatever it holds (torch.empty: anything);
    # rounding it would send rows where the caller never meant to.
    for splits in (
        torch.ones(N, dtype=torch.float32),
        torch.ones(N, dtype=torch.bool),
        [1.0] * N,
        np.ones(N),
    ):
        with pytest.raises(ValueError, match="splits must hold integers"):
            hvd.alltoall(torch.ones(N), splits)
    out, received = hvd.alltoall(torch.ones(N), np.ones(N, dtype=np.int64))
    assert received.tolist() == [1] * N


def test_alltoall_is_differentiable():
    x = data(R, shape=(N, 2), seed=24).requires_grad_()
    out = hvd.alltoall(x)
    (out * (R + 1)).sum().backward()
    close(
        x.grad, torch.arange(1, N + 1, dtype=torch.float32).view(N, 1).expand(N, 2), torch.float32
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reducescatter_uneven(dtype):
    rows = 2 * N + 1
    mine = data(R, shape=(rows, 3), dtype=dtype, seed=25)
    total = torch.stack([t.double() for t in everyone(shape=(rows, 3), dtype=dtype, seed=25)]).sum(
        0
    )
    sizes = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    start = sum(sizes[:R])
    shard = total[start : start + sizes[R]]
    close(hvd.reducescatter(mine, op=hvd.Sum), shard.to(dtype), dtype)
    close(hvd.reducescatter(mine), (shard / N).to(dtype), dtype)
    close(hvd.synchronize(hvd.reducescatter_async(mine, op=hvd.Sum)), shard.to(dtype), dtype)
    outs = hvd.grouped_reducescatter([mine, mine], op=hvd.Sum)
    for out in outs:
        close(out, shard.to(dtype), dtype)
    outs = hvd.synchronize(hvd.grouped_reducescatter_async([mine], op=hvd.Sum))
    close(outs[0], shard.to(dtype), dtype)


def test_reducescatter_gradient_is_horovods():
    # Horovod: the gathered output gradient, times the scale factors, times the set's
    # size for Sum; an Average's gradient is not divided by the size.
    x = data(R, shape=(N, 2), seed=26).requires_grad_()
    (hvd.reducescatter(x) * (R + 1)).sum().backward()
    expected = torch.arange(1, N + 1, dtype=torch.float32).view(N, 1).expand(N, 2)
    close(x.grad, expected, torch.float32)
    y = data(R, shape=(N, 2), seed=27).requires_grad_()
    (hvd.grouped_reducescatter([y], op=hvd.Sum)[0] * 2).sum().backward()
    close(y.grad, torch.full((N, 2), 2.0 * N), torch.float32)
    z = data(R, shape=(N, 2), seed=28).requires_grad_()
    hvd.reducescatter(z, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0).sum().backward()
    close(z.grad, torch.full((N, 2), 1.5 * N), torch.float32)


# ------------------------------------------------------------ sparse, control


def test_sparse_allreduce():
    dense = torch.zeros(6, 2)
    dense[R] = R + 1.0
    dense[5] = 1.0
    h = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse", op=hvd.Average)
    out = hvd.synchronize(h)
    assert out.is_sparse
    expected = torch.zeros(6, 2)
    for r in range(N):
        expected[r] += (r + 1.0) / N
    expected[5] = 1.0
    close(out.to_dense(), expected, torch.float32)
    called = hvd.sparse_allreduce_async(dense.to_sparse(), name="sparse.called", op=hvd.Average)
    close(called().to_dense(), expected, torch.float32)  # Horovod: the handle is called
    assert hvd.poll(called)  # and still a Future-like handle
    out = hvd.synchronize(hvd.sparse_allreduce_async(dense.to_sparse(), "sparse", hvd.Sum))
    close(out.to_dense(), expected * N, torch.float32)


def test_join_contributes_zeros():
    if R == 0:
        last = hvd.join()  # rank 0 has no more data
    else:
        out = hvd.allreduce(torch.full((2,), float(R)), name="after_join")
        # rank 0 contributes zeros; Average still divides by the full size
        close(out, torch.full((2,), sum(range(1, N)) / N), torch.float32)
        last = hvd.join()
    assert hvd.allgather_object(last) == [last] * N


def test_objects_barrier_join():
    assert hvd.broadcast_object({"rank": R, "t": torch.ones(2) * R}, root_rank=1)["rank"] == 1
    assert [o["r"] for o in hvd.allgather_object({"r": R})] == list(range(N))
    hvd.barrier()
    last = hvd.join()
    assert hvd.allgather_object(last) == [last] * N


# ---------------------------------------------------------------- misuse


def test_misuse_errors():
    with pytest.raises(ValueError, match="device"):
        hvd.allreduce(torch.ones(2, device="meta"))
    with pytest.raises(ValueError, match="dtype"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="sparse"):
        hvd.allreduce(torch.ones(2).to_sparse())
    with pytest.raises(ValueError, match="contiguous"):
        hvd.broadcast_(torch.ones(4, 4).t(), 0)
    with pytest.raises(TypeError):
        hvd.allgather([1, 2])
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError):
        hvd.synchronize(42)
    with pytest.raises(ValueError):
        hvd.broadcast(torch.ones(2), root_rank=N)
    with pytest.raises(ValueError):
        hvd.sparse_allreduce_async(torch.ones(2), "dense", hvd.Sum)


def test_duplicate_in_flight_name_raises():
    first = hvd.allreduce_async(torch.ones(2), name="dup")
    with pytest.raises(ValueError, match="in flight"):
        hvd.allreduce_async(torch.ones(2), name="dup")
    hvd.synchronize(first)


def test_mismatched_shapes_fail_on_every_rank():
    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        hvd.allreduce(torch.ones(R + 1), name="mismatch")
    # the job is still usable afterwards
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [N, N]


def test_uint16_in_every_collective():
    # Horovod's dtypes include uint16; torch has it since 2.3 (few ops, enough here).
    mine = torch.full((N, 2), R + 1, dtype=torch.int32).to(torch.uint16)
    total = sum(r + 1 for r in range(N))
    out = hvd.allreduce(mine, op=hvd.Sum, name="u16.ar")
    assert out.dtype == torch.uint16 and torch.equal(
        out.to(torch.int32), torch.full((N, 2), total, dtype=torch.int32)
    )
    gathered = hvd.allgather(mine[:1], name="u16.ag")
    assert gathered.dtype == torch.uint16
    assert gathered.to(torch.int32)[:, 0].tolist() == [r + 1 for r in range(N)]
    assert hvd.broadcast(mine, 0, name="u16.bc").to(torch.int32).unique().tolist() == [1]
    shard = hvd.reducescatter(mine, op=hvd.Sum, name="u16.rs")
    assert shard.dtype == torch.uint16 and shard.to(torch.int32).unique().tolist() == [total]
    swapped = hvd.alltoall(mine, name="u16.a2a")
    assert swapped.to(torch.int32)[:, 0].tolist() == [r + 1 for r in range(N)]
