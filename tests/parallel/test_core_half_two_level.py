"""float16 and bfloat16 sums through the two levels: summed in float32 inside each
node, 16 bits across nodes (hvdlite/engine/transports/half_two_level.py).

Runs with hierarchical allreduce on, as simulated nodes of two consecutive ranks
(HVDLITE_TEST_NODE_SIZE=2): at 4 ranks two nodes of 2 (a shard per local rank),
at 3 ranks nodes of 2 + 1 (the leaders carry the whole batch), at 2 ranks one
node, where nothing crosses and float16 reduces in a float32 copy.  Every rank
rebuilds every rank's input from a seeded generator and replays the documented
rule in numpy: each node's values scaled and summed in float32 in rank order and
rounded to 16 bits; the node partials summed in float32 in node order, scaled
by the postscale and rounded again.  The path must return exactly those bits:
alone, summed and averaged, scaled, fused and grouped, with a rank that has
joined, and from torch's Compression.fp16 and bf16.  And the values that cross
between nodes travel as 2 bytes each, one node partial per node.  Reduce-scatters
follow the same rule on nodes of one size (4 ranks), and round once where the flat
16-bit wire takes them (3 ranks: nodes of 2 and 1).
"""

import math
import os

import numpy as np
import pytest

os.environ["HVDLITE_TEST_NODE_SIZE"] = "2"  # knobs read by init(), hence at import
os.environ["HVDLITE_HIERARCHICAL_ALLREDUCE"] = "1"

from core_helpers import assert_bits, rows_of, spy_on
from core_helpers import half_values as values

import hvdlite as hvd  # noqa: E402
from hvdlite.engine.runtime import routes_of, state  # noqa: E402
from hvdlite.engine.transports.half_two_level import HalfTwoLevelPeer  # noqa: E402
from hvdlite.engine.transports.half_wire import HALF_WIRE_MIN_BYTES  # noqa: E402
from hvdlite.engine.transports.hierarchical import Hierarchical  # noqa: E402
from hvdlite.util.dtypes import BFLOAT16  # noqa: E402
from hvdlite.util.paths import Transport  # noqa: E402
from hvdlite.util.splits import offsets  # noqa: E402

MPI_SIZES = (2, 3, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "2", "HVDLITE_HIERARCHICAL_ALLREDUCE": "1"}

pytestmark = pytest.mark.timeout(150)

hvd.init()
R, N = hvd.rank(), hvd.size()
NODES = [tuple(range(first, min(first + 2, N))) for first in range(0, N, 2)]
ACROSS = len(NODES) > 1  # the set spans nodes: 16 bits cross between them
LARGE = HALF_WIRE_MIN_BYTES // 4 + 1001  # float32 bytes over the path's threshold
HALVES = [np.float16, BFLOAT16]
HALF_IDS = ["float16", "bfloat16"]


@pytest.fixture
def two_level(monkeypatch):
    """The element counts of the batches this rank reduced in two levels."""
    return spy_on(
        monkeypatch, HalfTwoLevelPeer, "reduce", lambda p0, tensors, *rest: tensors.total()
    )


def everyone(count, seed, half=np.float16, ranks=None) -> list:
    return [
        values(r, count, seed, half) if ranks is None or r in ranks else np.zeros(count, half)
        for r in range(N)
    ]


def _sum32(terms):
    total = terms[0].astype(np.float32)
    for term in terms[1:]:
        total = total + term.astype(np.float32)
    return total


def rounded_once(inputs, pre=1.0, post=1.0) -> np.ndarray:
    """The inputs scaled and summed in float32 in rank order, scaled again, rounded once."""
    half, pre, post = inputs[0].dtype, np.float32(pre), np.float32(post)
    return (_sum32([x.astype(np.float32) * pre for x in inputs]) * post).astype(half)


def node_by_node(inputs, pre=1.0, post=1.0) -> np.ndarray:
    """The documented rule: a 16-bit partial sum per node, then the total of the
    node partials rounded again (on one node: the float32 sum rounded once)."""
    if not ACROSS:
        return rounded_once(inputs, pre, post)
    half, pre, post = inputs[0].dtype, np.float32(pre), np.float32(post)
    partials = [
        _sum32([inputs[r].astype(np.float32) * pre for r in node]).astype(half) for node in NODES
    ]
    return (_sum32(partials) * post).astype(half)


