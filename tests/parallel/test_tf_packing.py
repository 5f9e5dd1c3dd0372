"""Small gradients packed into one flat tensor in a graph reduce exactly as when each
travels alone (hvdlite.tensorflow.packing).

Every rank reduces the same list of gradients (its own values, seeded by its rank)
in a ``tf.function``: packed (the default), with packing off (``PACK_BYTES`` 0,
every gradient its own tensor) and eagerly (never packed), and compares the
results bitwise; it also checks them against the reduction computed locally from
every rank's values.  The list mixes float32, float64, float16, bfloat16, a
gradient above ``PACK_BYTES``, one of unknown shape, a ``None`` and an
``IndexedSlices``.  Values are multiples of 1/64 below 8, so sums over up to 3
ranks are exact whichever rank's value is added first.
"""

from tf_helpers import single_threaded_tensorflow

tf = single_threaded_tensorflow(stall_shutdown_seconds=60)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402
from hvdlite.tensorflow import gradient_reduction  # noqa: E402
from hvdlite.tensorflow.gradient_reduction import GradientReducer  # noqa: E402
from hvdlite.tensorflow.packing import PACK_BYTES  # noqa: E402

MPI_SIZES = (2, 3)

hvd.init()
R, N = hvd.rank(), hvd.size()

# (shape, dtype); (300, 64) float32 is above PACK_BYTES, so it travels alone.
DENSE = [
    ((3, 4), tf.float32),
    ((7,), tf.float32),
    ((2, 2, 3), tf.float64),
    ((5,), tf.float64),
    ((300, 64), tf.float32),
    ((4,), tf.float16),
    ((6,), tf.bfloat16),
    ((1,), tf.float32),
]
SPARSE_ROWS, SPARSE_COLS = 10, 4
DYNAMIC = 9  # elements of the gradient whose shape the graph does not know

# case -> (reducer arguments, tensors the numpy function takes when packed).  Alone it
# takes 11: the 8 dense gradients, the dynamic one, sparse values and indices.  Packed,
# the 5 small ones reduced as float32 (float16 and bfloat16 are) become one tensor and
# the 2 float64 ones another; with fp16 compression all 7 are float32 on the wire;
# groups=2 cuts the 9 dense ones into [0-3] (2 float32, 2 float64) and [4-8] (the large
# one, 3 small float32, the dynamic one).
CASES = {
    "average": ({}, 6),
    "sum": ({"op": hvd.Sum}, 6),
    "predivide": ({"gradient_predivide_factor": 2.0}, 6),
    "fp16": ({"compression": hvd.Compression.fp16}, 5),
    "groups=2": ({"groups": 2}, 7),
}
#: Relative tolerance against the float64 reference, by the gradient's dtype (the
#: reduced value is rounded to it); the fp16 compression case rounds every gradient.
TOLERANCE = {tf.float16: 1e-3, tf.bfloat16: 8e-3}


def values(rank, shape, seed):
    rs = np.random.RandomState(1000 * seed + rank)
    return (rs.randint(-511, 512, size=shape) / 64).astype(np.float64)


def rank_inputs(rank):
    """Rank ``rank``'s gradients as numpy arrays (dense, sparse values and indices, dynamic)."""
    # Rounded to their dtypes (bfloat16 keeps 8 significant bits), so the tensors hold them.
    dense = [
        tf.constant(values(rank, shape, k), dtype).numpy().astype(np.float64)
        for k, (shape, dtype) in enumerate(DENSE)
    ]
    sparse = values(rank, (2, SPARSE_COLS), 50)
    indices = np.array([rank % SPARSE_ROWS, (rank + 3) % SPARSE_ROWS], np.int64)
    return dense, sparse, indices, values(rank, (DYNAMIC,), 60)


