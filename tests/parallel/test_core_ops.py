"""Every collective of the numpy API, every dtype, under the default knobs.

Runs under mpiexec at 1, 2 and 3 ranks (tests/test_parallel.py); every rank
runs the same tests in the same order.  Expected values are computed locally
from what each rank contributes (a function of its rank), so the tests hold at
any world size.
"""

import os
import tempfile

import numpy as np
import pytest
from core_helpers import (
    ALL_DTYPES,
    FLOAT_DTYPES,
    NUMERIC_DTYPES,
    WAIT,
    assert_same,
    dtype_id,
    same_everywhere,
    wait_all,
)

import hvdlite as hvd

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
RANKS = range(SIZE)


# ------------------------------------------------------------------ helpers
def contribution(op, dtype, r, shape=(2, 3)):
    """What rank *r* contributes to a reduction test with *op* and *dtype*."""
    base = np.arange(int(np.prod(shape))).reshape(shape)
    if dtype == np.bool_:
        return ((base + r) % 2).astype(np.bool_)
    if op == hvd.Product:
        return ((base % 2) + 1 + (r % 2)).astype(dtype)  # values 1..3: no overflow at 3 ranks
    if op == hvd.Average:
        return (base % 5 + SIZE * r).astype(dtype)  # the sum divides by SIZE exactly
    return (base % 5 + r).astype(dtype)


def reference(op, dtype, shape=(2, 3)):
    stacked = np.stack([contribution(op, dtype, r, shape).astype(np.float64) for r in RANKS])
    if op == hvd.Sum:
        out = stacked.sum(0)
    elif op == hvd.Average:
        out = stacked.sum(0) / SIZE
    elif op == hvd.Min:
        out = stacked.min(0)
    elif op == hvd.Max:
        out = stacked.max(0)
    else:
        out = stacked.prod(0)
    return out.astype(dtype)


OPS = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]


# ---------------------------------------------------------------- allreduce
@pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name.lower())
def test_allreduce_every_op_and_dtype(op, dtype):
    x = contribution(op, dtype, RANK)
    before = x.copy()
    out = hvd.allreduce(x, op=op, name=f"ar.{op.name}.{np.dtype(dtype).name}")
    assert_same(out, reference(op, dtype), dtype)
    assert_same(x, before)  # the input is not modified without output=


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max, hvd.Product], ids=lambda o: o.name.lower())
def test_allreduce_bool_logical_ops(op):
    x = contribution(op, np.bool_, RANK)
    stacked = np.stack([contribution(op, np.bool_, r) for r in RANKS])
    expected = stacked.all(0) if op in (hvd.Min, hvd.Product) else stacked.any(0)
    assert_same(hvd.allreduce(x, op=op, name=f"ar.bool.{op.name}"), expected, np.bool_)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name.lower())
def test_allreduce_bool_sum_or_average_is_rejected(op):
    with pytest.raises(ValueError, match="bool"):
        hvd.allreduce(np.ones(3, dtype=np.bool_), op=op, name="ar.bool.bad")
    assert hvd.allreduce(np.ones(1), op=hvd.Sum, name="ar.bool.after")[0] == SIZE


def test_allreduce_default_op_is_average_and_average_flag():
    x = np.full(4, float(RANK), dtype=np.float32)
    mean = sum(RANKS) / SIZE
    assert_same(hvd.allreduce(x, name="ar.default"), np.full(4, mean, np.float32))
    assert_same(hvd.allreduce(x, average=True, name="ar.avg.true"), np.full(4, mean, np.float32))
    assert_same(
        hvd.allreduce(x, average=False, name="ar.avg.false"), np.full(4, sum(RANKS), np.float32)
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name.lower())
def test_allreduce_prescale_postscale(op, dtype):
    x = np.arange(5, dtype=dtype) + RANK
    out = hvd.allreduce(
        x,
        op=op,
        prescale_factor=0.5,
        postscale_factor=3.0,
        name=f"ar.scale.{op.name}.{np.dtype(dtype).name}",
    )
    total = sum(np.arange(5, dtype=np.float64) + r for r in RANKS) * 1.5
    if op == hvd.Average:
        total = total / SIZE
    assert_same(out, total.astype(dtype), dtype)


