"""Hierarchical allreduce/allgather give the flat collectives' results.

Runs as simulated nodes of two consecutive ranks (HVDLITE_TEST_NODE_SIZE=2):
at 4 ranks two nodes of 2 (reduce-scatter scheme), at 3 ranks nodes of 2 + 1
(per-node leader scheme).  The references are plain mpi4py collectives on
COMM_WORLD.  The knobs must be set before init(), hence at import.
"""

import os

os.environ["HVDLITE_HIERARCHICAL_ALLREDUCE"] = "1"
os.environ["HVDLITE_HIERARCHICAL_ALLGATHER"] = "1"
os.environ["HVDLITE_TEST_NODE_SIZE"] = "2"

from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite  # noqa: E402
from hvdlite.engine.runtime import state  # noqa: E402
from hvdlite.engine.transports.hierarchical import Hierarchical  # noqa: E402
from hvdlite.engine.transports.routes import Router, Transport  # noqa: E402
from hvdlite.util.dtypes import BFLOAT16  # noqa: E402
from hvdlite.util.splits import offsets  # noqa: E402

MPI_SIZES = (3, 4)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


@pytest.fixture(scope="module", autouse=True)
def hvd():
    hvdlite.init()
    yield hvdlite
    hvdlite.shutdown()


@pytest.fixture(scope="module")
def helper():
    """The engine's own helper (used only through hvdlite's collectives)."""
    return state().engine.executor.hierarchical


def _topology(kind: str):
    """A private helper over duplicated communicators describing *kind* of nodes."""
    st = state()
    if kind == "configured":
        local = st.local_comm.Dup()
    elif kind == "uneven":  # the first SIZE-1 ranks share a node, the last is alone
        local = WORLD.Split(int(RANK == SIZE - 1), RANK)
    elif kind == "one-node":
        local = WORLD.Dup()
    else:  # "singletons": one rank per node
        local = WORLD.Split(RANK, RANK)
    cross = WORLD.Split(local.Get_rank(), RANK)
    homogeneous = len(set(WORLD.allgather(local.Get_size()))) == 1
    cfg = SimpleNamespace(hierarchical_allreduce=True, hierarchical_allgather=True)
    fake = SimpleNamespace(
        world=WORLD, local_comm=local, cross_comm=cross, homogeneous=homogeneous, config=cfg
    )
    return Hierarchical.create(fake), (local, cross)


@pytest.fixture(scope="module", params=["configured", "uneven", "one-node", "singletons"])
def private(request):
    h, comms = _topology(request.param)
    yield h
    for c in comms:
        c.Free()


def _data(dtype, n, salt=0):
    rng = np.random.default_rng(1000 * RANK + 17 * n + salt)
    if np.dtype(dtype).kind == "f" or dtype == BFLOAT16:
        return rng.standard_normal(n).astype(np.float32).astype(dtype)
    return rng.integers(-50, 50, n).astype(dtype)


def _flat(x, op=MPI.SUM):
    out = np.empty_like(x)
    WORLD.Allreduce(x, out, op)
    return out


def _same(got, want):
    if np.dtype(want.dtype).kind == "f":
        tol = 1e-5 if want.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(got, want)


# -------------------------------------------------------------------- topology
def test_simulated_nodes(helper):
    assert hvdlite.local_size() == (1 if SIZE == 3 and RANK == 2 else 2)
    assert hvdlite.local_rank() == RANK % 2
    assert hvdlite.is_homogeneous() == (SIZE == 4)
    assert helper is not None and helper.allgather_enabled
    assert helper.nodes == ([(0, 1), (2, 3)] if SIZE == 4 else [(0, 1), (2,)])
    # The global set takes the two-level paths (the plan that the executor follows).
    plan = state().router.routes(range(SIZE))
    assert plan.allreduce is Transport.HIERARCHICAL
    assert plan.allgather is Transport.HIERARCHICAL
    assert plan.reducescatter is Transport.HIERARCHICAL  # taken where nodes are even
    assert helper.scatters_in_two_levels == (SIZE == 4)


