"""bfloat16 allreduces across nodes move 16-bit values and still round once
(hvdlite/engine/transports/half_wire.py), from numpy (ml_dtypes' bfloat16), torch,
TensorFlow, Keras and JAX, and with each framework's ``Compression.bf16``.

Runs as simulated nodes of one rank each (HVDLITE_TEST_NODE_SIZE=1), so every set of
two or more ranks spans nodes, as across hosts.  Every rank rebuilds every rank's
input from a seeded generator, scales and sums them in float32 in rank order and
rounds the total to bfloat16 once (to nearest even); the 16-bit path must return
exactly those bits, at 2, 3 and 4 ranks.  The frameworks' own imports are slow:
TensorFlow, Keras and JAX show their path at 2 ranks only (JAX's reduce-scatter too).
"""

import os

import numpy as np
import pytest

os.environ["HVDLITE_TEST_NODE_SIZE"] = "1"  # a knob read by init(), hence at import

from core_helpers import assert_bits, half_values, rows_of, spy_on

import hvdlite as hvd  # noqa: E402
from hvdlite import basics  # noqa: E402
from hvdlite.engine.transports.half_wire import HALF_WIRE_MIN_BYTES, HalfWirePeer  # noqa: E402
from hvdlite.util.dtypes import BFLOAT16  # noqa: E402

MPI_SIZES = (2, 3, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "1", "KERAS_BACKEND": "tensorflow"}

pytestmark = pytest.mark.timeout(150)

hvd.init()
R, N = hvd.rank(), hvd.size()
LARGE = HALF_WIRE_MIN_BYTES // 4 + 1001  # float32 bytes over the path's threshold


def values(rank, count, seed) -> np.ndarray:
    return half_values(rank, count, seed, BFLOAT16)


@pytest.fixture
def via_16_bits(monkeypatch):
    """The element counts of the batches this rank reduced on the 16-bit path."""
    return spy_on(monkeypatch, HalfWirePeer, "reduce", lambda p0, tensors, *rest: tensors.total())


def rounded_once(count, seed, pre=1.0, post=1.0, ranks=None) -> np.ndarray:
    """The inputs of *ranks* (default: all), each scaled by *pre* and summed in
    float32 in rank order, the sum scaled by *post* and rounded to bfloat16 once."""
    total = np.zeros(count, np.float32)
    for r in range(N) if ranks is None else ranks:
        total += values(r, count, seed).astype(np.float32) * np.float32(pre)
    return (total * np.float32(post)).astype(BFLOAT16)


def test_large_bfloat16_crosses_as_16_bits_on_every_rank(via_16_bits):
    assert hvd.allgather_object(basics.halves_cross_as_16_bits(hvd.global_process_set)) == (
        [True] * N
    )
    small = hvd.allreduce(values(R, 1000, 1), op=hvd.Sum, name="bf.small")
    assert_bits(small, rounded_once(1000, 1))  # MPI, in a float32 copy: the same rule
    hvd.allreduce(np.ones(LARGE, np.float32), op=hvd.Sum, name="bf.float32")
    assert via_16_bits == []
    out = hvd.allreduce(values(R, LARGE, 1), op=hvd.Sum, name="bf.large")
    assert out.dtype == BFLOAT16
    assert via_16_bits == [LARGE]
    assert_bits(out, rounded_once(LARGE, 1))


@pytest.mark.parametrize("count", [LARGE, 600_001], ids=["one-part-each", "large"])
def test_sum_and_average_round_once(count, via_16_bits):
    assert_bits(
        hvd.allreduce(values(R, count, 2), op=hvd.Sum, name=f"bf.sum.{count}"),
        rounded_once(count, 2),
    )
    assert_bits(
        hvd.allreduce(values(R, count, 3), op=hvd.Average, name=f"bf.avg.{count}"),
        rounded_once(count, 3, post=1.0 / N),
    )
    assert via_16_bits == [count, count]


def test_scale_factors_apply_in_float32():
    out = hvd.allreduce(
        values(R, LARGE, 4), op=hvd.Sum, prescale_factor=0.3, postscale_factor=1.7, name="bf.sc"
    )
    assert_bits(out, rounded_once(LARGE, 4, pre=0.3, post=1.7))


def test_fused_batches_and_a_group_beside_float16(via_16_bits):
    counts = [9_000 + k for k in range(4)]
    handles = [
        hvd.allreduce_async(values(R, n, 10 + k), op=hvd.Sum, name=f"bf.fused.{k}")
        for k, n in enumerate(counts)
    ]
    for k, (n, h) in enumerate(zip(counts, handles, strict=True)):
        assert_bits(hvd.synchronize(h), rounded_once(n, 10 + k))
    outs = hvd.grouped_allreduce(
        [values(R, 30_000, 20), values(R, 7, 21)], op=hvd.Sum, name="bf.group"
    )
    for out, (n, seed) in zip(outs, [(30_000, 20), (7, 21)], strict=True):
        assert_bits(out, rounded_once(n, seed))
    assert via_16_bits[-1] == 30_007
    # float16 and bfloat16 in one group: one float32 reduction, each rounded once
    half = half_values(R, 20_000, 22)
    outs = hvd.grouped_allreduce([half, values(R, 20_000, 23)], op=hvd.Sum, name="bf.mixed")
    halves = sum(half_values(r, 20_000, 22).astype(np.float32) for r in range(N))
    assert_bits(outs[0], halves.astype(np.float16))
    assert_bits(outs[1], rounded_once(20_000, 23))