def test_allreduce_scalar_and_empty_and_large():
    assert_same(
        hvd.allreduce(np.float64(RANK + 1), op=hvd.Sum, name="ar.scalar"),
        np.float64(sum(r + 1 for r in RANKS)),
    )
    empty = hvd.allreduce(np.zeros((0, 3), np.float32), op=hvd.Sum, name="ar.empty")
    assert empty.shape == (0, 3)
    big = np.full(300_000, RANK + 1, dtype=np.float32)  # ~1.2 MB: past MPI's eager limits
    assert_same(
        hvd.allreduce(big, op=hvd.Sum, name="ar.big"),
        np.full(300_000, sum(r + 1 for r in RANKS), np.float32),
    )


def test_allreduce_in_place_output():
    x = np.full(6, RANK + 1, dtype=np.float64)
    out = hvd.allreduce(x, op=hvd.Sum, name="ar.inplace", output=x)
    assert out is x
    assert_same(x, np.full(6, sum(r + 1 for r in RANKS), np.float64))
    # A separate output array, with prescaling (the copy-while-scaling path).
    y = np.full(6, RANK + 1, dtype=np.float32)
    dest = np.empty_like(y)
    out = hvd.allreduce(y, op=hvd.Sum, prescale_factor=2.0, name="ar.output", output=dest)
    assert out is dest
    assert_same(dest, np.full(6, 2 * sum(r + 1 for r in RANKS), np.float32))
    assert_same(y, np.full(6, RANK + 1, np.float32))


def test_allreduce_async_poll_synchronize():
    handles = [
        hvd.allreduce_async(np.full(3, RANK + i, np.float64), op=hvd.Sum, name=f"ar.async.{i}")
        for i in range(5)
    ]
    assert all(isinstance(h, hvd.Handle) for h in handles)
    assert all(isinstance(hvd.poll(h), bool) for h in handles)
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        assert hvd.poll(h)
        assert_same(out, np.full(3, sum(r + i for r in RANKS), np.float64))
    # synchronize() of a finished handle returns the same result again
    assert_same(hvd.synchronize(handles[0]), np.full(3, sum(RANKS), np.float64))


def test_allreduce_async_in_place():
    x = np.full(3, RANK + 1, dtype=np.int32)
    h = hvd.allreduce_async(x, op=hvd.Sum, name="ar.async.inplace", output=x)
    assert h.result(timeout=WAIT) is x
    assert_same(x, np.full(3, sum(r + 1 for r in RANKS), np.int32))


def test_automatic_names_in_call_order():
    # Unnamed collectives are matched across ranks by call order, per op.
    h1 = hvd.allreduce_async(np.full(2, 1.0), op=hvd.Sum)
    h2 = hvd.allreduce_async(np.full(2, 2.0), op=hvd.Sum)
    g = hvd.allgather_async(np.full((1, 2), RANK))
    assert h1.name != h2.name and "allreduce" in h1.name and "allgather" in g.name
    assert_same(h1.result(timeout=WAIT), np.full(2, 1.0 * SIZE))
    assert_same(h2.result(timeout=WAIT), np.full(2, 2.0 * SIZE))
    assert_same(g.result(timeout=WAIT), np.repeat(np.arange(SIZE), 2).reshape(SIZE, 2))
    assert same_everywhere((h1.name, h2.name, g.name))
    # The same unnamed call repeated (a training loop) keeps working.
    for _ in range(3):
        assert_same(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, float(SIZE)))


def test_repeated_names_hit_the_cache():
    from hvdlite.engine.runtime import state

    for i in range(4):
        out = hvd.allreduce(np.full(8, i + RANK, np.float32), op=hvd.Sum, name="ar.repeat")
        assert_same(out, np.full(8, sum(i + r for r in RANKS), np.float32))
    assert len(state().engine.bits.cache) > 0


