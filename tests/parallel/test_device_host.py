"""The device path's logic on CPU: the host backend through the real engine.

:class:`hvdlite.device.HostDeviceArray` inputs take the device path (packing,
scaling, averaging, stream/event ordering, the links) with the host backend,
at 1, 2 and 3 ranks.  No GPU result is claimed here: the CUDA backend runs
this same executor code in tests/gpu/.  Collectives go through the engine
(negotiation, the device field, fusion), and, for the transports the engine's
plan does not pick on a CPU machine, through a DeviceExecutor built directly.
"""

import collections
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

import hvdlite as hvd
from hvdlite.engine.runtime import state
from hvdlite.device import HostDeviceArray, host_device_array
from hvdlite.device import registry
from hvdlite.engine.transports.device import DeviceExecutor, device_peers
from hvdlite.device.selection import DeviceRoutes
from hvdlite.handles import Handle
from hvdlite.engine.messages import RESPONSE_OK, Kind, Params, Response
from hvdlite.engine.submissions import Entry
from hvdlite.engine.transports.routes import Transport, Routes

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def dev(a):
    return host_device_array(a)


def device_batches() -> int:
    """How many batches the live engine's device path has run (test_shutdown starts a new one)."""
    device = state().engine.executor.device
    return 0 if device is None else sum(device.used.values())


# ------------------------------------------------------------------ allreduce
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int32, np.int16, np.uint8]
)
def test_allreduce_sum_and_average(dtype):
    x = np.arange(7).astype(dtype) + RANK
    before = device_batches()
    total = hvd.allreduce(dev(x), op=hvd.Sum, name=f"sum.{np.dtype(dtype).name}")
    expect = sum(np.arange(7).astype(np.float64) + r for r in range(SIZE))
    assert isinstance(total, HostDeviceArray) and total.dtype == dtype
    np.testing.assert_allclose(total.astype(np.float64), expect, rtol=1e-3)
    if np.dtype(dtype).kind == "f":
        avg = hvd.allreduce(dev(x), op=hvd.Average, name=f"avg.{np.dtype(dtype).name}")
        np.testing.assert_allclose(avg.astype(np.float64), expect / SIZE, rtol=1e-3)
    assert device_batches() > before


def test_min_max_and_bool():
    x = dev(np.array([RANK, -RANK, 5], dtype=np.int64))
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Max), [SIZE - 1, 0, 5])
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Min), [0, 1 - SIZE, 5])
    flags = dev(np.array([True, RANK == 0]))
    np.testing.assert_array_equal(hvd.allreduce(flags, op=hvd.Max), [True, True])
    np.testing.assert_array_equal(hvd.allreduce(flags, op=hvd.Min), [True, SIZE == 1])


def test_prescale_postscale_in_place():
    x = dev(np.full(5, RANK + 1, dtype=np.float32))
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5, output=x)
    assert out is x
    np.testing.assert_allclose(x, np.full(5, SIZE * (SIZE + 1) / 2))


def test_fused_burst_of_mixed_dtypes():
    arrays = [
        dev(np.full(3 + i, RANK + i, dtype=dt))
        for i, dt in enumerate([np.float32, np.float16, np.float32, np.float64] * 3)
    ]
    handles = [
        hvd.allreduce_async(a, op=hvd.Average, name=f"burst.{i}", prescale_factor=2.0)
        for i, a in enumerate(arrays)
    ]
    grouped = hvd.grouped_allreduce(
        [dev(np.ones(4, np.float32) * RANK), dev(np.ones(2, np.float16) * RANK)], op=hvd.Sum
    )
    mean_rank = (SIZE - 1) / 2
    for i, h in enumerate(handles):
        np.testing.assert_allclose(
            hvd.synchronize(h).astype(np.float64), 2 * (mean_rank + i), rtol=1e-3
        )
    for g in grouped:
        np.testing.assert_allclose(g.astype(np.float64), SIZE * mean_rank)


