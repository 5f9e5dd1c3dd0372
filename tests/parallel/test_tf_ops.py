"""hvdlite.tensorflow collectives, eagerly and inside tf.function, against local references.

Every rank builds every rank's input from a seeded generator, so the expected
result of each collective (and of its gradient) is computed locally.  Each
test runs in both modes: ``eager`` calls the op directly, ``graph`` traces it
into a fresh ``tf.function`` (one ``tf.numpy_function`` node per collective).
"""

from tf_helpers import single_threaded_tensorflow

tf = single_threaded_tensorflow()

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402

MPI_SIZES = (2, 3)

# A proper subset of the world: {0, 1} at 3 ranks, {1} at 2 ranks.
PAIR = hvd.ProcessSet([0, 1] if MPI.COMM_WORLD.size > 2 else [1])
hvd.init(process_sets=[PAIR])
R, N = hvd.rank(), hvd.size()
MODES = ["eager", "graph"]


def data(rank, shape=(3, 4), dtype=tf.float32, seed=0):
    """What rank ``rank`` contributes, as a numpy array (reproducible everywhere)."""
    rs = np.random.RandomState(1000 * seed + rank)
    if dtype == tf.bool:
        return rs.rand(*shape) > 0.5
    if dtype.is_floating:
        return rs.randn(*shape).astype(np.float64)
    low = 0 if dtype in (tf.uint8, tf.uint16) else -5
    return rs.randint(low, 6, size=shape).astype(np.int64)


def tensor(rank, **kw):
    dtype = kw.get("dtype", tf.float32)
    return tf.cast(tf.constant(data(rank, **kw)), dtype)


def everyone(**kw):
    return [data(r, **kw) for r in range(N)]


def run(mode, fn, *args):
    """fn(*args) eagerly, or traced into a new tf.function."""
    if mode == "eager":
        return fn(*args)
    return tf.function(fn)(*args)


def close(actual, expected, dtype=tf.float32):
    tol = {tf.float16: 1e-2, tf.bfloat16: 3e-2}.get(dtype, 1e-5)
    actual = tf.convert_to_tensor(actual)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    np.testing.assert_allclose(
        tf.cast(actual, tf.float64).numpy(),
        np.asarray(expected, dtype=np.float64),
        rtol=tol,
        atol=tol,
    )


# ------------------------------------------------------------------ allreduce


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "dtype",
    [
        tf.float16,
        tf.bfloat16,
        tf.float32,
        tf.float64,
        tf.int8,
        tf.int16,
        tf.int32,
        tf.int64,
        tf.uint8,
        tf.uint16,
    ],
)
def test_allreduce_sum_every_dtype(mode, dtype):
    out = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), tensor(R, dtype=dtype))
    close(out, np.sum(everyone(dtype=dtype), 0), dtype)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_ops_and_scales(mode):
    x = tensor(R, seed=1)
    ref = np.stack(everyone(seed=1))

    def fn(x):
        return [
            hvd.allreduce(x),
            hvd.allreduce(x, op=hvd.Min),
            hvd.allreduce(x, op=hvd.Max),
            hvd.allreduce(x, op=hvd.Product),
            hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
        ]

    avg, mn, mx, prod, scaled = run(mode, fn, x)
    close(avg, ref.mean(0))
    close(mn, ref.min(0))
    close(mx, ref.max(0))
    close(prod, ref.prod(0))
    close(scaled, 1.5 * ref.sum(0))