def test_a_repeated_named_allreduce_stays_right_as_its_arguments_change():
    # One name, called again and again as a metric would be, while its op, dtype,
    # shape, scales and output change: each change is a new negotiation, each repeat
    # runs from the cache (through the executor's runner for a single tensor, or
    # run_batch where the dtype is widened); every result must be the current call's.
    import functools

    from hvdlite.engine.runtime import state

    calls = [
        dict(op=hvd.Sum, dtype=np.float32, shape=(5,)),
        dict(op=hvd.Average, dtype=np.float32, shape=(5,)),
        dict(op=hvd.Sum, dtype=np.float32, shape=(5,), prescale_factor=2.0, postscale_factor=0.5),
        dict(op=hvd.Max, dtype=np.int32, shape=(5,)),
        dict(op=hvd.Sum, dtype=np.float16, shape=(5,)),
        dict(op=hvd.Product, dtype=np.float64, shape=(2, 3)),
        # a 0-d array as a scale cannot be a key of the remembered arguments
        dict(op=hvd.Sum, dtype=np.float32, shape=(5,), prescale_factor=np.array(3.0)),
        dict(op=hvd.Sum, dtype=np.float32, shape=(5,), in_place=True),
    ]
    for call in calls:
        op, dtype, shape = call["op"], call["dtype"], call["shape"]
        pre = float(call.get("prescale_factor", 1.0))
        post = call.get("postscale_factor", 1.0)
        expected = (reference(op, dtype, shape).astype(np.float64) * pre * post).astype(dtype)
        for _ in range(3):
            x = contribution(op, dtype, RANK, shape)
            kwargs = dict(
                op=op,
                name="ar.metric",
                prescale_factor=call.get("prescale_factor", 1.0),
                postscale_factor=post,
            )
            if call.get("in_place"):
                out = hvd.allreduce(x, output=x, **kwargs)
                assert out is x
            else:
                out = hvd.allreduce(x, **kwargs)
            assert_same(out, expected, dtype)
        plan = list(state().engine._execution._plans._plans.values())[-1]  # the last one made
        if dtype != np.float16:
            # the cached plan of one single allreduce has its own runner
            assert len(plan.runners) == 1 and not isinstance(plan.runners[0], functools.partial)


def test_the_executor_takes_the_fast_path_the_request_carries(monkeypatch):
    # Whether a single allreduce gets its own runner is decided where its request is
    # made (Params.single_host) and only read by the executor: a request made
    # without it runs through run_batch, with the same results.
    import functools

    from hvdlite import collectives
    from hvdlite.engine.runtime import state

    def last_plan():
        return list(state().engine._execution._plans._plans.values())[-1]

    x = np.full(5, RANK + 1, np.float32)
    expected = np.full(5, sum(r + 1 for r in RANKS), np.float32)
    for _ in range(3):
        assert_same(hvd.allreduce(x, op=hvd.Sum, name="ar.carried"), expected)
    assert not isinstance(last_plan().runners[0], functools.partial)
    monkeypatch.setattr(collectives, "single_host", lambda device, dtypes: False)
    for _ in range(3):
        assert_same(hvd.allreduce(x, op=hvd.Sum, name="ar.not.carried"), expected)
    assert isinstance(last_plan().runners[0], functools.partial)


def test_more_cached_names_than_one_status_word():
    # 150 names: the cache bit vectors span three 64-bit words; the second and third
    # rounds are answered from the cache, in a rank-dependent submission order.
    names = [f"many.{i}" for i in range(150)]
    for round_ in range(3):
        order = names if (RANK + round_) % 2 == 0 else names[::-1]
        handles = {
            n: hvd.allreduce_async(np.full(2, RANK + round_, np.int64), op=hvd.Sum, name=n)
            for n in order
        }
        expected = np.full(2, sum(r + round_ for r in RANKS), np.int64)
        for n in names:
            assert_same(hvd.synchronize(handles[n]), expected)


# ----------------------------------------------------------- grouped allreduce
def test_grouped_allreduce_same_dtype():
    tensors = [np.full(k + 1, RANK + k, np.float32) for k in range(4)]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="gar.same")
    assert isinstance(outs, list) and len(outs) == 4
    for k, out in enumerate(outs):
        assert_same(out, np.full(k + 1, sum(r + k for r in RANKS), np.float32))


def test_grouped_allreduce_mixed_dtypes():
    tensors = [
        np.full(3, RANK + 1, np.int32),
        np.full(2, 0.25 * (RANK + 1), np.float64),
        np.full(4, RANK + 1, np.float16),
        np.full(2, 1000 * (RANK + 1), np.int64),
    ]
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="gar.mixed")
    total = sum(r + 1 for r in RANKS)
    for t, out in zip(tensors, outs):
        scale = {np.dtype(np.float64): 0.25, np.dtype(np.int64): 1000}.get(t.dtype, 1)
        assert_same(out, np.full(t.shape, total * scale, t.dtype), t.dtype)