def test_other_sets_run_flat(helper):
    pair = state().router.routes([r for r in range(SIZE) if r // 2 == RANK // 2])
    assert pair.allreduce is not Transport.HIERARCHICAL
    assert pair.allgather is not Transport.HIERARCHICAL
    assert pair.reducescatter is not Transport.HIERARCHICAL


def test_each_collective_has_its_own_switch():
    st = state()
    only_gather = SimpleNamespace(hierarchical_allreduce=False, hierarchical_allgather=True)
    fake = SimpleNamespace(
        world=WORLD,
        local_comm=st.local_comm,
        cross_comm=st.cross_comm,
        homogeneous=st.homogeneous,
        config=only_gather,
    )
    h = Hierarchical.create(fake)
    assert h.allgather_enabled and not h.allreduce_enabled
    plan = Router(
        SIZE,
        st.node_ranks,
        shared_memory=True,
        hierarchical_allreduce=False,
        hierarchical_allgather=True,
    ).routes(range(SIZE))
    assert plan.allgather is Transport.HIERARCHICAL
    assert plan.allreduce is not Transport.HIERARCHICAL


# ------------------------------------------------- the algorithms, called directly
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64, np.uint8])
def test_allreduce_sum_uneven_lengths(private, dtype):
    for n in (1, 2, 3, 7, 1001):
        x = _data(dtype, n)
        want = _flat(x)
        got = x.copy()
        private.allreduce(got, MPI.SUM)  # in place
        _same(got, want)
        got = np.zeros_like(x)
        private.allreduce(got, MPI.SUM, src=x)  # from a separate input, left unchanged
        _same(got, want)
        np.testing.assert_array_equal(x, _data(dtype, n))


@pytest.mark.parametrize("dtype", [np.int32, np.float64])
def test_large_sums_cross_nodes_around_the_ring(private, dtype, monkeypatch):
    from hvdlite.engine.transports.ring import RING_MIN_BYTES, Ring

    rings = []
    real = Ring.allreduce
    monkeypatch.setattr(
        Ring, "allreduce", lambda self, buf: (rings.append(buf.size), real(self, buf))
    )
    n = 2 * RING_MIN_BYTES // np.dtype(dtype).itemsize + 3  # a shard of 1 MB or more
    x = _data(dtype, n, salt=5)
    want = _flat(x)
    got = np.zeros_like(x)
    private.allreduce(got, MPI.SUM, src=x)
    _same(got, want)
    # with more than one node, the ranks that take part in the cross stage (every
    # rank, or the node leaders where node sizes differ) sum it around the ring
    crosses = len(private.nodes) > 1 and (private.homogeneous or private.is_leader)
    assert bool(rings) == crosses
    rings.clear()
    private.allreduce(x.copy(), MPI.MAX)  # other ops: MPI
    assert rings == []