def test_allreduce_average_deprecated_spelling():
    x = tensor(R)
    with pytest.warns(DeprecationWarning):
        out = hvd.allreduce(x, average=False)
    close(out, np.sum(everyone(), 0))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_bool_min_max(mode):
    x = tf.constant(data(R, dtype=tf.bool))
    ref = np.stack(everyone(dtype=tf.bool))
    both, either = run(
        mode, lambda x: [hvd.allreduce(x, op=hvd.Min), hvd.allreduce(x, op=hvd.Max)], x
    )
    np.testing.assert_array_equal(both.numpy(), ref.all(0))
    np.testing.assert_array_equal(either.numpy(), ref.any(0))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_and_compression(mode):
    xs = [
        tensor(R, shape=(5,), seed=2),
        tensor(R, shape=(2, 3), dtype=tf.float64, seed=3),
        tensor(R, shape=(4,), dtype=tf.bfloat16, seed=4),
    ]

    def fn(*xs):
        return hvd.grouped_allreduce(list(xs), op=hvd.Sum) + [
            hvd.allreduce(xs[0], compression=hvd.Compression.fp16),
            hvd.allreduce(xs[0], compression=hvd.Compression.bf16),
        ]

    outs = run(mode, fn, *xs)
    close(outs[0], np.sum(everyone(shape=(5,), seed=2), 0))
    close(outs[1], np.sum(everyone(shape=(2, 3), seed=3), 0), tf.float64)
    close(outs[2], np.sum(everyone(shape=(4,), seed=4), 0), tf.bfloat16)
    mean = np.mean(everyone(shape=(5,), seed=2), 0)
    np.testing.assert_allclose(outs[3].numpy(), mean, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(outs[4].numpy(), mean, rtol=3e-2, atol=3e-2)
    assert outs[3].dtype == outs[4].dtype == tf.float32


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_indexed_slices_is_an_allgather(mode):
    dense_shape = [6, 2]

    def slices(rank):
        rs = np.random.RandomState(50 + rank)
        idx = rs.choice(6, size=rank + 1, replace=False).astype(np.int64)
        return idx, rs.randn(rank + 1, 2).astype(np.float32)

    idx, vals = slices(R)

    def fn(values, indices):
        s = tf.IndexedSlices(values, indices, dense_shape=tf.constant(dense_shape, tf.int64))
        out = hvd.allreduce(s)
        return out.values, out.indices

    values, indices = run(mode, fn, tf.constant(vals), tf.constant(idx))
    expected = np.zeros(dense_shape)
    for r in range(N):
        i, v = slices(r)
        np.add.at(expected, i, v)
    got = np.zeros(dense_shape)
    np.add.at(got, indices.numpy(), values.numpy())
    np.testing.assert_allclose(got, expected / N, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ allgather


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.int8, tf.uint16, tf.bool])
def test_allgather_uneven_first_dims(mode, dtype):
    out = run(mode, hvd.allgather, tensor(R, shape=(R + 1, 3), dtype=dtype))
    ref = np.concatenate([data(r, shape=(r + 1, 3), dtype=dtype) for r in range(N)])
    if dtype == tf.bool:
        np.testing.assert_array_equal(out.numpy(), ref)
    else:
        close(out, ref, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather(mode):
    xs = [tensor(R, shape=(R + 1, 2), seed=5), tensor(R, shape=(2,), dtype=tf.int32, seed=6)]
    outs = run(mode, lambda a, b: hvd.grouped_allgather([a, b]), *xs)
    close(outs[0], np.concatenate([data(r, shape=(r + 1, 2), seed=5) for r in range(N)]))
    close(outs[1], np.concatenate(everyone(shape=(2,), dtype=tf.int32, seed=6)), tf.int32)


# ------------------------------------------------------------ broadcast, alltoall


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_from_every_root(mode):
    for root in range(N):
        for dtype in (tf.float32, tf.bfloat16, tf.int64, tf.uint16):
            out = run(
                mode, lambda x, root=root: hvd.broadcast(x, root), tensor(R, dtype=dtype, seed=7)
            )
            close(out, data(root, dtype=dtype, seed=7), dtype)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_inplace_and_broadcast_variables(mode):
    a = tf.Variable(data(R, seed=8).astype(np.float32))
    b = tf.Variable(data(R, shape=(2,), dtype=tf.int32, seed=9).astype(np.int32))
    values = run(mode, lambda: hvd.broadcast_([a, b], root_rank=N - 1))
    close(values[0], data(N - 1, seed=8))
    close(a, data(N - 1, seed=8))
    close(b, data(N - 1, shape=(2,), dtype=tf.int32, seed=9), tf.int32)
    c = tf.Variable(data(R, seed=10).astype(np.float32))

    def bcast():
        hvd.broadcast_variables([a, c], root_rank=0)

    run(mode, bcast)
    close(a, data(N - 1, seed=8))
    close(c, data(0, seed=10))


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_even_and_with_splits(mode):
    x = tf.constant(np.arange(2 * N * 3, dtype=np.float32).reshape(2 * N, 3) + 100 * R)
    even = run(mode, hvd.alltoall, x)
    ref = np.concatenate(
        [np.arange(2 * N * 3).reshape(2 * N, 3)[2 * R : 2 * R + 2] + 100 * r for r in range(N)]
    )
    close(even, ref)
    # rank r sends (dst + 1) rows to rank dst, taken in order from its tensor
    splits = [dst + 1 for dst in range(N)]
    rows = sum(splits)
    y = tf.constant(np.arange(rows, dtype=np.int32) + 1000 * R)
    out, received = run(mode, lambda t: hvd.alltoall(t, splits=splits), y)
    start = sum(splits[:R])
    ref = np.concatenate([np.arange(start, start + R + 1) + 1000 * r for r in range(N)])
    np.testing.assert_array_equal(out.numpy(), ref)
    np.testing.assert_array_equal(received.numpy(), [R + 1] * N)


# -------------------------------------------------------------- reducescatter


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_uneven_and_grouped(mode):
    rows = 2 * N + 1
    x = tensor(R, shape=(rows, 2), seed=11)
    z = tensor(R, shape=(N, 3), dtype=tf.float64, seed=12)

    def fn(x, z):
        return [hvd.reducescatter(x, op=hvd.Sum)] + hvd.grouped_reducescatter([x, z])

    summed, avg_x, avg_z = run(mode, fn, x, z)
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    lo = sum(counts[:R])
    total = np.sum(everyone(shape=(rows, 2), seed=11), 0)
    close(summed, total[lo : lo + counts[R]])
    close(avg_x, total[lo : lo + counts[R]] / N)
    close(avg_z, np.mean(everyone(shape=(N, 3), seed=12), 0)[R : R + 1], tf.float64)


@pytest.mark.parametrize("mode", MODES)
def test_uint16_in_every_collective(mode):
    """uint16, as Horovod's TF ops accept it, wherever the op makes sense."""
    dt = tf.uint16
    x = tensor(R, shape=(N, 2), dtype=dt, seed=16)
    ref = np.stack(everyone(shape=(N, 2), dtype=dt, seed=16))

    def fn(x):
        return [
            hvd.allreduce(x, op=hvd.Min),
            hvd.allreduce(x, op=hvd.Max),
            hvd.grouped_allreduce([x, x], op=hvd.Sum)[1],
            hvd.alltoall(x),
            hvd.reducescatter(x, op=hvd.Sum),
            hvd.broadcast(x, N - 1),
            hvd.allgather(x),
        ]

    outs = run(mode, fn, x)
    assert all(o.dtype == dt for o in outs)
    mn, mx, summed, a2a, rs, bcast, gathered = (o.numpy() for o in outs)
    np.testing.assert_array_equal(mn, ref.min(0))
    np.testing.assert_array_equal(mx, ref.max(0))
    np.testing.assert_array_equal(summed, ref.sum(0))
    np.testing.assert_array_equal(a2a, ref[:, R])
    np.testing.assert_array_equal(rs, ref.sum(0)[R : R + 1])
    np.testing.assert_array_equal(bcast, ref[N - 1])
    np.testing.assert_array_equal(gathered, ref.reshape(-1, 2))


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_reductions(mode):
    w = tf.constant(data(R, shape=(4,), seed=13).astype(np.float32))
    ups = [np.random.RandomState(70 + r).randn(4) for r in range(N)]  # per-rank dL/dy

    def fn(w):
        up = tf.constant(ups[R], tf.float32)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(w)
            s = hvd.allreduce(w, op=hvd.Sum)
            a = hvd.allreduce(w)
            g1, g2 = hvd.grouped_allreduce([w * 2.0, w], op=hvd.Sum)
            m = hvd.allreduce(w, op=hvd.Max)
            losses = [
                tf.reduce_sum(s * up),
                tf.reduce_sum(a * up),
                tf.reduce_sum(g1 * up) + tf.reduce_sum(g2),
                tf.reduce_sum(m * up),
            ]
        return [tape.gradient(loss, w) for loss in losses]

    d_sum, d_avg, d_grouped, d_max = run(mode, fn, w)
    total_up = np.sum(ups, 0)
    close(d_sum, total_up)  # Sum's gradient: Sum-allreduce
    close(d_avg, total_up / N)  # Average's: Average-allreduce
    close(d_grouped, 2 * total_up + N)
    ws = np.stack([data(r, shape=(4,), seed=13) for r in range(N)]).astype(np.float32)
    mine_is_max = ws[R] == ws.max(0)
    close(d_max, np.where(mine_is_max, total_up, 0.0))


@pytest.mark.parametrize("mode", MODES)
def test_gradients_of_gather_broadcast_alltoall_reducescatter(mode):
    x = tf.constant(data(R, shape=(R + 1, 2), seed=14).astype(np.float32))
    sq = tf.constant(data(R, shape=(N, 2), seed=15).astype(np.float32))
    weights = np.arange(1, 1 + 2 * sum(range(1, N + 1)), dtype=np.float32).reshape(-1, 2)

    def fn(x, sq):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, sq])
            gathered = hvd.allgather(x)
            b = hvd.broadcast(sq, 0)
            t = hvd.alltoall(sq)
            rs = hvd.reducescatter(sq, op=hvd.Sum)
            losses = [
                tf.reduce_sum(gathered * weights),
                tf.reduce_sum(b * 3.0),
                tf.reduce_sum(t * tf.cast(R + 1, tf.float32)),
                tf.reduce_sum(rs),
            ]
        return [tape.gradient(losses[0], x)] + [tape.gradient(loss, sq) for loss in losses[1:]]

    d_gather, d_bcast, d_a2a, d_rs = run(mode, fn, x, sq)
    start = sum(r + 1 for r in range(R))
    close(d_gather, weights[start : start + R + 1])  # this rank's rows of the (equal) weights
    close(d_bcast, np.full((N, 2), 3.0 if R == 0 else 0.0))
    # alltoall sends row dst to rank dst, whose loss weighs it by dst + 1
    close(d_a2a, np.repeat(np.arange(1, N + 1, dtype=np.float32)[:, None], 2, 1))
    close(d_rs, np.full((N, 2), float(N)))  # Horovod: allgather(grad * size) for Sum


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_gradient_is_horovods(mode):
    """Horovod's gradient: allgather of the output gradient, times the set size for
    Sum (Average is not divided) and times the pre/postscale factors."""
    rows = 2 * N + 1
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    ups = [np.random.RandomState(90 + r).randn(counts[r], 3).astype(np.float32) for r in range(N)]
    gathered_ups = np.concatenate(ups)  # every rank's upstream gradient, in rank order
    x = tensor(R, shape=(rows, 3), seed=17)

    def fn(x):
        up = tf.constant(ups[R])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            outs = [
                hvd.reducescatter(x, op=hvd.Sum),
                hvd.reducescatter(x, op=hvd.Average),
                hvd.reducescatter(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
                hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0),
            ]
            grouped_sum = hvd.grouped_reducescatter([x, 2.0 * x], op=hvd.Sum)
            grouped_avg = hvd.grouped_reducescatter([x, 2.0 * x], op=hvd.Average)
            losses = [tf.reduce_sum(o * up) for o in outs] + [
                tf.reduce_sum(grouped_sum[0] * up) + tf.reduce_sum(grouped_sum[1] * up),
                tf.reduce_sum(grouped_avg[0] * up) + tf.reduce_sum(grouped_avg[1] * up),
            ]
        return [tape.gradient(loss, x) for loss in losses]

    d_sum, d_avg, d_scaled, d_avg_scaled, d_grouped_sum, d_grouped_avg = run(mode, fn, x)
    close(d_sum, gathered_ups * N)
    close(d_avg, gathered_ups)  # not divided by the set size
    close(d_scaled, gathered_ups * N * 1.5)
    close(d_avg_scaled, gathered_ups * 2.0)
    close(d_grouped_sum, gathered_ups * N * 3.0)
    close(d_grouped_avg, gathered_ups * 3.0)


