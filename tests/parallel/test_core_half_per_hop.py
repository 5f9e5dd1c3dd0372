"""float16 partial sums around the ring, rounded at every hop, where the job asks
(HVDLITE_HALF_SUMS_PER_HOP=1; hvdlite/engine/transports/half_wire.py).

Runs as simulated nodes of one rank each (HVDLITE_TEST_NODE_SIZE=1), so every set of
two or more ranks spans nodes and has a ring.  Every rank rebuilds every rank's
input from a seeded generator and replays the ring: each block's partial sum
starts at the position after its owner, and each later position widens it, adds
its own scaled value in float32 and rounds to float16.  The path must return
exactly those bits, at 2, 3 and 4 ranks: alone, summed and averaged, scaled,
fused and grouped, with a rank that has joined, from torch's Compression.fp16, on
a process set, and around a ring in another order.  At 2 ranks one hop is one
rounding, so the sums are the rounded-once sums; at 3 and 4 they differ from them.
"""

import os

import numpy as np
import pytest

os.environ["HVDLITE_TEST_NODE_SIZE"] = "1"  # knobs read by init(), hence at import
os.environ["HVDLITE_HALF_SUMS_PER_HOP"] = "1"

from core_helpers import assert_bits, init_with_a_set_of_the_first_ranks, spy_on
from core_helpers import half_values as values

import hvdlite as hvd  # noqa: E402
from mpi4py import MPI  # noqa: E402

from hvdlite.engine.runtime import routes_of  # noqa: E402
from hvdlite.engine.transports.half_wire import HALF_WIRE_MIN_BYTES, HalfWirePeer  # noqa: E402
from hvdlite.engine.transports.ring import Ring  # noqa: E402
from hvdlite.util.dtypes import BFLOAT16  # noqa: E402
from hvdlite.util.splits import even_split, offsets  # noqa: E402

MPI_SIZES = (2, 3, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "1", "HVDLITE_HALF_SUMS_PER_HOP": "1"}

pytestmark = pytest.mark.timeout(120)

FIRST = init_with_a_set_of_the_first_ranks()  # all ranks but the last
R, N = hvd.rank(), hvd.size()
LARGE = HALF_WIRE_MIN_BYTES // 4 + 1001  # float32 bytes over the path's threshold


@pytest.fixture
def per_hop(monkeypatch):
    """The element counts of the batches this rank reduced with per-hop sums."""
    return spy_on(
        monkeypatch, HalfWirePeer, "_part_per_hop", lambda comm, tensors, *rest: tensors.total()
    )


def hop_by_hop(inputs, pre=1.0, post=1.0, order=None) -> np.ndarray:
    """What the ring computes from *inputs* (one float16 array per rank): each block's
    partial sum starts with the value of the position after its owner (scaled,
    rounded), and every later position adds its scaled value in float32 and rounds;
    the owner scales by *post* before its rounding."""
    n, half = len(inputs), inputs[0].dtype  # float16 or bfloat16
    order = list(range(n)) if order is None else list(order)
    counts = even_split(inputs[0].size, n)
    out = np.empty_like(inputs[0])
    pre, post = np.float32(pre), np.float32(post)
    for at, count, owner in zip(offsets(counts), counts, range(n)):
        block = slice(at, at + count)
        q = order.index(owner)
        acc = (inputs[order[(q + 1) % n]][block].astype(np.float32) * pre).astype(half)
        for k in range(2, n + 1):
            total = (
                acc.astype(np.float32) + inputs[order[(q + k) % n]][block].astype(np.float32) * pre
            )
            acc = (total * post if k == n else total).astype(half)
        out[block] = acc
    return out


def everyone(count, seed, ranks=None, half=np.float16) -> list:
    return [
        values(r, count, seed, half) if ranks is None or r in ranks else np.zeros(count, half)
        for r in range(N)
    ]


def rounded_once(inputs) -> np.ndarray:
    return sum(x.astype(np.float32) for x in inputs).astype(np.float16)


def test_every_rank_takes_the_per_hop_sums_for_large_float16(per_hop):
    routes = routes_of(hvd.global_process_set)
    assert routes.half_per_hop and routes.ring == tuple(range(N))
    hvd.allreduce(values(R, 1000, 1), op=hvd.Sum, name="hop.small")
    assert per_hop == []
    inputs = everyone(LARGE, 1)
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="hop.large")
    assert per_hop == [LARGE]
    assert_bits(out, hop_by_hop(inputs))
    # one hop is one rounding; more hops round more often than the default rule
    assert np.array_equal(out.view(np.uint16), rounded_once(inputs).view(np.uint16)) == (N == 2)