def test_large_halves_take_the_two_levels_where_the_job_spans_nodes(two_level):
    routes = routes_of(hvd.global_process_set)
    assert routes.allreduce is Transport.HIERARCHICAL
    assert (routes.half_allreduce is Transport.HALF_WIRE) == ACROSS
    small = everyone(1000, 1)
    out = hvd.allreduce(small[R], op=hvd.Sum, name="two.small")
    assert_bits(out, _sum32(small).astype(np.float16))  # a float32 copy: rounded once
    inputs = everyone(LARGE, 1)
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="two.large")
    assert two_level == ([LARGE] if ACROSS else [])
    assert_bits(out, node_by_node(inputs))


@pytest.mark.parametrize("half", HALVES, ids=HALF_IDS)
@pytest.mark.parametrize("count", [LARGE, 600_001], ids=["small-shards", "large"])
def test_sum_and_average(count, half, two_level):
    tag = f"{count}.{np.dtype(half).name}"
    inputs = everyone(count, 2, half)
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name=f"two.sum.{tag}")
    assert out.dtype == np.dtype(half)
    assert_bits(out, node_by_node(inputs))
    inputs = everyone(count, 3, half)
    out = hvd.allreduce(inputs[R], op=hvd.Average, name=f"two.avg.{tag}")
    assert_bits(out, node_by_node(inputs, post=1.0 / N))
    assert two_level == ([count, count] if ACROSS else [])


@pytest.mark.parametrize("half", HALVES, ids=HALF_IDS)
def test_scale_factors_apply_in_float32(half):
    inputs = everyone(LARGE, 4, half)
    out = hvd.allreduce(
        inputs[R], op=hvd.Sum, prescale_factor=0.3, postscale_factor=1.7, name=f"two.sc.{half}"
    )
    assert_bits(out, node_by_node(inputs, pre=0.3, post=1.7))


def test_a_grouped_call_is_one_batch(two_level):
    counts = (30_000, 7, 2)
    inputs = [everyone(n, 20 + k) for k, n in enumerate(counts)]
    outs = hvd.grouped_allreduce([x[R] for x in inputs], op=hvd.Sum, name="two.group")
    fused = node_by_node([np.concatenate([x[r] for x in inputs]) for r in range(N)])
    for out, at, n in zip(outs, offsets(counts), counts, strict=True):
        assert_bits(out, fused[at : at + n])
    assert two_level == ([sum(counts)] if ACROSS else [])


def test_fused_tensors_keep_their_own_scale_factors():
    inputs = [everyone(LARGE, 10 + k, BFLOAT16) for k in range(2)]
    handles = [
        hvd.allreduce_async(x[R], op=hvd.Sum, prescale_factor=f, name=f"two.fused.{k}")
        for k, (x, f) in enumerate(zip(inputs, (0.5, 3.0)))
    ]
    for x, f, h in zip(inputs, (0.5, 3.0), handles):
        assert_bits(hvd.synchronize(h), node_by_node(x, pre=f))


def test_in_place_output_and_the_input_left_alone():
    inputs = everyone(LARGE, 30)
    x = inputs[R].copy()
    assert hvd.allreduce(x, op=hvd.Sum, name="two.inplace", output=x) is x
    assert_bits(x, node_by_node(inputs))
    y = inputs[R].copy()
    hvd.allreduce(y, op=hvd.Sum, name="two.input")
    assert_bits(y, inputs[R])


def test_a_joined_rank_contributes_zeros():
    if R == N - 1:
        hvd.join()
        return
    inputs = everyone(LARGE, 40, ranks=range(N - 1))
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="two.join")
    assert_bits(out, node_by_node(inputs))
    hvd.join()


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_torch_compression(kind, two_level):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    half = np.float16 if kind == "fp16" else BFLOAT16
    inputs = everyone(LARGE, 51, half)
    grad = torch.from_numpy(inputs[R].astype(np.float32))
    out = hvd_torch.allreduce(
        grad,
        op=hvd_torch.Average,
        compression=getattr(hvd_torch.Compression, kind),
        name=f"two.{kind}",
    )
    assert out.dtype == torch.float32
    expected = node_by_node(inputs, post=1.0 / N)
    assert np.array_equal(out.numpy(), expected.astype(np.float32))
    assert two_level == ([LARGE] if ACROSS else [])


def test_two_bytes_per_value_cross_between_nodes_once_per_node():
    if not ACROSS:
        pytest.skip("one node: nothing crosses")
    peer = next(p for p in state().engine.executor._lineup_of(0) if isinstance(p, HalfTwoLevelPeer))
    before = dict(peer.received_across)
    count = 200_001
    inputs = everyone(count, 60)
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="two.bytes")
    assert_bits(out, node_by_node(inputs))
    got = {k: peer.received_across[k] - before[k] for k in before}
    per_rank = hvd.allgather_object(got)
    values = sum(g["values"] for g in per_rank)
    received = sum(g["bytes"] for g in per_rank)
    # every node receives the other nodes' share of its part, then the other parts:
    # 2 (nodes - 1) / nodes of the batch, whatever its ranks per node
    assert values == 2 * (len(NODES) - 1) * count
    assert received == 2 * values  # 16 bits each, not float32's 4 bytes


