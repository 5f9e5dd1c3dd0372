"""float16 and bfloat16 sums are rounded once: bit-exact against one float32 accumulation.

Runs under mpiexec at 3 and 4 ranks (at 2 ranks a pairwise float16 sum is
already rounded once).  Every rank rebuilds every rank's input from a seeded
generator, sums them in float32 in rank order and rounds the total once; the
engine must return exactly those bits on every path a host reduction takes:
a lone tensor through MPI, a fused batch, a tensor large enough to be reduced
through shared memory, a grouped call that mixes wire dtypes, reducescatter,
the hierarchical allreduce below the 16-bit wire's threshold (simulated nodes
of two ranks, at 4 ranks), a prescale on each of those (applied in float32), and
the torch and TensorFlow adapters (float16 and bfloat16).

Exactness holds because float32 holds the sum of 3 or 4 float16 (or bfloat16)
values of these magnitudes without rounding, whatever the order.
"""

import os

import numpy as np
import pytest

from core_helpers import assert_bits
from core_helpers import half_values as values

import hvdlite as hvd

MPI_SIZES = (3, 4)

pytestmark = pytest.mark.timeout(120)

hvd.init()
R, N = hvd.rank(), hvd.size()


def summed_once(count: int, seed: int) -> np.ndarray:
    """Every rank's input summed in float32, in rank order (the caller rounds it)."""
    total = np.zeros(count, np.float32)
    for r in range(N):
        total += values(r, count, seed).astype(np.float32)
    return total


def test_rounding_is_needed_here():
    # The check below would be empty if pairwise float16 sums happened to be exact.
    pairwise = values(0, 50_000, 1)
    for r in range(1, N):
        pairwise = (pairwise.astype(np.float32) + values(r, 50_000, 1)).astype(np.float16)
    assert (pairwise != summed_once(50_000, 1).astype(np.float16)).any()


@pytest.mark.parametrize("count", [1000, 50_000, 600_000], ids=["mpi", "shared-memory", "large"])
def test_allreduce_sum(count):
    out = hvd.allreduce(values(R, count, 2), op=hvd.Sum, name=f"half.sum.{count}")
    assert_bits(out, summed_once(count, 2).astype(np.float16))


def test_fused_batch_and_mixed_group():
    handles = [
        hvd.allreduce_async(values(R, 300 + k, 10 + k), op=hvd.Sum, name=f"half.f{k}")
        for k in range(4)
    ]
    for k, h in enumerate(handles):
        assert_bits(hvd.synchronize(h), summed_once(300 + k, 10 + k).astype(np.float16))
    outs = hvd.grouped_allreduce(
        [values(R, 700, 20), np.ones(3), values(R, 90_000, 21)], op=hvd.Sum, name="half.mixed"
    )
    assert_bits(outs[0], summed_once(700, 20).astype(np.float16))
    assert_bits(outs[2], summed_once(90_000, 21).astype(np.float16))


#: A prescale whose products are exact in float32 and not in float16 (they fall
#: into float16's subnormal range), and the postscale that undoes it.
TINY, UNDO = 2.0**-20, 2.0**20


@pytest.mark.parametrize("count", [1000, 50_000, 600_000], ids=["mpi", "shared-memory", "large"])
def test_a_prescale_is_applied_in_float32_on_every_path(count):
    # float16 products are float32 products, rounded once with the sum: rounded to
    # float16 first, x * 2**-20 would lose its low bits
    out = hvd.allreduce(
        values(R, count, 70),
        op=hvd.Sum,
        prescale_factor=TINY,
        postscale_factor=UNDO,
        name=f"half.pre.{count}",
    )
    assert_bits(out, summed_once(count, 70).astype(np.float16))


@pytest.mark.parametrize("rows", [8, 40_000])
def test_a_reducescatter_prescale_is_applied_in_float32(rows):
    count = rows * N
    shard = hvd.reducescatter(
        values(R, count, 71).reshape(rows * N, 1),
        op=hvd.Sum,
        prescale_factor=TINY,
        postscale_factor=UNDO,
        name=f"half.rs.pre.{rows}",
    )
    expected = summed_once(count, 71).astype(np.float16).reshape(rows * N, 1)
    assert_bits(shard, expected[R * rows : (R + 1) * rows])


@pytest.mark.parametrize("rows", [8, 40_000])
def test_reducescatter_sum(rows):
    count = rows * N
    shard = hvd.reducescatter(
        values(R, count, 30).reshape(rows * N, 1), op=hvd.Sum, name=f"half.rs.{rows}"
    )
    expected = summed_once(count, 30).astype(np.float16).reshape(rows * N, 1)
    assert_bits(shard, expected[R * rows : (R + 1) * rows])


@pytest.mark.skipif(N % 2, reason="simulated nodes of two ranks need an even size")
def test_hierarchical_sum(monkeypatch):
    # Two simulated nodes of two ranks: reduce-scatter in the node, allreduce across.
    from hvdlite.engine.transports.hierarchical import Hierarchical

    calls = []
    real = Hierarchical.allreduce

    def spy(self, buf, *args, **kwargs):
        calls.append(buf.dtype)
        return real(self, buf, *args, **kwargs)

    monkeypatch.setattr(Hierarchical, "allreduce", spy)
    knobs = {"HVDLITE_TEST_NODE_SIZE": "2", "HVDLITE_HIERARCHICAL_ALLREDUCE": "1"}
    hvd.shutdown()
    os.environ.update(knobs)
    try:
        hvd.init()
        # below the 16-bit wire's threshold: the two levels reduce a float32 copy
        # (larger batches cross as 16-bit node partial sums, rounded per node:
        # test_core_half_two_level.py)
        for count in (1000, 16_000):
            out = hvd.allreduce(values(R, count, 40), op=hvd.Sum, name=f"half.h.{count}")
            assert_bits(out, summed_once(count, 40).astype(np.float16))
        assert calls and all(dt == np.float32 for dt in calls), calls
    finally:
        hvd.shutdown()
        for knob in knobs:
            del os.environ[knob]
        hvd.init()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("count", [1000, 50_000])
def test_torch_sum(dtype, count):
    torch = pytest.importorskip("torch")
    import hvdlite.torch as hvd_torch

    narrow = getattr(torch, dtype)
    mine = torch.from_numpy(values(R, count, 50).astype(np.float32)).to(narrow)
    out = hvd_torch.allreduce(mine, op=hvd_torch.Sum, name=f"half.torch.{dtype}.{count}")
    total = torch.zeros(count, dtype=torch.float32)
    for r in range(N):
        total += torch.from_numpy(values(r, count, 50).astype(np.float32)).to(narrow).float()
    assert out.dtype == narrow
    assert torch.equal(out.view(torch.int16), total.to(narrow).view(torch.int16))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tensorflow_sum(dtype):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tf = pytest.importorskip("tensorflow")
    import hvdlite.tensorflow as hvd_tf

    narrow = getattr(tf, dtype)
    mine = tf.cast(tf.constant(values(R, 5000, 60).astype(np.float32)), narrow)
    out = hvd_tf.allreduce(mine, op=hvd_tf.Sum, name=f"half.tf.{dtype}")
    total = tf.zeros(5000, tf.float32)
    for r in range(N):
        total += tf.cast(
            tf.cast(tf.constant(values(r, 5000, 60).astype(np.float32)), narrow), tf.float32
        )
    assert out.dtype == narrow
    np.testing.assert_array_equal(
        tf.bitcast(out, tf.int16).numpy(), tf.bitcast(tf.cast(total, narrow), tf.int16).numpy()
    )