def test_grouped_allreduce_large_tensors_reduced_in_place_beside_fused_small_ones():
    # Tensors of 1 MiB and more skip the fusion buffer; small ones are fused. Both
    # kinds, in one group and as separate async entries, give the plain result.
    big = np.full(300_000, float(RANK + 1), np.float32)  # 1.2 MB
    small = [np.full(5, float(RANK), np.float64), np.full(3, RANK, np.int32)]
    outs = hvd.grouped_allreduce([big, *small], op=hvd.Sum, name="gar.big")
    assert_same(outs[0], np.full(big.shape, float(sum(r + 1 for r in RANKS)), np.float32))
    assert_same(outs[1], np.full(5, float(sum(RANKS))))
    assert_same(outs[2], np.full(3, sum(RANKS), np.int32))
    in_place = big.copy()
    handles = [
        hvd.allreduce_async(in_place, name="big.inplace", output=in_place),
        hvd.allreduce_async(small[0], name="small.async"),
    ]
    wait_all(handles)
    assert_same(in_place, np.full(big.shape, sum(r + 1 for r in RANKS) / SIZE, np.float32))


def test_grouped_allreduce_average_scaled_async_in_place():
    tensors = [np.full((2, 2), float(RANK), np.float64) for _ in range(3)]
    h = hvd.grouped_allreduce_async(
        tensors,
        op=hvd.Average,
        prescale_factor=2.0,
        postscale_factor=0.5,
        name="gar.inplace",
        outputs=tensors,
    )
    outs = h.result(timeout=WAIT)
    for t, out in zip(tensors, outs):
        assert out is t
        assert_same(t, np.full((2, 2), sum(RANKS) / SIZE))


# ---------------------------------------------------------------- allgather
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_allgather_dim0_differs_per_rank(dtype):
    # rank r contributes r rows (rank 0: none) of value r
    x = np.full((RANK, 3), RANK % 2 if dtype == np.bool_ else RANK, dtype=dtype)
    out = hvd.allgather(x, name=f"ag.{np.dtype(dtype).name}")
    expected = np.concatenate(
        [np.full((r, 3), r % 2 if dtype == np.bool_ else r, dtype=dtype) for r in RANKS]
    )
    assert_same(out, expected, dtype)


def test_allgather_1d_and_async():
    h = hvd.allgather_async(np.arange(RANK + 1, dtype=np.int64), name="ag.1d")
    out = hvd.synchronize(h)
    assert_same(out, np.concatenate([np.arange(r + 1) for r in RANKS]).astype(np.int64))
    with pytest.raises(ValueError, match="dimension"):
        hvd.allgather(np.float32(1.0), name="ag.scalar")


def test_grouped_allgather():
    tensors = [
        np.full((RANK + 1, 2), RANK, np.float32),
        np.full((1, 2, 2), RANK, np.int8),
        np.full((2 - RANK % 2,), RANK % 2 == 0, np.bool_),
    ]
    outs = hvd.grouped_allgather(tensors, name="gag")
    assert len(outs) == 3
    assert_same(outs[0], np.concatenate([np.full((r + 1, 2), r, np.float32) for r in RANKS]))
    assert_same(outs[1], np.concatenate([np.full((1, 2, 2), r, np.int8) for r in RANKS]))
    assert_same(outs[2], np.concatenate([np.full((2 - r % 2,), r % 2 == 0) for r in RANKS]))
    outs = hvd.grouped_allgather_async(tensors, name="gag.async").result(timeout=WAIT)
    assert outs[0].shape == (sum(r + 1 for r in RANKS), 2)


# ---------------------------------------------------------------- broadcast
@pytest.mark.parametrize("root", range(3))
def test_broadcast_from_each_root(root):
    if root >= SIZE:
        pytest.skip(f"root {root} does not exist at {SIZE} ranks")
    x = np.full((3, 2), RANK * 10.0, dtype=np.float64)
    out = hvd.broadcast(x, root, name=f"bc.root{root}")
    assert_same(out, np.full((3, 2), root * 10.0))
    assert_same(x, np.full((3, 2), RANK * 10.0))  # not in place


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_broadcast_every_dtype_in_place(dtype):
    root = SIZE - 1
    x = (np.arange(6).reshape(2, 3) + RANK).astype(dtype)
    out = hvd.broadcast(x, root, name=f"bc.{np.dtype(dtype).name}", output=x)
    assert out is x
    assert_same(x, (np.arange(6).reshape(2, 3) + root).astype(dtype), dtype)