# ----------------------------------------------- process sets and graph-time basics


@pytest.mark.parametrize("mode", MODES)
def test_process_set_and_graph_time_basics(mode):
    if R in PAIR.ranks:
        out = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, process_set=PAIR), tensor(R))
        close(out, sum(data(r) for r in PAIR.ranks))
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.allreduce(tensor(R), process_set=PAIR)

    def fn():
        return [
            hvd.size_op(),
            hvd.rank_op(),
            hvd.local_size_op(),
            hvd.local_rank_op(),
            hvd.size_op(process_set_id=PAIR.process_set_id),
            hvd.process_set_included_op(PAIR.process_set_id),
        ]

    got = [int(v) for v in run(mode, fn)]
    assert got == [N, R, hvd.local_size(), hvd.local_rank(), len(PAIR.ranks), int(R in PAIR.ranks)]


@pytest.mark.parametrize("mode", MODES)
def test_gradient_tape_over_a_process_set(mode):
    w = tf.Variable(np.ones(3, np.float32))

    def fn(scale):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * scale)
        return hvd.DistributedGradientTape(tape, process_set=PAIR).gradient(loss, [w])[0]

    grad = run(mode, fn, tf.constant(float(R + 1)))
    expected = np.mean([r + 1 for r in PAIR.ranks]) if R in PAIR.ranks else R + 1
    close(grad, np.full(3, expected))  # outside the set: the local gradient, unchanged