def as_tensors(dense, sparse, indices, dyn):
    grads = [tf.constant(a, dtype=dtype) for a, (_, dtype) in zip(dense, DENSE, strict=True)]
    grads.insert(2, None)
    grads.append(
        tf.IndexedSlices(
            tf.constant(sparse, tf.float32),
            tf.constant(indices),
            dense_shape=tf.constant([SPARSE_ROWS, SPARSE_COLS], tf.int64),
        )
    )
    return grads, tf.constant(dyn, tf.float32)


def reduce_in_graph(reducer):
    """The reduced gradients from a tf.function, and the number of tensors its numpy
    function took."""
    grads, dyn = as_tensors(*rank_inputs(R))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(d):
        return reducer(grads + [d])

    graph = step.get_concrete_function().graph
    (node,) = [op for op in graph.get_operations() if op.type == "PyFunc"]
    return step(dyn), len(node.inputs)


def as_numpy(grad):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return (grad.values.numpy().astype(np.float64), grad.indices.numpy())
    return grad.numpy().astype(np.float64)


def assert_bitwise_equal(got, want, sparse=True):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if g is None or w is None:
            assert g is None and w is None
            continue
        assert type(g) is type(w)
        if isinstance(g, tf.IndexedSlices):
            if not sparse:
                continue
            np.testing.assert_array_equal(g.values.numpy(), w.values.numpy())
            np.testing.assert_array_equal(g.indices.numpy(), w.indices.numpy())
        else:
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def expected(op_is_sum):
    """Every gradient reduced locally from every rank's values (float64)."""
    ranks = [rank_inputs(r) for r in range(N)]
    scale = 1.0 if op_is_sum else 1.0 / N
    dense = [sum(inputs[0][k] for inputs in ranks) * scale for k in range(len(DENSE))]
    dense.insert(2, None)
    sparse = (
        np.concatenate([inputs[1] for inputs in ranks]) * scale,
        np.concatenate([inputs[2] for inputs in ranks]),
    )
    dyn = sum(inputs[3] for inputs in ranks) * scale
    return dense + [sparse, dyn]


@pytest.mark.parametrize("case", list(CASES))
def test_packed_reduction_is_identical_to_each_tensor_alone(case, monkeypatch):
    kwargs, packed_count = CASES[case]
    packed, packed_inputs = reduce_in_graph(GradientReducer(**kwargs))
    monkeypatch.setattr(gradient_reduction, "PACK_BYTES", 0)
    alone, alone_inputs = reduce_in_graph(GradientReducer(**kwargs))
    grads, dyn = as_tensors(*rank_inputs(R))
    eager = GradientReducer(**kwargs)(grads + [dyn])

    assert_bitwise_equal(packed, alone)
    # Sparse Average divides in the graph, where TensorFlow may multiply by 1/size
    # instead: that gradient is compared between the two graphs only.
    assert_bitwise_equal(packed, eager, sparse=False)
    assert (alone_inputs, packed_inputs) == (11, packed_count)

    for got, want in zip(packed, expected(kwargs.get("op") == hvd.Sum), strict=True):
        if want is None:
            continue
        if isinstance(got, tf.IndexedSlices):
            got_values, got_indices = as_numpy(got)
            np.testing.assert_allclose(got_values, want[0], rtol=1e-6)
            np.testing.assert_array_equal(got_indices, want[1])
        else:
            tol = max(2e-3 if case == "fp16" else 1e-6, TOLERANCE.get(got.dtype, 0))
            np.testing.assert_allclose(as_numpy(got), want, rtol=tol, atol=tol)


def test_adasum_and_large_gradients_are_never_packed():
    grads, _ = as_tensors(*rank_inputs(R))
    dense = [g for g in grads if g is not None and not isinstance(g, tf.IndexedSlices)]

    @tf.function
    def step():
        return GradientReducer(op=hvd.Adasum)(dense)

    graph = step.get_concrete_function().graph
    (node,) = [op for op in graph.get_operations() if op.type == "PyFunc"]
    assert len(node.inputs) == len(dense)
    assert DENSE[4][0][0] * DENSE[4][0][1] * 4 >= PACK_BYTES  # the large one stays alone