# ---------------------------------------------------- CPU and device apart
def test_cpu_and_device_entries_never_share_a_batch():
    seen = []
    executor = state().engine.executor
    run = executor.run_batch

    def recording(batch):
        seen.append({r.params.device for r in batch})
        return run(batch)

    executor.run_batch = recording
    try:
        handles = [
            hvd.allreduce_async(np.full(4, RANK, np.float32), op=hvd.Sum, name=f"c.{i}")
            for i in range(3)
        ]
        handles += [
            hvd.allreduce_async(dev(np.full(4, RANK, np.float32)), op=hvd.Sum, name=f"d.{i}")
            for i in range(3)
        ]
        results = [hvd.synchronize(h) for h in handles]
    finally:
        executor.run_batch = run
    assert all(len(devices) == 1 for devices in seen), seen
    assert {"cpu", "host"} <= set().union(*seen)
    for i, r in enumerate(results):
        assert isinstance(r, HostDeviceArray) == (i >= 3)
        np.testing.assert_allclose(r, SIZE * (SIZE - 1) / 2)


@pytest.mark.skipif(SIZE < 2, reason="a device mismatch needs two ranks")
def test_device_mismatch_fails_on_every_rank():
    x = np.ones(3, np.float32)
    arg = x if RANK == 0 else dev(x)
    with pytest.raises(hvd.MismatchError, match=r"Mismatched device .*rank 0: cpu.*host"):
        hvd.allreduce(arg, name="mixed.devices")
    # the engine keeps working afterwards
    np.testing.assert_allclose(hvd.allreduce(dev(x), op=hvd.Sum, name="after.mixed"), SIZE)


def test_mixed_devices_in_one_call_refused_at_submission():
    with pytest.raises(ValueError, match="one device"):
        hvd.grouped_allreduce([dev(np.ones(2, np.float32)), np.ones(2, np.float32)])


# -------------------------------------------------------------- other kinds
def test_allgather_uneven_and_grouped():
    a = dev(np.full((RANK + 1, 2), RANK, dtype=np.int32))
    b = dev(np.arange(RANK + 2, dtype=np.float64))
    out = hvd.allgather(a)
    assert isinstance(out, HostDeviceArray)
    np.testing.assert_array_equal(
        out, np.concatenate([np.full((r + 1, 2), r, np.int32) for r in range(SIZE)])
    )
    ga, gb = hvd.grouped_allgather([a, b])
    np.testing.assert_array_equal(ga, out)
    np.testing.assert_array_equal(gb, np.concatenate([np.arange(r + 2) for r in range(SIZE)]))


def test_broadcast_single_and_fused():
    root = SIZE - 1
    x = dev(np.full(4, RANK, np.int16))
    np.testing.assert_array_equal(hvd.broadcast(x, root), np.full(4, root))
    handles = [
        hvd.broadcast_async(dev(np.full(i + 1, RANK * 10 + i, np.float32)), root, name=f"bc.{i}")
        for i in range(4)
    ]
    for i, h in enumerate(handles):
        np.testing.assert_array_equal(hvd.synchronize(h), np.full(i + 1, root * 10 + i))


