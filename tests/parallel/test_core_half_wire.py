"""float16 allreduces across nodes move 16-bit values and still round once
(hvdlite/engine/transports/half_wire.py).

Runs as simulated nodes of one rank each (HVDLITE_TEST_NODE_SIZE=1), so every set of
two or more ranks spans nodes, as across hosts.  Every rank rebuilds every rank's
input from a seeded generator, scales and sums them in float32 in rank order and
rounds the total once; the 16-bit path must return exactly those bits, at 2, 3 and
4 ranks: alone, fused, grouped, scaled, averaged, with a rank that has joined, and
from the torch adapter (CPU float16, and a DistributedOptimizer with
Compression.fp16).  Reduce-scatters of float16 and bfloat16 the same way: each
rank gets its rows of the rounded-once sum, 16 bits on the wire, from the core,
torch, and the sharded optimizer with Compression.fp16.
"""

import math
import os

import numpy as np
import pytest

os.environ["HVDLITE_TEST_NODE_SIZE"] = "1"  # a knob read by init(), hence at import

from core_helpers import assert_bits
from core_helpers import half_values as values
from core_helpers import rows_of, spy_on

import hvdlite as hvd  # noqa: E402
from hvdlite import basics  # noqa: E402
from hvdlite.engine.transports.half_wire import (  # noqa: E402
    ADD_CHUNK,
    HALF_WIRE_MIN_BYTES,
    HalfWirePeer,
)
from hvdlite.util.dtypes import BFLOAT16  # noqa: E402

MPI_SIZES = (2, 3, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "1"}

pytestmark = pytest.mark.timeout(120)

hvd.init()
R, N = hvd.rank(), hvd.size()
LARGE = HALF_WIRE_MIN_BYTES // 4 + 1001  # float32 bytes over the path's threshold


@pytest.fixture
def via_16_bits(monkeypatch):
    """The element counts of the batches this rank reduced on the 16-bit path."""
    return spy_on(monkeypatch, HalfWirePeer, "reduce", lambda p0, tensors, *rest: tensors.total())


def rounded_once(count, seed, pre=1.0, post=1.0, ranks=None, half=np.float16) -> np.ndarray:
    """The inputs of *ranks* (default: all), each scaled by *pre* and summed in
    float32 in rank order, the sum scaled by *post* and rounded to *half* once."""
    total = np.zeros(count, np.float32)
    for r in range(N) if ranks is None else ranks:
        total += values(r, count, seed, half).astype(np.float32) * np.float32(pre)
    return (total * np.float32(post)).astype(half)


def test_every_rank_takes_the_16_bit_path_for_large_float16_only(via_16_bits):
    assert basics.halves_cross_as_16_bits(hvd.global_process_set)
    assert (
        hvd.allgather_object(basics.halves_cross_as_16_bits(hvd.global_process_set)) == [True] * N
    )
    hvd.allreduce(values(R, 1000, 1), op=hvd.Sum, name="hw.small")
    hvd.allreduce(np.ones(LARGE, np.float32), op=hvd.Sum, name="hw.float32")
    assert via_16_bits == []
    out = hvd.allreduce(values(R, LARGE, 1), op=hvd.Sum, name="hw.large")
    assert via_16_bits == [LARGE]
    assert_bits(out, rounded_once(LARGE, 1))


@pytest.mark.parametrize("count", [LARGE, 600_001], ids=["one-part-each", "large"])
def test_sum_and_average_round_once(count, via_16_bits):
    assert_bits(
        hvd.allreduce(values(R, count, 2), op=hvd.Sum, name=f"hw.sum.{count}"),
        rounded_once(count, 2),
    )
    assert_bits(
        hvd.allreduce(values(R, count, 3), op=hvd.Average, name=f"hw.avg.{count}"),
        rounded_once(count, 3, post=1.0 / N),
    )
    assert via_16_bits == [count, count]


def test_scale_factors_apply_in_float32(via_16_bits):
    out = hvd.allreduce(
        values(R, LARGE, 4), op=hvd.Sum, prescale_factor=0.3, postscale_factor=1.7, name="hw.scaled"
    )
    assert_bits(out, rounded_once(LARGE, 4, pre=0.3, post=1.7))
    assert via_16_bits == [LARGE]


