"""Large sums across nodes go around a ring (hvdlite/engine/transports/ring.py).

Runs as simulated nodes of one rank each (HVDLITE_TEST_NODE_SIZE=1), so every set of
two or more ranks spans nodes, as across hosts, and its ring is its ranks in order.
Every rank rebuilds every rank's input from a seeded generator and sums each block
in the order the ring does (starting after the block's owner); the results must
be exactly those bits on every rank, at 2, 3 and 4 ranks: alone, fused, grouped,
in place, with a rank that has joined, integers, on a process set, reduce-scatters
alone and grouped, and with a ring in another order called directly.
"""

import os

import numpy as np
import pytest

os.environ["HVDLITE_TEST_NODE_SIZE"] = "1"  # a knob read by init(), hence at import

from core_helpers import init_with_a_set_of_the_first_ranks, spy_on

import hvdlite as hvd  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hvdlite.engine.runtime import routes_of  # noqa: E402
from hvdlite.engine.transports.ring import RING_MIN_BYTES, Ring, RingPeer  # noqa: E402
from hvdlite.util.splits import even_split, offsets  # noqa: E402

MPI_SIZES = (2, 3, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "1"}

pytestmark = pytest.mark.timeout(120)

FIRST = init_with_a_set_of_the_first_ranks()  # all ranks but the last
R, N = hvd.rank(), hvd.size()
LARGE = RING_MIN_BYTES // 4 + 1001  # float32 elements over the ring's threshold


@pytest.fixture
def via_ring(monkeypatch):
    """The element counts of the batches this rank summed around the ring."""
    return spy_on(monkeypatch, RingPeer, "reduce", lambda p0, tensors, *rest: tensors.total())


@pytest.fixture
def via_ring_scatter(monkeypatch):
    """The response count of each reduce-scatter batch this rank ran around the ring."""
    return spy_on(monkeypatch, RingPeer, "_reducescatter", lambda batch, comm: len(batch))


def values(rank: int, count: int, seed: int, dtype=np.float32) -> np.ndarray:
    rs = np.random.RandomState(1000 * seed + rank)
    if np.dtype(dtype).kind == "f":
        return (rs.standard_normal(count) * 10).astype(dtype)
    return rs.randint(-1000, 1000, count).astype(dtype)


def ring_sum(inputs: list, order=None, counts=None) -> np.ndarray:
    """What the ring computes from *inputs* (one flat array per rank): each rank's
    block (*counts*, default even) summed from the position after its owner on,
    around the ring."""
    n = len(inputs)
    order = list(range(n)) if order is None else list(order)
    counts = even_split(inputs[0].size, n) if counts is None else counts
    out = np.empty_like(inputs[0])
    for at, count, owner in zip(offsets(counts), counts, range(n)):
        block = slice(at, at + count)
        q = order.index(owner)
        acc = inputs[order[(q + 1) % n]][block].copy()
        for k in range(2, n + 1):
            acc = acc + inputs[order[(q + k) % n]][block]
        out[block] = acc
    return out


def assert_exact(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    bits = np.dtype(f"u{actual.itemsize}")
    differ = np.flatnonzero(actual.reshape(-1).view(bits) != expected.reshape(-1).view(bits))
    assert differ.size == 0, (
        f"{differ.size} of {actual.size} elements differ, e.g. "
        f"{actual.reshape(-1)[differ[:3]]} instead of {expected.reshape(-1)[differ[:3]]}"
    )


def test_the_set_across_nodes_has_a_ring_and_only_large_sums_take_it(via_ring):
    assert routes_of(hvd.global_process_set).ring == tuple(range(N))
    hvd.allreduce(np.ones(1000, np.float32), op=hvd.Sum, name="ring.small")
    hvd.allreduce(np.ones(LARGE, np.float32), op=hvd.Max, name="ring.max")
    assert via_ring == []
    out = hvd.allreduce(values(R, LARGE, 1), op=hvd.Sum, name="ring.large")
    assert via_ring == [LARGE]
    assert_exact(out, ring_sum([values(r, LARGE, 1) for r in range(N)]))


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.int64])
def test_other_dtypes_alone(dtype, via_ring):
    count = RING_MIN_BYTES // np.dtype(dtype).itemsize + 7
    out = hvd.allreduce(values(R, count, 2, dtype), op=hvd.Sum, name=f"ring.{np.dtype(dtype)}")
    assert_exact(out, ring_sum([values(r, count, 2, dtype) for r in range(N)]))
    assert via_ring == [count]