@pytest.mark.parametrize("dtype, megabytes", [(np.int32, 5), (np.float64, 19)])
def test_large_sums_cross_the_nodes_in_pieces(private, dtype, megabytes, monkeypatch):
    """Large sums: the buffer is cut into pieces (at most PIPELINE_PIECES, each shard
    at least about PIECE_MIN_BYTES) that cross the nodes one after another, in-node
    stages between; 19 MB of float64 hits the most pieces, 5 MB of int32 does not."""
    from hvdlite.engine.transports.hierarchical import PIECE_MIN_BYTES, PIPELINE_PIECES
    from hvdlite.engine.transports.ring import RING_MIN_BYTES, Ring

    rings = []
    real = Ring.allreduce
    monkeypatch.setattr(
        Ring, "allreduce", lambda self, buf: (rings.append(buf.nbytes), real(self, buf))
    )
    n = megabytes * RING_MIN_BYTES // np.dtype(dtype).itemsize + 7  # uneven pieces
    x = _data(dtype, n, salt=9)
    want = _flat(x)
    got = x.copy()
    private.allreduce(got, MPI.SUM)  # in place: pieces are read and written in turn
    _same(got, want)
    y = np.zeros_like(x)
    private.allreduce(y, MPI.SUM, src=x)  # and from a separate input, left unchanged
    _same(y, want)
    np.testing.assert_array_equal(x, _data(dtype, n, salt=9))
    two_levels = private.homogeneous and len(private.nodes) > 1 and private.local_size > 1
    if two_levels:
        pieces = min(PIPELINE_PIECES, x.nbytes // (private.local_size * PIECE_MIN_BYTES))
        assert pieces > 1 and len(rings) == 2 * pieces
        assert min(rings) >= PIECE_MIN_BYTES - 8 * private.local_size
        # this rank's shards of one call's pieces cover its share of the buffer
        assert abs(sum(rings[:pieces]) - x.nbytes / private.local_size) <= pieces * x.itemsize
    else:
        assert len(rings) <= 2  # one piece: a cross stage of its own, or MPI's


@pytest.mark.parametrize("op", [MPI.SUM, MPI.MAX])
@pytest.mark.parametrize(
    "elements, pieces", [(3, 1), (700_001, 1), (5, 3), (700_001, 4)]
)  # MPI across nodes; the ring; in pieces, a piece with nothing of some blocks
def test_reduce_scatter_in_two_levels(private, op, elements, pieces):
    """Every world rank's block, cut into pieces laid out as scatter_pieces says,
    reduced over the job: this rank gets its own block's total, whichever way it
    crossed the nodes and in however many pieces."""
    if not private.scatters_in_two_levels:
        assert not (private.homogeneous and len(private.nodes) > 1 and private.local_size > 1)
        return
    counts = [elements + r % 3 for r in range(SIZE)]  # uneven blocks
    blocks = [_data(np.int64, counts[r], salt=40 + r) for r in range(SIZE)]  # this rank's
    plan = private.scatter_pieces(counts, pieces)
    assert plan.places[0] == private.scatter_starts([c[0] for c in plan.cuts])
    unset = np.iinfo(np.int64).min
    buf = np.full(sum(counts), unset, np.int64)
    for r, block in enumerate(blocks):
        for at, n, lo in zip(plan.places, plan.cuts[r], offsets(plan.cuts[r]), strict=True):
            buf[at[r] : at[r] + n] = block[lo : lo + n]
    assert (buf != unset).all()  # the places tile the buffer
    before = private.calls["reducescatter"]
    got = private.reduce_scatter(buf, plan, op)
    want = np.empty(counts[RANK], np.int64)
    sent = np.concatenate(blocks)
    WORLD.Reduce_scatter(sent, want, counts, op)
    np.testing.assert_array_equal(got, want)
    assert private.calls["reducescatter"] == before + 1


def test_large_reduce_scatters_go_in_pieces(helper, monkeypatch):
    """hvdlite's reducescatter of a batch whose local shares hold twice
    SCATTER_PIECE_MIN_BYTES or more goes through the two levels in pieces: MPI's
    results for one tensor, and for two fused ones with a prescale."""
    from hvdlite.engine.transports.hierarchical import SCATTER_PIECE_MIN_BYTES

    pieces = []
    real = Hierarchical._reduce_scatter_in_pieces
    monkeypatch.setattr(
        Hierarchical,
        "_reduce_scatter_in_pieces",
        lambda self, buf, plan, op: (pieces.append(len(plan.layouts)), real(self, buf, plan, op))[
            1
        ],
    )
    x = _data(np.int64, 6 * SCATTER_PIECE_MIN_BYTES // 8 + 11, salt=60).reshape(-1, 1)
    got = hvdlite.reducescatter(x, op=hvdlite.Sum, name="scatter.pieces")
    np.testing.assert_array_equal(got, _flat_reducescatter(x))
    assert pieces == ([3] if helper.scatters_in_two_levels else [])  # 6 x the least / 2
    a = _data(np.float64, x.size // 2, salt=61).reshape(-1, 1)
    b = _data(np.float64, 5 * (x.size // 2 + 3), salt=62).reshape(-1, 5)
    got = hvdlite.grouped_reducescatter(
        [a, b], op=hvdlite.Sum, prescale_factor=0.5, name="scatter.fused"
    )
    _same(got[0], _flat_reducescatter(a * 0.5))
    _same(got[1], _flat_reducescatter(b * 0.5))


@pytest.mark.parametrize("op", [MPI.MIN, MPI.MAX, MPI.PROD])
def test_allreduce_other_ops_exact(private, op):
    x = _data(np.int64, 37) % 5 + 1
    got = x.copy()
    private.allreduce(got, op)
    np.testing.assert_array_equal(got, _flat(x, op))


def test_allgatherv_any_layout(private):
    counts = [(3 * r + 1) % 4 for r in range(SIZE)]  # ranks with zero bytes included
    send = np.full(counts[RANK], RANK + 1, dtype=np.uint8)
    # contiguous displacements in rank order, then a reversed, gapped layout
    layouts = [np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()]
    acc, rev = 0, [0] * SIZE
    for r in reversed(range(SIZE)):
        rev[r] = acc
        acc += counts[r] + 2
    layouts.append(rev)
    for displs in layouts:
        total = max(d + c for d, c in zip(displs, counts, strict=True))
        want = np.zeros(total, np.uint8)
        WORLD.Allgatherv([send, MPI.BYTE], [want, (counts, displs), MPI.BYTE])
        got = np.zeros(total, np.uint8)
        private.allgatherv(send, got, counts, displs)
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------- through the engine
@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.float64, np.float16, BFLOAT16])
def test_single_tensor_allreduce(helper, dtype):
    before = helper.calls["allreduce"]
    for n in (1, 5, 4099):
        x = _data(dtype, n, salt=1)
        got = hvdlite.allreduce(x, op=hvdlite.Sum, name=f"single.{np.dtype(dtype)}.{n}")
        half = dtype in (np.float16, BFLOAT16)
        wire = np.float32 if half else dtype
        want = _flat(x.astype(wire)).astype(dtype)
        if half:  # summed in float32 in another order: within a rounding
            np.testing.assert_allclose(
                got.astype(np.float32), want.astype(np.float32), rtol=8e-3, atol=8e-3
            )
        else:
            _same(got, want)
    assert helper.calls["allreduce"] == before + 3


def test_single_tensor_scaled_and_in_place(helper):
    x = _data(np.float64, 33, salt=2).reshape(3, 11)
    got = hvdlite.allreduce(
        x, op=hvdlite.Average, prescale_factor=2.0, postscale_factor=0.5, name="single.scaled"
    )
    _same(got, _flat(x) / SIZE)
    y = _data(np.int64, 10, salt=3)
    want = _flat(y)
    hvdlite.synchronize(hvdlite.allreduce_async(y, op=hvdlite.Sum, name="single.inplace", output=y))
    np.testing.assert_array_equal(y, want)


def test_fused_allreduce(helper):
    before = helper.calls["allreduce"]
    tensors = [_data(np.float32, n, salt=4) for n in (1, 3, 1000, 17)]
    got = hvdlite.grouped_allreduce(tensors, op=hvdlite.Sum, name="fused.f32")
    for g, t in zip(got, tensors, strict=True):
        _same(g, _flat(t))
    ints = [_data(np.int32, n, salt=5).reshape(-1, 1) for n in (2, 9)]
    got = hvdlite.grouped_allreduce(ints, op=hvdlite.Max, name="fused.i32")
    for g, t in zip(got, ints, strict=True):
        np.testing.assert_array_equal(g, _flat(t, MPI.MAX))
    assert helper.calls["allreduce"] == before + 2


def _flat_allgather(x):
    return np.concatenate(WORLD.allgather(x), axis=0)


def test_allgather_uneven_dim0(helper):
    before = helper.calls["allgather"]
    rows = (2 * RANK) % 3  # 0, 2, 1, 0: some ranks contribute no rows
    x = np.arange(rows * 3, dtype=np.int32).reshape(rows, 3) + 100 * RANK
    np.testing.assert_array_equal(hvdlite.allgather(x, name="gather.single"), _flat_allgather(x))
    y = _data(np.float64, RANK + 1, salt=6)
    got = hvdlite.grouped_allgather([x, y], name="gather.grouped")
    np.testing.assert_array_equal(got[0], _flat_allgather(x))
    np.testing.assert_array_equal(got[1], _flat_allgather(y))
    assert helper.calls["allgather"] == before + 2


def test_reducescatter_through_the_two_levels(helper):
    """hvdlite's reducescatter on the whole job: through the two levels on nodes of
    one size (4 ranks), flat otherwise (3); the results of MPI's reduce-scatter, for
    one tensor, a grouped call of two dtypes with uneven rows, and Average."""
    before = helper.calls["reducescatter"]
    x = _data(np.float64, 6 * 1000, salt=50).reshape(6, 1000)  # rows uneven over 4 ranks
    got = hvdlite.reducescatter(x, op=hvdlite.Sum, name="scatter.single")
    _same(got, _flat_reducescatter(x))
    y = _data(np.int32, 7 * 3, salt=51).reshape(7, 3)
    got = hvdlite.grouped_reducescatter([x, y], op=hvdlite.Sum, name="scatter.grouped")
    _same(got[0], _flat_reducescatter(x))
    np.testing.assert_array_equal(got[1], _flat_reducescatter(y))
    got = hvdlite.reducescatter(x, op=hvdlite.Average, name="scatter.average")
    _same(got, _flat_reducescatter(x) / SIZE)
    two_levels = helper.scatters_in_two_levels
    assert helper.calls["reducescatter"] == before + (4 if two_levels else 0)


def _flat_reducescatter(x):
    """This rank's rows of the sum of every rank's *x* (Horovod's split: the first
    ranks take one row more)."""
    total = _flat(x)
    rows = [x.shape[0] // SIZE + (r < x.shape[0] % SIZE) for r in range(SIZE)]
    at = sum(rows[:RANK])
    return total[at : at + rows[RANK]]