@pytest.mark.parametrize("half", HALVES, ids=HALF_IDS)
def test_large_batches_cross_the_nodes_in_pieces(half, monkeypatch):
    """Shards of twice PIECE_MIN_BYTES or more: the batch is cut into pieces (each
    local rank's shard of a piece at least PIECE_MIN_BYTES) that cross the nodes one
    after another, the in-node exchanges beside them, with the bits of one piece: scaled, averaged,
    in place, and fused from two tensors."""
    from hvdlite.engine.transports.half_two_level import PIECE_MIN_BYTES
    from hvdlite.engine.transports.hierarchical import PIPELINE_PIECES

    crossings = spy_on(monkeypatch, HalfTwoLevelPeer, "_across_nodes", lambda t, shard, *r: shard)
    count = 3 * PIECE_MIN_BYTES + 1001  # 3 x the least shard per local rank, uneven
    inputs = everyone(count, 70, half)
    x = inputs[R].copy()
    out = hvd.allreduce(x, op=hvd.Average, prescale_factor=0.3, output=x, name=f"two.pieces.{half}")
    assert out is x
    assert_bits(x, node_by_node(inputs, pre=0.3, post=1.0 / N))
    if not ACROSS:
        assert crossings == []
    elif N % 2 == 0:  # nodes of one size: 3 pieces
        assert len(crossings) == 3 <= PIPELINE_PIECES
        assert min(s.nbytes for s in crossings) >= PIECE_MIN_BYTES
    else:  # nodes of 2 and 1: one piece, which the leaders carry across
        assert len(crossings) == (1 if R % 2 == 0 else 0)
    crossings.clear()
    a, b = everyone(count // 2, 71, half), everyone(count - count // 2 + 5, 72, half)
    handles = [
        hvd.allreduce_async(t[R], op=hvd.Sum, prescale_factor=f, name=f"two.pieces.{k}.{half}")
        for k, (t, f) in enumerate(((a, 0.5), (b, 2.0)))
    ]
    for t, f, h in zip((a, b), (0.5, 2.0), handles, strict=True):
        assert_bits(hvd.synchronize(h), node_by_node(t, pre=f))


# ------------------------------------------------------------- reduce-scatters
#: Reduce-scatters go in two levels on nodes of one size only (at 3 ranks the flat
#: 16-bit wire rounds them once; at 2 ranks, one node, a float32 copy does).
SCATTERS_IN_TWO_LEVELS = ACROSS and N % 2 == 0


def scatter_rule(inputs, pre=1.0, post=1.0) -> np.ndarray:
    """The sums a reduce-scatter returns, before cutting: node by node in two
    levels, else rounded once."""
    if SCATTERS_IN_TWO_LEVELS:
        return node_by_node(inputs, pre, post)
    return rounded_once(inputs, pre, post)


def rows_of_mine(full: np.ndarray) -> np.ndarray:
    return rows_of(full, R, N)


def assert_scattered(out: np.ndarray, expected: np.ndarray) -> None:
    """The 16-bit paths' bits; on one node (a float32 copy, scaled its own way) close."""
    if ACROSS:
        assert_bits(out, expected)
    else:
        wide = expected.astype(np.float32)
        atol = 0.01 * float(np.abs(wide).max())  # a 16-bit ulp or two of the largest
        np.testing.assert_allclose(out.astype(np.float32), wide, rtol=0, atol=atol)


@pytest.mark.parametrize("half", HALVES, ids=HALF_IDS)
def test_reduce_scatters_of_halves_in_two_levels(half, monkeypatch):
    peers = spy_on(
        monkeypatch, HalfTwoLevelPeer, "_scattered_part", lambda comm, tensors, h: len(tensors)
    )
    tag = np.dtype(half).name
    shape = (2 * N + 1, 7_001)
    inputs = [x.reshape(shape) for x in everyone(math.prod(shape), 120, half)]
    out = hvd.reducescatter(inputs[R], op=hvd.Sum, name=f"two.rs.sum.{tag}")
    assert out.dtype == np.dtype(half)
    assert_scattered(out, rows_of_mine(scatter_rule(inputs)))
    out = hvd.reducescatter(
        inputs[R], op=hvd.Average, prescale_factor=0.3, name=f"two.rs.avg.{tag}"
    )
    assert_scattered(out, rows_of_mine(scatter_rule(inputs, pre=0.3, post=1.0 / N)))
    # two tensors with their own factors, fused into one batch
    shapes = [(N + 1, 3, 2_000), (3 * N + 2, 5_000)]
    groups = [
        [x.reshape(s) for x in everyone(math.prod(s), 130 + k, half)] for k, s in enumerate(shapes)
    ]
    handles = [
        hvd.reducescatter_async(
            g[R], op=hvd.Sum, prescale_factor=f, postscale_factor=1.5, name=f"two.rs.{k}.{tag}"
        )
        for k, (g, f) in enumerate(zip(groups, (0.5, 3.0)))
    ]
    for g, f, h in zip(groups, (0.5, 3.0), handles, strict=True):
        assert_scattered(hvd.synchronize(h), rows_of_mine(scatter_rule(g, pre=f, post=1.5)))
    assert sum(peers) == (4 if SCATTERS_IN_TWO_LEVELS else 0)  # tensors, fused or not


def test_a_reduce_scatter_crosses_between_nodes_once_per_node_as_16_bits():
    if not SCATTERS_IN_TWO_LEVELS:
        pytest.skip("reduce-scatters go in two levels on several nodes of one size")
    peer = next(p for p in state().engine.executor._lineup_of(0) if isinstance(p, HalfTwoLevelPeer))
    before = dict(peer.received_across)
    shape = (4 * N, 10_000)
    inputs = [x.reshape(shape) for x in everyone(math.prod(shape), 140)]
    out = hvd.reducescatter(inputs[R], op=hvd.Sum, name="two.rs.bytes")
    assert_bits(out, rows_of_mine(scatter_rule(inputs)))
    got = {k: peer.received_across[k] - before[k] for k in before}
    per_rank = hvd.allgather_object(got)
    # each rank receives its part from every other node: (nodes - 1) / N of the batch
    assert sum(g["values"] for g in per_rank) == (len(NODES) - 1) * math.prod(shape)
    assert sum(g["bytes"] for g in per_rank) == 2 * sum(g["values"] for g in per_rank)


@pytest.mark.parametrize("half", HALVES, ids=HALF_IDS)
def test_large_reduce_scatters_cross_the_nodes_in_pieces(half, monkeypatch):
    """Batches whose local shares hold twice SCATTER_PIECE_MIN_BYTES or more are
    cut into pieces that cross the nodes one after another, the next piece's in-node
    exchange beside them, with the bits of one piece: rows that do not divide
    evenly, and two fused tensors with their own factors whose pieces run across
    both."""
    from hvdlite.engine.transports.hierarchical import SCATTER_PIECE_MIN_BYTES

    pieces = spy_on(monkeypatch, Hierarchical, "scatter_pieces", lambda counts, n: n)
    tag = np.dtype(half).name
    cols = 1_001
    rows = (3 * SCATTER_PIECE_MIN_BYTES) // cols + N + 2  # 3 x the least share of 2 ranks
    inputs = [x.reshape(rows, cols) for x in everyone(rows * cols, 150, half)]
    out = hvd.reducescatter(
        inputs[R], op=hvd.Average, prescale_factor=0.3, name=f"two.rs.pieces.{tag}"
    )
    assert_scattered(out, rows_of_mine(scatter_rule(inputs, pre=0.3, post=1.0 / N)))
    assert pieces == ([3] if SCATTERS_IN_TWO_LEVELS else [])  # the 16-bit peer's cut
    pieces.clear()
    shapes = [(rows // 2, cols), (rows - rows // 2 + 1, 3, cols // 3)]
    groups = [
        [x.reshape(s) for x in everyone(math.prod(s), 160 + k, half)] for k, s in enumerate(shapes)
    ]
    handles = [
        hvd.reducescatter_async(
            g[R], op=hvd.Sum, prescale_factor=f, postscale_factor=p, name=f"two.rs.p{k}.{tag}"
        )
        for k, (g, f, p) in enumerate(zip(groups, (0.5, 3.0), (1.5, 0.25)))
    ]
    for g, f, p, h in zip(groups, (0.5, 3.0), (1.5, 0.25), handles, strict=True):
        assert_scattered(hvd.synchronize(h), rows_of_mine(scatter_rule(g, pre=f, post=p)))
    if SCATTERS_IN_TWO_LEVELS:
        assert sum(pieces) >= 3  # fused in one batch or not, every block was cut