@pytest.mark.parametrize("half", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("count", [LARGE, 600_001], ids=["one-part-each", "large"])
def test_sum_and_average(count, half, per_hop):
    inputs = everyone(count, 2, half=half)
    tag = f"{count}.{np.dtype(half).name}"
    assert_bits(hvd.allreduce(inputs[R], op=hvd.Sum, name=f"hop.sum.{tag}"), hop_by_hop(inputs))
    inputs = everyone(count, 3, half=half)
    assert_bits(
        hvd.allreduce(inputs[R], op=hvd.Average, name=f"hop.avg.{tag}"),
        hop_by_hop(inputs, post=1.0 / N),
    )
    assert per_hop == [count, count]


def test_scale_factors_apply_in_float32_at_each_hop():
    inputs = everyone(LARGE, 4)
    out = hvd.allreduce(
        inputs[R], op=hvd.Sum, prescale_factor=0.3, postscale_factor=1.7, name="hop.scaled"
    )
    assert_bits(out, hop_by_hop(inputs, pre=0.3, post=1.7))


def test_a_grouped_call_is_one_batch(per_hop):
    counts = (30_000, 7, 2)
    inputs = [everyone(n, 20 + k) for k, n in enumerate(counts)]
    outs = hvd.grouped_allreduce([x[R] for x in inputs], op=hvd.Sum, name="hop.group")
    fused = hop_by_hop([np.concatenate([x[r] for x in inputs]) for r in range(N)])
    for out, at, n in zip(outs, offsets(counts), counts, strict=True):
        assert_bits(out, fused[at : at + n])
    assert per_hop == [sum(counts)]


def test_in_place_output_and_the_input_left_alone():
    inputs = everyone(LARGE, 30)
    x = inputs[R].copy()
    out = hvd.allreduce(x, op=hvd.Sum, name="hop.inplace", output=x)
    assert out is x
    assert_bits(x, hop_by_hop(inputs))
    y = inputs[R].copy()
    hvd.allreduce(y, op=hvd.Sum, name="hop.input")
    assert_bits(y, inputs[R])  # the partial sums live in the engine's buffer


def test_a_joined_rank_contributes_zeros():
    if R == N - 1:
        hvd.join()
        return
    inputs = everyone(LARGE, 40, ranks=range(N - 1))
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="hop.join")
    assert_bits(out, hop_by_hop(inputs))
    hvd.join()


def test_torch_fp16_compression(per_hop):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    inputs = everyone(LARGE, 51)
    grad = torch.from_numpy(inputs[R]).float()
    out = hvd_torch.allreduce(
        grad, op=hvd_torch.Average, compression=hvd_torch.Compression.fp16, name="hop.fp16"
    )
    assert out.dtype == torch.float32
    assert_bits(out.half().numpy(), hop_by_hop(inputs, post=1.0 / N))
    assert per_hop == [LARGE]


def test_a_process_set_of_the_first_ranks_goes_around_its_own_ring(per_hop):
    if N < 3:
        pytest.skip("needs a set smaller than the job")
    if not FIRST.included():
        return
    assert routes_of(FIRST).half_per_hop
    inputs = [values(r, LARGE, 5) for r in range(N - 1)]
    out = hvd.allreduce(inputs[R], op=hvd.Sum, name="hop.set", process_set=FIRST)
    assert_bits(out, hop_by_hop(inputs))
    assert per_hop == [LARGE]


def test_a_ring_in_another_order_rounds_at_each_of_its_hops():
    comm = MPI.COMM_WORLD.Dup()
    try:
        order = [(2 * i + 1) % N for i in range(N)] if N % 2 else list(reversed(range(N)))
        ring = Ring(comm, order)
        inputs = everyone(1001, 60)
        buf, counts = inputs[R].copy(), even_split(1001, N)
        folds = []

        def combine(owner, into, received, last) -> None:
            folds.append((owner, last))
            total = received.astype(np.float32) + into.astype(np.float32)
            into[...] = total.astype(np.float16)

        ring.reduce_scatter(buf, counts, combine)
        at = offsets(counts)[R]
        expected = hop_by_hop(inputs, order=order)[at : at + counts[R]]
        assert_bits(buf[at : at + counts[R]], expected)
        assert len(folds) == N - 1 and folds[-1] == (R, True)
        assert not any(last for _, last in folds[:-1])
        assert ring.first_sent == order[(order.index(R) - 1) % N]
    finally:
        comm.Free()