def test_alltoall_with_splits():
    splits = [r + 1 for r in range(SIZE)]
    x = dev(np.repeat(np.arange(SIZE, dtype=np.float32), splits) + 100 * RANK)
    out, received = hvd.alltoall(x, splits=splits)
    assert list(received) == [RANK + 1] * SIZE
    np.testing.assert_array_equal(
        out, np.concatenate([np.full(RANK + 1, RANK + 100 * r) for r in range(SIZE)])
    )


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_uneven(op):
    rows = 2 * SIZE + 1
    x = dev(np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * (RANK + 1))
    out = hvd.reducescatter(x, op=op, prescale_factor=2.0)
    full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3) * 2 * SIZE * (SIZE + 1) / 2
    if op == hvd.Average:
        full /= SIZE
    counts = [rows // SIZE + (1 if r < rows % SIZE else 0) for r in range(SIZE)]
    start = sum(counts[:RANK])
    np.testing.assert_allclose(out, full[start : start + counts[RANK]])
    g = hvd.grouped_reducescatter([x, dev(np.ones((SIZE, 2), np.float64))], op=hvd.Sum)
    np.testing.assert_allclose(g[1], np.full((1, 2), SIZE))


# ----------------------------------------------- Horovod's CUDA scaling rule
def _device_scaled(x, factor, dtype):
    """x * factor rounded to *dtype* as Horovod's CUDA kernels do, computed here
    independently: float16 times the float16 factor (exact in float64, rounded
    once), float32 in float32, integers in float64 then truncated."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return (x.astype(np.float64) * float(np.float16(np.float32(factor)))).astype(np.float16)
    if dtype.kind == "f":
        return (x.astype(dtype) * dtype.type(factor)).astype(dtype)
    return np.trunc(x.astype(np.float64) * factor).astype(dtype)


def _values(dtype, rows=6):
    """The same values on every rank (as Horovod's suite has them): a sum of up
    to three is then rounded once whatever order the ranks add in."""
    rng = np.random.default_rng(1234)
    return rng.integers(-100, 100, size=(rows, 3)).astype(dtype)


def _expected_sum(dtype, pre, post, rows=6):
    total = (_device_scaled(_values(dtype, rows), pre, dtype).astype(np.float64) * SIZE).astype(
        dtype
    )
    return _device_scaled(total, post, dtype)


def _same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8)), (got, want)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_scaling_rounds_to_the_tensor_dtype_like_horovod_on_cuda(dtype, op):
    if op == hvd.Average and np.dtype(dtype).kind != "f":
        pytest.skip("Average of integers is refused")
    pre, post = 0.3712, 1.7391
    post_total = post / SIZE if op == hvd.Average else post
    tag = f"{np.dtype(dtype).name}.{int(op)}"
    x = _values(dtype)
    got = hvd.allreduce(dev(x), op=op, prescale_factor=pre, postscale_factor=post, name=f"sr.{tag}")
    _same_bits(got, _expected_sum(dtype, pre, post_total))
    # fused with a second tensor (the packed path), and a reducescatter of each shape
    pair = hvd.grouped_allreduce(
        [dev(x), dev(x[:2])], op=op, prescale_factor=pre, postscale_factor=post
    )
    _same_bits(pair[0], _expected_sum(dtype, pre, post_total))
    rows = 2 * SIZE
    shard = hvd.reducescatter(
        dev(_values(dtype, rows)), op=op, prescale_factor=pre, postscale_factor=post
    )
    _same_bits(shard, _expected_sum(dtype, pre, post_total, rows)[2 * RANK : 2 * RANK + 2])
    grouped = hvd.grouped_reducescatter(
        [dev(_values(dtype, rows)), dev(x[:SIZE])],
        op=op,
        prescale_factor=pre,
        postscale_factor=post,
    )
    _same_bits(grouped[0], _expected_sum(dtype, pre, post_total, rows)[2 * RANK : 2 * RANK + 2])


# ------------------------------------------------------- cost per batch, counted
def _backend_calls(run) -> collections.Counter:
    """The host backend's calls made by the engine while *run* runs (submission's
    "ready" marks excluded: they are one per call, on the caller's thread)."""
    backend = registry.backend("host")
    backend.journal = []
    try:
        run()
        journal = backend.journal
    finally:
        backend.journal = None
    return collections.Counter(item[0] for item in journal if item[0] != "ready")


def _grouped_allreduce(n, dtype=np.float32, **kwargs):
    hvd.grouped_allreduce([dev(np.full(5, i, dtype)) for i in range(n)], **kwargs)


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(lambda n: _grouped_allreduce(n, op=hvd.Sum), id="allreduce"),
        pytest.param(
            lambda n: _grouped_allreduce(n, np.float16, op=hvd.Average, prescale_factor=0.5),
            id="allreduce-float16-scaled",
        ),
        pytest.param(
            lambda n: hvd.grouped_reducescatter(
                [dev(np.ones((SIZE + i % 3, 2), np.float32)) for i in range(n)], op=hvd.Average
            ),
            id="reducescatter",
        ),
        pytest.param(
            lambda n: hvd.grouped_allgather(
                [dev(np.ones((RANK + 1, 2), np.int32)) for _ in range(n)]
            ),
            id="allgather",
        ),
        pytest.param(
            lambda n: _Run(_plan(Transport.STAGED)).run(
                [
                    (
                        Params(
                            set_id=0,
                            name=f"cost.bc.{i}",
                            kind=int(Kind.BROADCAST),
                            dtypes=("<f4",),
                            shapes=((3,),),
                            root=0,
                            device="host",
                        ),
                        (dev(np.full(3, RANK, np.float32)),),
                        (dev(np.empty(3, np.float32)),),
                    )
                    for i in range(n)
                ]
            ),
            id="broadcast",
        ),
    ],
)
def test_a_batch_costs_the_same_backend_calls_for_2_or_200_tensors(case):
    few, many = _backend_calls(lambda: case(2)), _backend_calls(lambda: case(200))
    assert few == many, (few, many)
    assert few["copies"] >= 1
    # one producer stream (this thread): one record and one wait per batch, made by
    # the engine however many submissions the batch holds
    assert few["record"] == few["wait"] == 1, few