def test_in_place_output_and_a_joined_rank():
    x = values(R, LARGE, 30)
    out = hvd.allreduce(x, op=hvd.Sum, name="bf.inplace", output=x)
    assert out is x
    assert_bits(x, rounded_once(LARGE, 30))
    if R == N - 1:
        hvd.join()
        return
    out = hvd.allreduce(values(R, LARGE, 31), op=hvd.Sum, name="bf.join")
    assert_bits(out, rounded_once(LARGE, 31, ranks=range(N - 1)))
    hvd.join()


def test_torch_bfloat16_and_bf16_compression(via_16_bits):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    def tensor(rank, count, seed):
        return torch.from_numpy(values(rank, count, seed).view(np.int16)).view(torch.bfloat16)

    def bits(t):
        return t.view(torch.int16).numpy().view(BFLOAT16)

    out = hvd_torch.allreduce(tensor(R, LARGE, 40), op=hvd_torch.Sum, name="bf.torch")
    assert out.dtype == torch.bfloat16
    assert_bits(bits(out), rounded_once(LARGE, 40))
    x = tensor(R, LARGE, 41)
    hvd_torch.allreduce_(x, op=hvd_torch.Average, name="bf.torch.inplace")
    assert_bits(bits(x), rounded_once(LARGE, 41, post=1.0 / N))
    assert via_16_bits == [LARGE, LARGE]
    # Compression.bf16 on float32 gradients through a DistributedOptimizer: cast,
    # 16 bits on the wire, cast back; the averaged gradient rounded once.
    model = torch.nn.Linear(LARGE, 1, bias=False)
    opt = hvd_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(),
        compression=hvd_torch.Compression.bf16,
    )
    model(tensor(R, LARGE, 42).float().reshape(1, -1)).sum().backward()
    opt.synchronize()
    grad = model.weight.grad.reshape(-1).bfloat16()
    assert_bits(bits(grad), rounded_once(LARGE, 42, post=1.0 / N))
    assert via_16_bits == [LARGE, LARGE, LARGE]


@pytest.mark.skipif(N != 2, reason="TensorFlow's import is slow: one size shows its path")
def test_tensorflow_and_keras_bfloat16_cross_as_16_bits(via_16_bits):
    tf = pytest.importorskip("tensorflow")
    import hvdlite.tensorflow as hvd_tf

    out = hvd_tf.allreduce(tf.constant(values(R, LARGE, 50)), op=hvd_tf.Sum, name="bf.tf")
    assert out.dtype == tf.bfloat16
    assert_bits(out.numpy(), rounded_once(LARGE, 50))
    # the gradient path with Compression.bf16, in a graph (tf.function)
    v = tf.Variable(tf.zeros(LARGE))
    x = tf.constant(values(R, LARGE, 51).astype(np.float32))

    @tf.function
    def gradient():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * x)
        tape = hvd_tf.DistributedGradientTape(tape, compression=hvd_tf.Compression.bf16)
        return tape.gradient(loss, [v])[0]

    grad = gradient()
    assert grad.dtype == tf.float32
    assert_bits(tf.cast(grad, tf.bfloat16).numpy(), rounded_once(LARGE, 51, post=1.0 / N))
    assert via_16_bits == [LARGE, LARGE]
    # Keras 3 (the TensorFlow backend): its DistributedOptimizer shares that path
    import keras

    import hvdlite.keras as hvd_keras

    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
    model = keras.Sequential([keras.Input((LARGE,)), layer])
    opt = hvd_keras.DistributedOptimizer(
        keras.optimizers.SGD(learning_rate=1.0), compression=hvd_keras.Compression.bf16
    )
    model.compile(optimizer=opt, loss=lambda y, p: keras.ops.sum(p))
    model.train_on_batch(values(R, LARGE, 52).astype(np.float32).reshape(1, -1), np.zeros((1, 1)))
    weights = 0.0 - layer.kernel.numpy().reshape(-1)  # lr 1 from zeros: minus the gradient
    assert_bits(weights.astype(BFLOAT16), rounded_once(LARGE, 52, post=1.0 / N))
    assert via_16_bits[2:] == [LARGE]


@pytest.mark.skipif(N != 2, reason="JAX's import is slow: one size shows its path")
def test_jax_bfloat16_crosses_as_16_bits(via_16_bits, monkeypatch):
    jax = pytest.importorskip("jax")
    import hvdlite.jax as hvd_jax

    out = hvd_jax.allreduce(jax.numpy.asarray(values(R, LARGE, 60)), op=hvd_jax.Sum)
    assert out.dtype == jax.numpy.bfloat16
    assert_bits(np.asarray(out), rounded_once(LARGE, 60))
    jitted = jax.jit(lambda x: hvd_jax.allreduce(x, op=hvd_jax.Average, name="bf.jax.jit"))
    assert_bits(
        np.asarray(jitted(jax.numpy.asarray(values(R, LARGE, 61)))),
        rounded_once(LARGE, 61, post=1.0 / N),
    )
    assert via_16_bits == [LARGE, LARGE]
    # a reduce-scatter: each rank its rows of the rounded-once sum, 16 bits on the wire
    scattered = spy_on(monkeypatch, HalfWirePeer, "_scattered_part", lambda *args: 1)
    rows, width = 2 * N + 1, 9_001
    x = jax.numpy.asarray(values(R, rows * width, 62).reshape(rows, width))
    out = hvd_jax.reducescatter(x, op=hvd_jax.Sum, name="bf.jax.rs")
    assert out.dtype == jax.numpy.bfloat16
    expected = rows_of(rounded_once(rows * width, 62).reshape(rows, width), R, N)
    assert_bits(np.asarray(out), expected)
    assert scattered == [1]