def test_a_fused_group_of_small_and_large_tensors():
    sizes = (LARGE, 5, 200_000, 1)
    outs = hvd.grouped_allreduce(
        [values(R, s, 3 + i) for i, s in enumerate(sizes)], op=hvd.Sum, name="ring.group"
    )
    # the large tensor is summed where it is, the three small ones fused in one buffer
    assert_exact(outs[0], ring_sum([values(r, LARGE, 3) for r in range(N)]))
    fused = [
        np.concatenate([values(r, s, 3 + i) for i, s in enumerate(sizes) if i]) for r in range(N)
    ]
    expected = ring_sum(fused)
    for out, at, s in zip(outs[1:], offsets(sizes[1:]), sizes[1:]):
        assert_exact(out, expected[at : at + s])


def test_average_scaling_and_in_place():
    ints = [np.arange(LARGE, dtype=np.float32) % 97 + r for r in range(N)]
    total = sum(ints)  # exact: small integers
    out = hvd.allreduce(ints[R], op=hvd.Average, name="ring.avg")
    np.testing.assert_allclose(out, total / N, rtol=1e-6)
    out = hvd.allreduce(ints[R], op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    np.testing.assert_array_equal(out, total)
    x = ints[R].copy()
    out = hvd.allreduce(x, op=hvd.Sum, name="ring.inplace", output=x)
    assert out is x
    np.testing.assert_array_equal(x, total)


def test_a_joined_rank_contributes_zeros():
    if R == N - 1:
        hvd.join()
        return
    out = hvd.allreduce(values(R, LARGE, 4), op=hvd.Sum, name="ring.join")
    inputs = [values(r, LARGE, 4) if r < N - 1 else np.zeros(LARGE, np.float32) for r in range(N)]
    assert_exact(out, ring_sum(inputs))
    hvd.join()


def rows_per_rank(rows: int) -> list[int]:
    return even_split(rows, N)


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_a_reducescatter_is_the_rings_first_half(dtype, via_ring_scatter):
    rows, width = 2 * N + 1, RING_MIN_BYTES // (2 * N * np.dtype(dtype).itemsize) + 1
    inputs = [values(r, rows * width, 8, dtype) for r in range(N)]
    out = hvd.reducescatter(inputs[R].reshape(rows, width), op=hvd.Sum, name=f"ring.rs.{dtype}")
    counts = [n * width for n in rows_per_rank(rows)]
    at = offsets(counts)[R]
    expected = ring_sum(inputs, counts=counts)[at : at + counts[R]]
    assert_exact(out.reshape(-1), expected)
    assert out.shape == (rows_per_rank(rows)[R], width)
    assert via_ring_scatter == [1]


def test_a_grouped_reducescatter_averages_every_tensor(via_ring_scatter):
    shapes = [(3 * N, 70_000), (N + 1, 3), (2 * N - 1, 40_000)]
    tensors = [np.full(shape, float(R + 1 + i), np.float32) for i, shape in enumerate(shapes)]
    outs = hvd.grouped_reducescatter(tensors, op=hvd.Average, name="ring.rs.group")
    for i, (shape, out) in enumerate(zip(shapes, outs)):
        mean = sum(r + 1 + i for r in range(N)) / N
        assert out.shape == (rows_per_rank(shape[0])[R], shape[1])
        np.testing.assert_allclose(out, mean, rtol=1e-6)
    assert via_ring_scatter == [1]


def test_a_process_set_of_the_first_ranks_has_its_own_ring(via_ring):
    if N < 3:
        pytest.skip("needs a set smaller than the job")
    if not FIRST.included():
        return
    assert routes_of(FIRST).ring == tuple(range(N - 1))
    out = hvd.allreduce(values(R, LARGE, 5), op=hvd.Sum, name="ring.set", process_set=FIRST)
    assert_exact(out, ring_sum([values(r, LARGE, 5) for r in range(N - 1)]))
    assert via_ring == [LARGE]


@pytest.mark.parametrize("count", [0, 1, 2, 1001])
def test_a_ring_in_another_order_called_directly(count):
    comm = MPI.COMM_WORLD.Dup()
    try:
        order = [(2 * i + 1) % N for i in range(N)] if N % 2 else list(reversed(range(N)))
        ring = Ring(comm, order)
        x = values(R, count, 6)
        ring.allreduce(x)
        assert_exact(x, ring_sum([values(r, count, 6) for r in range(N)], order))
        # uneven blocks: the last rank's is the largest
        counts = [count // N + (r == N - 1) * (count % N) for r in range(N)]
        expected = ring_sum([values(r, count, 7) for r in range(N)], order, counts)
        y = values(R, count, 7)
        ring.reduce_scatter(y, counts)
        mine = slice(offsets(counts)[R], offsets(counts)[R] + counts[R])
        assert_exact(y[mine], expected[mine])
        ring.allgather(y, counts)
        assert_exact(y, expected)
    finally:
        comm.Free()


def test_a_ring_order_must_name_every_rank_once():
    with pytest.raises(ValueError, match="each of the"):
        Ring(MPI.COMM_WORLD, [0] * N)
