"""CuPy arrays through the framework-neutral API on a GPU: every collective returns
CuPy arrays with the host path's values; the transport is the planned one;
results are ordered on the producer's stream; a CPU/GPU mismatch fails on every rank."""

import numpy as np
import pytest

import hvdlite as hvd

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


@pytest.fixture(scope="module")
def cp():
    import cupy

    hvd.init()
    cupy.cuda.Device(hvd.local_rank() % cupy.cuda.runtime.getDeviceCount()).use()
    yield cupy
    hvd.shutdown()


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_sum_average(cp, dtype):
    rank, size = hvd.rank(), hvd.size()
    x = cp.arange(10).astype(dtype) + rank
    out = hvd.allreduce(x, op=hvd.Sum, name=f"cp.sum.{np.dtype(dtype).name}")
    assert isinstance(out, cp.ndarray) and out.dtype == dtype
    expect = sum(np.arange(10).astype(np.float64) + r for r in range(size))
    np.testing.assert_allclose(cp.asnumpy(out).astype(np.float64), expect, rtol=1e-2)
    if np.dtype(dtype).kind == "f":
        avg = hvd.allreduce(x, op=hvd.Average, name=f"cp.avg.{np.dtype(dtype).name}")
        np.testing.assert_allclose(cp.asnumpy(avg).astype(np.float64), expect / size, rtol=1e-2)


def test_min_max_prescale_in_place(cp):
    rank, size = hvd.rank(), hvd.size()
    x = cp.array([rank, -rank], dtype=cp.float32)
    assert cp.asnumpy(hvd.allreduce(x, op=hvd.Max)).tolist() == [size - 1, 0]
    assert cp.asnumpy(hvd.allreduce(x, op=hvd.Min)).tolist() == [0, 1 - size]
    y = cp.full(4, rank + 1, dtype=cp.float32)
    assert hvd.allreduce(y, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25, output=y) is y
    np.testing.assert_allclose(cp.asnumpy(y), size * (size + 1) / 4)


def test_fused_burst(cp):
    rank, size = hvd.rank(), hvd.size()
    arrays = [cp.full(1000 + i, rank + i, dtype=cp.float32) for i in range(50)]
    handles = [
        hvd.allreduce_async(a, op=hvd.Sum, name=f"cp.burst.{i}") for i, a in enumerate(arrays)
    ]
    for i, h in enumerate(handles):
        np.testing.assert_allclose(cp.asnumpy(hvd.synchronize(h)), size * (size - 1) / 2 + size * i)


def test_allgather_broadcast_alltoall_reducescatter(cp):
    rank, size = hvd.rank(), hvd.size()
    g = hvd.allgather(cp.full((rank + 1, 3), rank, dtype=cp.int32))
    assert isinstance(g, cp.ndarray)
    np.testing.assert_array_equal(
        cp.asnumpy(g), np.concatenate([np.full((r + 1, 3), r, np.int32) for r in range(size)])
    )
    b = hvd.broadcast(cp.full(5, rank, dtype=cp.float64), size - 1)
    np.testing.assert_array_equal(cp.asnumpy(b), np.full(5, size - 1))
    splits = [1] * size
    out, received = hvd.alltoall(cp.arange(size, dtype=cp.float32) + 10 * rank, splits=splits)
    np.testing.assert_array_equal(cp.asnumpy(out), [rank + 10 * r for r in range(size)])
    rows = 2 * size + 1
    rs = hvd.reducescatter(cp.ones((rows, 2), dtype=cp.float32), op=hvd.Sum)
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    np.testing.assert_array_equal(cp.asnumpy(rs), np.full((counts[rank], 2), size))


def test_result_ordered_on_producer_stream(cp):
    size = hvd.size()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.ones(1 << 22, dtype=cp.float32)
        for _ in range(20):  # keep the stream busy so a missing wait would show
            x = x * 1.0
        out = hvd.allreduce(x, op=hvd.Sum, name="cp.stream")
        total = float(out.sum())  # enqueued on the producer stream after the collective
    assert total == float(size * (1 << 22))


def test_transport_is_the_planned_one(cp):
    from helpers import expected_link_names

    from hvdlite.engine.runtime import state
    from hvdlite.engine.runtime import routes_of

    plan = routes_of(hvd.global_process_set).device
    used = set(state().engine.executor.device.used)
    assert used and used <= expected_link_names(plan, hvd.size()) | {
        n for n in used if n.startswith("hierarchical")
    }, (used, plan)


def test_mixed_devices_fail_on_every_rank(cp):
    if hvd.size() < 2:
        pytest.skip("a device mismatch needs two ranks")
    x = np.ones(3, np.float32) if hvd.rank() == 0 else cp.ones(3, dtype=cp.float32)
    with pytest.raises(hvd.MismatchError, match=r"Mismatched device.*cpu.*cuda"):
        hvd.allreduce(x, name="cp.mixed")