# ----------------------------------------------------------------- ordering
def test_batch_is_ordered_after_producers_and_published_after():
    backend = registry.backend("host")
    backend.journal = []
    try:
        handles = [
            hvd.allreduce_async(dev(np.ones(3, np.float32)), name=f"ord.{i}") for i in range(3)
        ]
        for h in handles:
            hvd.synchronize(h)
        journal = backend.journal
    finally:
        backend.journal = None
    ready = [seq for kind, *seq in journal if kind == "ready"]
    assert len(ready) == 3
    records = [i for i, item in enumerate(journal) if item[0] == "record"]
    waits = [(i, item[1]) for i, item in enumerate(journal) if item[0] == "wait"]
    publishes = [(i, item[1]) for i, item in enumerate(journal) if item[0] == "publish"]
    syncs = [i for i, item in enumerate(journal) if item == ("sync",)]
    for at, (seq,) in zip([i for i, item in enumerate(journal) if item[0] == "ready"], ready):
        # the engine records the producer after the submission and waits for that mark
        # before moving data (a sync of the staged copy), and publishes only after that
        record = min(i for i in records if i > at)
        wait = min(i for i, waited in waits if i > record and waited > seq)
        publish = min(i for i, published in publishes if published > seq and i > wait)
        assert any(wait < s < publish for s in syncs), journal


# ------------------------------------------- every link, through the executor
class _Run:
    """One batch through a DeviceExecutor built here, with a chosen plan: the first
    of the plan's device peers that takes it runs it, as in the dispatcher."""

    def __init__(self, plan: DeviceRoutes, hierarchical=None):
        self.entries = {}
        self.plan = plan
        self.executor = DeviceExecutor(
            self.entries.get,
            self._finish,
            self._finish_keys,
            SimpleNamespace(ranks={0: list(range(SIZE))}),
            lambda set_id: Routes(Transport.MPI, Transport.MPI, plan),
            hierarchical,
        )

    def _finish(self, entry, value):
        entry.handle.set_result(entry.result(value))

    def _finish_keys(self, keys):
        for key in keys:
            self._finish(self.entries[key], None)

    def run(self, params_and_arrays, comm=MPI.COMM_WORLD):
        batch = []
        backend = registry.backend("host")
        for params, inputs, outputs in params_and_arrays:
            entry = Entry(params, inputs, outputs, Handle(params.name))
            entry.ready = backend.record_ready(inputs)
            self.entries[entry.key] = entry
            batch.append(Response(RESPONSE_OK, params, entry.key))
        peers = device_peers(self.plan, lambda: self.executor)
        peer = next(p for p in peers if p.accepts(batch[0].params, comm, 0))
        peer.run(batch, comm)
        return [self.entries[r.key].handle.result() for r in batch]


