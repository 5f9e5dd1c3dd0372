"""A grouped allreduce of ``tf.IndexedSlices`` whose indices overlap across ranks.

Horovod's ``test_horovod_grouped_allreduce_indexed_slices_*`` at more than two
ranks: five slices per rank, rank r's rows at indices ``[r, r + 1]``, so each
inner index is held by two ranks.  The result, densified by summing the rows
of equal indices, must be the dense sum (or average) over the ranks, eagerly
and inside a ``tf.function``.  TensorFlow keeps its default thread pools here
(Horovod's suite does), where a hang inside a graph's collective blocks the
main thread in C++: the time limit uses pytest-timeout's thread method, which
ends such a hang (a signal is only handled once the main thread runs Python
again).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402

MPI_SIZES = (2, 3, 4)

pytestmark = pytest.mark.timeout(120, method="thread")

hvd.init()
R, N = hvd.rank(), hvd.size()
ROWS = N + 1  # indices 0..N


def rows(rank: int, k: int, shape, dtype) -> np.ndarray:
    """Rank *rank*'s row for slice *k* (its two rows are this row twice, as in Horovod)."""
    rs = np.random.RandomState(100 * k + rank)
    if dtype.is_floating:
        return rs.uniform(-10, 10, size=shape).astype(dtype.as_numpy_dtype)
    return rs.randint(0, 10, size=shape).astype(dtype.as_numpy_dtype)


def expected_dense(k: int, shape, dtype, average: bool) -> np.ndarray:
    dense = np.zeros((ROWS,) + shape, np.float64)
    for r in range(N):
        x = rows(r, k, shape, dtype).astype(np.float64)
        dense[r] += x
        dense[r + 1] += x
    return dense / N if average else dense


def densify(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    dense = np.zeros((ROWS,) + values.shape[1:], np.float64)
    np.add.at(dense, indices, values.astype(np.float64))
    return dense


def grouped(op, xs):
    slices = [tf.IndexedSlices(tf.stack([x, x]), tf.constant([R, R + 1], tf.int64)) for x in xs]
    out = hvd.grouped_allreduce(slices, op=op)
    return [(s.values, s.indices) for s in out]


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize(
    "dtype,op",
    [
        (tf.uint8, hvd.Sum),
        (tf.int32, hvd.Sum),
        (tf.int64, hvd.Sum),
        (tf.float16, hvd.Sum),
        (tf.float32, hvd.Average),
        (tf.float64, hvd.Average),
        (tf.float16, hvd.Average),
    ],
    ids=lambda v: getattr(v, "name", str(v)),
)
@pytest.mark.parametrize("dim", [1, 2])
def test_grouped_allreduce_of_overlapping_indexed_slices(mode, dtype, op, dim):
    shape = (3,) * dim
    xs = [tf.constant(rows(R, k, shape, dtype)) for k in range(5)]
    fn = (lambda *a: grouped(op, a)) if mode == "eager" else tf.function(lambda *a: grouped(op, a))
    with tf.device("/cpu:0"):
        out = fn(*xs)
    tol = {tf.float16: 1e-2, tf.float32: 1e-5, tf.float64: 1e-12}.get(dtype, 0)
    for k, (values, indices) in enumerate(out):
        assert sorted(indices.numpy().tolist()) == sorted(
            [r for r in range(N)] + [r + 1 for r in range(N)]
        )
        np.testing.assert_allclose(
            densify(values.numpy(), indices.numpy()),
            expected_dense(k, shape, dtype, op == hvd.Average),
            rtol=tol,
            atol=tol,
        )