@pytest.mark.parametrize("mode", MODES)
def test_barrier_and_join(mode):
    out = run(mode, hvd.barrier)
    assert (out is None) == (mode == "eager")
    last = run(mode, hvd.join)
    assert last.dtype == tf.int32 and 0 <= int(last) < N
    assert hvd.allgather_object(int(last)) == [int(last)] * N


def test_objects():
    assert hvd.broadcast_object({"rank": R, "payload": list(range(R))}, root_rank=N - 1) == {
        "rank": N - 1,
        "payload": list(range(N - 1)),
    }
    assert hvd.broadcast_object_fn(root_rank=0)(("x", R)) == ("x", 0)
    assert hvd.allgather_object({"r": R}) == [{"r": r} for r in range(N)]


# ------------------------------------------------------------------ misuse


def test_misuse_is_reported_at_call_time():
    x = tensor(R)
    with pytest.raises(ValueError, match="complex64"):
        hvd.allreduce(tf.complex(x, x))
    with pytest.raises(ValueError, match="bool tensor"):
        hvd.allreduce(tf.constant([True, False]), op=hvd.Sum)
    with pytest.raises(ValueError, match="root_rank 7"):
        hvd.broadcast(x, 7)
    with pytest.raises(ValueError, match="rank >= 1"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(ValueError, match="Sum and op=Average"):
        hvd.reducescatter(x, op=hvd.Max)
    with pytest.raises(ValueError, match="not registered|not a member"):
        hvd.allreduce(x, process_set=hvd.ProcessSet([0]))
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)