def _allreduce_params(name, a, op=hvd.Sum):
    return Params(
        set_id=0,
        name=name,
        kind=int(Kind.ALLREDUCE),
        dtypes=(a.dtype.str,),
        shapes=(a.shape,),
        op=int(op),
        device="host",
    )


def _plan(transport, hierarchical=False):
    return DeviceRoutes(*([transport] * 5), fallback=Transport.STAGED, hierarchical=hierarchical)


@pytest.mark.parametrize(
    "transport,name",
    [
        (Transport.STAGED, "staged through host memory"),
        (Transport.CUDA_AWARE_MPI, "CUDA-aware MPI"),
        (Transport.NCCL, "CUDA-aware MPI"),  # host memory needs no NCCL: MPI takes it
    ],
)
def test_each_flat_link(transport, name):
    run = _Run(_plan(transport))
    xs = [dev(np.full(5 + i, RANK + i, np.float32)) for i in range(3)]
    results = run.run(
        [(_allreduce_params(f"l{i}", x), (x,), (dev(np.empty_like(x)),)) for i, x in enumerate(xs)]
    )
    for i, r in enumerate(results):
        np.testing.assert_allclose(r, SIZE * (SIZE - 1) / 2 + SIZE * i)
    assert set(run.executor.used) == {name}


@pytest.mark.parametrize("node_size", sorted({1, SIZE}))
def test_hierarchical_link(node_size):
    world = MPI.COMM_WORLD
    local = world.Split(RANK // node_size, RANK)
    cross = world.Split(local.Get_rank(), RANK)
    helper = SimpleNamespace(local=local, cross=cross, homogeneous=True)
    run = _Run(_plan(Transport.CUDA_AWARE_MPI, hierarchical=True), helper)
    x = dev(np.arange(11, dtype=np.float64) * (RANK + 1))
    out = dev(np.empty_like(x))
    (result,) = run.run([(_allreduce_params("h", x, hvd.Average), (x,), (out,))])
    np.testing.assert_allclose(result, np.arange(11) * (SIZE + 1) / 2)
    assert any(n.startswith("hierarchical") for n in run.executor.used)
    local.Free()
    cross.Free()


def test_shutdown_stops_the_engine_and_init_starts_a_working_one():
    # Every rank: the device path has run; shutdown() stops this rank's engine (its
    # inbox closed) and hvdlite is no longer initialized, so a device collective fails
    # saying to call init() again; init() then starts a new engine whose device path
    # works (and which the tests that may follow this one use).  One rank's shutdown()
    # ends every rank's engine: the barrier makes each rank finish what came before.
    x = dev(np.full(3, RANK, np.float32))
    np.testing.assert_allclose(hvd.allreduce(x, op=hvd.Sum), np.full(3, SIZE * (SIZE - 1) / 2))
    old = state().engine
    MPI.COMM_WORLD.Barrier()
    hvd.shutdown()
    assert old.stopped and not hvd.is_initialized()
    with pytest.raises(hvd.HorovodInternalError, match=r"shut down; call hvd.init\(\) again"):
        hvd.allreduce(x, op=hvd.Sum)
    hvd.init()
    assert hvd.is_initialized() and state().engine is not old and not state().engine.stopped
    before = device_batches()
    total = hvd.allreduce(x, op=hvd.Sum, name="after.init")
    assert isinstance(total, HostDeviceArray)
    np.testing.assert_allclose(total, np.full(3, SIZE * (SIZE - 1) / 2))
    assert device_batches() > before