def test_broadcast_async_many():
    handles = [
        hvd.broadcast_async(np.full(4, RANK + i, np.int32), i % SIZE, name=f"bc.async.{i}")
        for i in range(6)
    ]
    for i, out in enumerate(wait_all(handles)):
        assert_same(out, np.full(4, i % SIZE + i, np.int32))


# ----------------------------------------------------------------- alltoall
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_id)
def test_alltoall_even(dtype):
    # rank r sends rows [r*100 + d, r*100 + d] to rank d
    rows = [r_to_d for d in RANKS for r_to_d in [RANK * 100 + d] * 2]
    x = np.array(rows, dtype=np.int64).reshape(SIZE * 2, 1).repeat(2, axis=1)
    x = (x % 2 == 0) if dtype == np.bool_ else (x % 120).astype(dtype)
    out = hvd.alltoall(x, name=f"a2a.{np.dtype(dtype).name}")
    expected = (
        np.array([s * 100 + RANK for s in RANKS for _ in range(2)], dtype=np.int64)
        .reshape(-1, 1)
        .repeat(2, axis=1)
    )
    expected = (expected % 2 == 0) if dtype == np.bool_ else (expected % 120).astype(dtype)
    assert_same(out, expected, dtype)


def test_alltoall_uneven_splits():
    # rank r sends r + d rows of value 100*r + d to rank d (rank 0 sends no row to itself)
    splits = [RANK + d for d in RANKS]
    x = np.concatenate([np.full((RANK + d, 3), 100 * RANK + d, np.float32) for d in RANKS])
    out, received = hvd.alltoall(x, splits=splits, name="a2a.uneven")
    assert_same(received, np.array([s + RANK for s in RANKS]))
    expected = np.concatenate([np.full((s + RANK, 3), 100 * s + RANK, np.float32) for s in RANKS])
    assert_same(out, expected, np.float32)
    h = hvd.alltoall_async(x, splits=np.array(splits), name="a2a.uneven.async")
    out2, received2 = h.result(timeout=WAIT)
    assert_same(out2, expected)
    assert_same(received2, received)


def test_alltoall_without_splits_returns_array():
    x = np.arange(SIZE * 2, dtype=np.int32) + 10 * RANK
    out = hvd.alltoall(x, name="a2a.plain")
    assert isinstance(out, np.ndarray)
    assert_same(out, np.array([10 * s + 2 * RANK + k for s in RANKS for k in range(2)], np.int32))


# ------------------------------------------------------------ reducescatter
def shard(rows, r):
    base, extra = divmod(rows, SIZE)
    start = r * base + min(r, extra)
    return start, start + base + (1 if r < extra else 0)


@pytest.mark.parametrize("rows", [6, 7, 1], ids=lambda n: f"rows{n}")
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=lambda o: o.name.lower())
def test_reducescatter_even_and_uneven(op, rows):
    x = (np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 1) * (RANK + 1)
    out = hvd.reducescatter(x, op=op, name=f"rs.{op.name}.{rows}")
    total = (np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 1) * sum(r + 1 for r in RANKS)
    if op == hvd.Average:
        total /= SIZE
    lo, hi = shard(rows, RANK)
    assert_same(out, total[lo:hi])


@pytest.mark.parametrize("dtype", NUMERIC_DTYPES, ids=dtype_id)
def test_reducescatter_every_dtype(dtype):
    x = np.full((SIZE * 2, 3), RANK + 1, dtype=dtype)
    out = hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{np.dtype(dtype).name}")
    assert_same(out, np.full((2, 3), sum(r + 1 for r in RANKS)), dtype)