def test_mismatched_shapes_raise_on_every_rank():
    x = tf.zeros((R + 2,))
    # Horovod's TF class; eagerly also hvdlite's HorovodInternalError
    with pytest.raises(tf.errors.FailedPreconditionError, match="Mismatched shape") as info:
        hvd.allreduce(x, name="tf_mismatch_eager")
    assert isinstance(info.value, hvd.HorovodInternalError)
    with pytest.raises(tf.errors.FailedPreconditionError, match="Mismatched shape"):
        tf.function(lambda t: hvd.allreduce(t, name="tf_mismatch_graph"))(x)
    # the job goes on: a correct collective still works afterwards
    close(hvd.allreduce(tensor(R), op=hvd.Sum), np.sum(everyone(), 0))


def test_bfloat16_on_one_rank_and_float32_on_another_fail_on_every_rank():
    # the engine is handed float32 (reductions) or int16 bits (the rest) on both
    # sides; the TensorFlow dtype names are what tells the ranks apart
    wide = tf.bfloat16 if R == 0 else tf.float32
    with pytest.raises(tf.errors.FailedPreconditionError, match="dtype"):
        hvd.allreduce(tf.ones(3, wide), name="tf_mismatch_bf16")
    bits = tf.bfloat16 if R == 0 else tf.int16
    with pytest.raises(tf.errors.FailedPreconditionError, match="dtype"):
        hvd.allgather(tf.ones((1, 2), bits), name="tf_mismatch_bf16_bits")
    with pytest.raises(tf.errors.FailedPreconditionError, match="dtype"):
        hvd.broadcast(tf.ones(2, bits), 0, name="tf_mismatch_bf16_broadcast")
    same = hvd.allreduce(tf.ones(3, tf.bfloat16), op=hvd.Sum, name="tf_bf16_agreed")
    assert same.dtype == tf.bfloat16 and float(same[0]) == N


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_bfloat16_gradients_on_one_rank_and_float32_on_another_fail_on_every_rank(mode):
    # the gradient path widens bfloat16 to float32 (packed with other small float32
    # gradients in a graph): its dtype names are what tells the ranks apart
    wide = tf.bfloat16 if R == 0 else tf.float32
    w, b = tf.Variable(tf.ones(3, wide)), tf.Variable(tf.ones(2))

    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.cast(w, tf.float32)) + tf.reduce_sum(b)
        return hvd.DistributedGradientTape(tape).gradient(loss, [w, b])

    fn = tf.function(gradients) if mode == "graph" else gradients
    with pytest.raises((tf.errors.FailedPreconditionError, hvd.HorovodInternalError)) as info:
        fn()
    assert "dtype" in str(info.value) and "bfloat16" in str(info.value)
    same = hvd.allreduce(tf.ones(3, tf.bfloat16), op=hvd.Sum, name=f"tf_bf16_grad_{mode}")
    assert float(same[0]) == N


def test_mpi_world_matches():
    assert (R, N) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