def test_parts_of_several_chunks_with_factors_that_change_inside_one(via_16_bits):
    # Each rank's part is added ADD_CHUNK values at a time; three tensors with their
    # own factors, fused into one batch, meet inside chunks: each value still gets
    # its own tensor's prescale and postscale.  Whether one engine cycle sees all
    # three is timing (the middle one alone is under the path's threshold), so the
    # burst is retried until a batch of all three took the path; every attempt's
    # results must be exact, fused or not.
    counts = [ADD_CHUNK * N + 777, ADD_CHUNK // 3, ADD_CHUNK * N + 5]
    factors = [(0.3, 1.7), (2.5, 0.5), (1.0, 0.25)]
    inputs = [values(R, n, 90 + k) for k, n in enumerate(counts)]
    for attempt in range(5):
        handles = [
            hvd.allreduce_async(
                x,
                op=hvd.Sum,
                prescale_factor=pre,
                postscale_factor=post,
                name=f"hw.chunks.{attempt}.{k}",
            )
            for k, (x, (pre, post)) in enumerate(zip(inputs, factors, strict=True))
        ]
        for k, (n, (pre, post), h) in enumerate(zip(counts, factors, handles, strict=True)):
            assert_bits(hvd.synchronize(h), rounded_once(n, 90 + k, pre=pre, post=post))
        if sum(counts) in via_16_bits:  # batches are the coordinator's: the same on every rank
            return
    pytest.fail(f"three allreduces submitted at once never ran as one batch: {via_16_bits}")


def test_a_fused_batch_and_a_grouped_call(via_16_bits):
    # Together over the path's threshold, alone under it: whichever batches the
    # cycles form, each rounds once.
    counts = [9_000 + k for k in range(4)]
    handles = [
        hvd.allreduce_async(values(R, n, 10 + k), op=hvd.Sum, name=f"hw.fused.{k}")
        for k, n in enumerate(counts)
    ]
    for k, (n, h) in enumerate(zip(counts, handles, strict=True)):
        assert_bits(hvd.synchronize(h), rounded_once(n, 10 + k))
    outs = hvd.grouped_allreduce(
        [values(R, 30_000, 20), values(R, 7, 21), values(R, 2, 22)], op=hvd.Sum, name="hw.group"
    )
    for out, (n, seed) in zip(outs, [(30_000, 20), (7, 21), (2, 22)], strict=True):
        assert_bits(out, rounded_once(n, seed))
    assert via_16_bits[-1] == 30_009


def test_in_place_output():
    x = values(R, LARGE, 30)
    out = hvd.allreduce(x, op=hvd.Sum, name="hw.inplace", output=x)
    assert out is x
    assert_bits(x, rounded_once(LARGE, 30))


def test_a_joined_rank_contributes_zeros():
    if R == N - 1:
        hvd.join()
        return
    out = hvd.allreduce(values(R, LARGE, 40), op=hvd.Sum, name="hw.join")
    assert_bits(out, rounded_once(LARGE, 40, ranks=range(N - 1)))
    hvd.join()


def test_torch_float16_and_fp16_compression_cross_as_16_bits(via_16_bits):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    t = torch.from_numpy(values(R, LARGE, 50))
    out = hvd_torch.allreduce(t, op=hvd_torch.Sum, name="hw.torch")
    assert out.dtype == torch.float16
    assert_bits(out.numpy(), rounded_once(LARGE, 50))
    assert via_16_bits == [LARGE]
    # Compression.fp16 on float32 gradients: cast, 16 bits on the wire, cast back.
    grad = torch.from_numpy(values(R, LARGE, 51)).float()
    out = hvd_torch.allreduce(
        grad, op=hvd_torch.Sum, compression=hvd_torch.Compression.fp16, name="hw.fp16"
    )
    assert out.dtype == torch.float32
    assert_bits(out.half().numpy(), rounded_once(LARGE, 51))
    assert via_16_bits == [LARGE, LARGE]


@pytest.mark.skipif(N != 2, reason="TensorFlow's import is slow: one size shows its path")
def test_tensorflow_halves_cross_as_16_bits(via_16_bits, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    import hvdlite.tensorflow as hvd_tf

    out = hvd_tf.allreduce(tf.constant(values(R, LARGE, 60)), op=hvd_tf.Sum, name="hw.tf")
    assert out.dtype == tf.float16
    assert_bits(out.numpy(), rounded_once(LARGE, 60))
    # the gradient path (DistributedGradientTape; the Keras optimizer shares it)
    v = tf.Variable(tf.zeros(LARGE, tf.float16))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * tf.constant(values(R, LARGE, 61)))
    (grad,) = hvd_tf.DistributedGradientTape(tape).gradient(loss, [v])
    assert_bits(grad.numpy(), rounded_once(LARGE, 61, post=1.0 / N))
    assert via_16_bits == [LARGE, LARGE]
    # a reduce-scatter: each rank its rows, 16 bits on the wire (no float32 copy)
    spy = spy_on(monkeypatch, HalfWirePeer, "_scattered_part", lambda *args: 1)
    shape = (2 * N + 1, 9_001)
    x = values(R, math.prod(shape), 62).reshape(shape)
    out = hvd_tf.reducescatter(tf.constant(x), op=hvd_tf.Sum, name="hw.tf.rs")
    assert out.dtype == tf.float16
    assert_bits(out.numpy(), rows_of_mine(summed_once(shape, 62)))
    assert spy == [1]


# ------------------------------------------------------------- reduce-scatters
@pytest.fixture
def scattered_16_bits(monkeypatch):
    """The element counts of the reduce-scatter batches this rank ran on the 16-bit path."""
    return spy_on(
        monkeypatch,
        HalfWirePeer,
        "_scattered_part",
        lambda comm, tensors, half: sum(math.prod(t.shape) for t in tensors),
    )


def rows_of_mine(full: np.ndarray) -> np.ndarray:
    return rows_of(full, R, N)


def summed_once(shape, seed, half=np.float16, pre=1.0, post=1.0) -> np.ndarray:
    """:func:`rounded_once` of every rank's input of *shape*, in that shape."""
    return rounded_once(math.prod(shape), seed, pre, post, half=half).reshape(shape)


@pytest.mark.parametrize("half", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
def test_reduce_scatter_of_halves_rounds_once_on_the_16_bit_path(half, scattered_16_bits):
    shape = (4 * N + 1, 5_003)  # rows that do not divide evenly
    count = math.prod(shape)
    x = values(R, count, 70, half).reshape(shape)
    out = hvd.reducescatter(x, op=hvd.Sum, name=f"hw.rs.sum.{np.dtype(half).name}")
    assert out.dtype == np.dtype(half)
    assert_bits(out, rows_of_mine(summed_once(shape, 70, half)))
    out = hvd.reducescatter(
        x, op=hvd.Average, prescale_factor=0.3, name=f"hw.rs.avg.{np.dtype(half).name}"
    )
    assert_bits(out, rows_of_mine(summed_once(shape, 70, half, pre=0.3, post=1.0 / N)))
    assert scattered_16_bits == [count, count]
    small = hvd.reducescatter(values(R, 100, 71, half), op=hvd.Sum, name="hw.rs.small")
    assert scattered_16_bits == [count, count]  # under the threshold: a float32 copy
    np.testing.assert_allclose(
        small.astype(np.float32), rows_of_mine(summed_once((100,), 71, half)).astype(np.float32)
    )


def test_fused_and_grouped_reduce_scatters_keep_each_tensors_factors(scattered_16_bits):
    shapes = [(3 * N + 2, 4_001), (N + 1, 3, 6_000)]  # each over the threshold alone
    factors = [(0.5, 1.7), (3.0, 0.25)]
    handles = [
        hvd.reducescatter_async(
            values(R, math.prod(s), 80 + k).reshape(s),
            op=hvd.Sum,
            prescale_factor=pre,
            postscale_factor=post,
            name=f"hw.rs.fused.{k}",
        )
        for k, (s, (pre, post)) in enumerate(zip(shapes, factors, strict=True))
    ]
    for k, (s, (pre, post), h) in enumerate(zip(shapes, factors, handles, strict=True)):
        assert_bits(hvd.synchronize(h), rows_of_mine(summed_once(s, 80 + k, pre=pre, post=post)))
    outs = hvd.grouped_reducescatter(
        [values(R, math.prod(s), 90 + k).reshape(s) for k, s in enumerate(shapes)],
        op=hvd.Average,
        name="hw.rs.group",
    )
    for k, (s, out) in enumerate(zip(shapes, outs, strict=True)):
        assert_bits(out, rows_of_mine(summed_once(s, 90 + k, post=1.0 / N)))
    total = sum(math.prod(s) for s in shapes)
    assert sum(scattered_16_bits) == 2 * total


def test_torch_reduce_scatter_and_a_sharded_fp16_optimizer_cross_as_16_bits(scattered_16_bits):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    shape = (2 * N + 1, 9_000)
    for half, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        x = values(R, math.prod(shape), 100, np.float16).reshape(shape)
        t = torch.from_numpy(x).to(half)
        out = hvd_torch.reducescatter(t, op=hvd_torch.Sum, name=f"hw.rs.torch.{name}")
        assert out.dtype == half
        inputs = [torch.from_numpy(values(r, math.prod(shape), 100)).to(half) for r in range(N)]
        total = sum(i.float() for i in inputs)  # float32, in rank order
        expected = rows_of_mine(total.to(half).reshape(shape))
        assert torch.equal(out, expected), name
    assert len(scattered_16_bits) == 2

    # The sharded optimizer's reduce-scatter of Compression.fp16 gradients: the same
    # rounded-once averages as DistributedOptimizer's allreduce, so the same weights.
    def trained(**kwargs):
        torch.manual_seed(0)
        model = torch.nn.Linear(300, 200)
        opt = hvd_torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=model.named_parameters(),
            compression=hvd_torch.Compression.fp16,
            **kwargs,
        )
        if kwargs:
            opt._reduce_whole = False  # reduce-scattered, as across hosts
        for step in range(2):
            opt.zero_grad()
            x = torch.from_numpy(values(R, 32 * 300, 110 + step).astype(np.float32)) / 40
            model(x.reshape(32, 300)).square().mean().backward()
            opt.step()
        return model

    before = len(scattered_16_bits)
    sharded = trained(shard_optimizer_state=True)
    assert len(scattered_16_bits) > before
    plain = trained()
    for p, q in zip(sharded.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p, q)