def test_reducescatter_scaled_and_async():
    x = np.full((SIZE, 2), RANK + 1.0, np.float32)
    h = hvd.reducescatter_async(
        x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, name="rs.async"
    )
    out = hvd.synchronize(h)
    assert_same(out, np.full((1, 2), sum(r + 1 for r in RANKS) * 0.5, np.float32))
    # Handle.result() and synchronize() agree: both give the shard, not a list.
    assert_same(np.asarray(h.result(timeout=WAIT)), out)


def test_grouped_reducescatter():
    tensors = [
        np.full((SIZE + 1, 2), RANK + 1, np.float32),
        np.full((2 * SIZE,), 2.0 * (RANK + 1), np.float32),
        np.full((SIZE, 1), RANK + 1, np.int64),
    ]
    outs = hvd.grouped_reducescatter(tensors, op=hvd.Sum, name="grs")
    total = sum(r + 1 for r in RANKS)
    lo, hi = shard(SIZE + 1, RANK)
    assert_same(outs[0], np.full((hi - lo, 2), total, np.float32))
    assert_same(outs[1], np.full((2,), 2.0 * total, np.float32))
    assert_same(outs[2], np.full((1, 1), total, np.int64), np.int64)
    # Mixed dtypes in one group: each tensor is reduced in its own dtype.
    mixed = [
        np.full((SIZE, 2), RANK + 1, np.int32),
        np.full((SIZE,), 0.25 * (RANK + 1)),
        np.full((SIZE + 2, 1), RANK + 1, np.float16),
    ]
    outs = hvd.grouped_reducescatter(mixed, op=hvd.Sum, name="grs.mixed")
    lo, hi = shard(SIZE + 2, RANK)
    assert_same(outs[0], np.full((1, 2), total, np.int32), np.int32)
    assert_same(outs[1], np.full((1,), 0.25 * total), np.float64)
    assert_same(outs[2], np.full((hi - lo, 1), total, np.float16), np.float16)
    outs = hvd.grouped_reducescatter_async(tensors, op=hvd.Average, name="grs.async").result(
        timeout=WAIT
    )
    assert_same(outs[1], np.full((2,), 2.0 * total / SIZE, np.float32))


# ------------------------------------------------------------ barrier, objects
def test_barrier_orders_side_effects():
    if hvd.local_size() != SIZE:
        pytest.skip("the ranks do not share a file system view of one node")
    path = hvd.broadcast_object(tempfile.mkdtemp() if RANK == 0 else None, 0, name="bar.dir")
    marker = os.path.join(path, "written-by-rank-0")
    if RANK == 0:
        with open(marker, "w") as f:
            f.write("x")
    assert hvd.barrier() is None
    assert os.path.exists(marker)
    hvd.barrier()
    if RANK == 0:
        os.remove(marker)
        os.rmdir(path)
    for _ in range(3):
        hvd.barrier()


@pytest.mark.parametrize("root", range(3))
def test_broadcast_object_from_each_root(root):
    if root >= SIZE:
        pytest.skip(f"root {root} does not exist at {SIZE} ranks")
    obj = {"from": RANK, "payload": list(range(RANK * 50))} if RANK == root else None
    got = hvd.broadcast_object(obj, root_rank=root, name=f"bobj.{root}")
    assert got == {"from": root, "payload": list(range(root * 50))}


def test_broadcast_object_default_root_and_unnamed():
    got = hvd.broadcast_object(("hello", RANK) if RANK == 0 else "ignored")
    assert got == ("hello", 0)
    got = hvd.broadcast_object(np.arange(3) * (RANK + 1))
    assert_same(got, np.arange(3))


def test_broadcast_object_on_both_sides_of_the_one_broadcast_limit():
    # a pickle of up to 1 KiB travels in one broadcast, a longer one in two
    for size in (0, 1000, 1005, 1006, 1007, 1030, 70000):  # pickle: size + 18 bytes
        blob = bytes([RANK + 1]) * size
        got = hvd.broadcast_object(
            blob if RANK == 1 % SIZE else None, root_rank=1 % SIZE, name=f"bobj.size.{size}"
        )
        assert got == bytes([1 % SIZE + 1]) * size


def test_allgather_object():
    objs = hvd.allgather_object({"rank": RANK, "blob": "x" * (RANK * 1000)}, name="agobj")
    assert objs == [{"rank": r, "blob": "x" * (r * 1000)} for r in RANKS]
    assert hvd.allgather_object(None) == [None] * SIZE
