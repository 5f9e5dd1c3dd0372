"""hvdlite.tensorflow in graphs, as Horovod's TensorFlow ops behave.

* a ``tf.compat.v1`` Session.run of independent collectives, and a
  ``tf.function`` of independent collectives, finish on every rank (Horovod's
  asynchronous kernels never deadlock on the order TensorFlow picks), fused
  and unfused;
* Horovod's error classes: a mismatch across ranks raises
  ``tf.errors.FailedPreconditionError``, a bad argument
  ``tf.errors.InvalidArgumentError``, eagerly, in a ``tf.function`` and in a
  Session; the job goes on afterwards;
* TF1 helpers: ``broadcast_global_variables`` (and its hook), ``broadcast_``
  returning the assigned values, ``DistributedOptimizer`` over a
  ``tf.compat.v1.train.Optimizer``.

Every rank builds every rank's inputs from seeded generators, so expected
results are computed locally.
"""

import os

from tf_helpers import single_threaded_tensorflow

# A deadlock must fail the test, not hang it: the stall inspector cancels it.
tf = single_threaded_tensorflow(stall_shutdown_seconds=30)

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite.tensorflow as hvd  # noqa: E402

MPI_SIZES = (2, 3)

# The world without its last rank: that rank is outside the set.
PAIR = hvd.ProcessSet(list(range(MPI.COMM_WORLD.size - 1)))
hvd.init(process_sets=[PAIR])
R, N = hvd.rank(), hvd.size()
v1 = tf.compat.v1


def data(rank, shape, seed=0):
    return np.random.RandomState(1000 * seed + rank).randn(*shape)


def session(graph, threads=1):
    config = v1.ConfigProto(inter_op_parallelism_threads=threads, intra_op_parallelism_threads=1)
    return v1.Session(graph=graph, config=config)


@pytest.fixture(params=["fused", "unfused"])
def fusion(request):
    """The engine restarted with the default fusion threshold, or with fusion off
    (the knob must be equal on every rank: every rank sets the same value)."""

    def restart(threshold):
        hvd.shutdown()
        if threshold is None:
            os.environ.pop("HVDLITE_FUSION_THRESHOLD", None)
        else:
            os.environ["HVDLITE_FUSION_THRESHOLD"] = threshold
        hvd.init(process_sets=[PAIR])

    restart(None if request.param == "fused" else "0")
    yield request.param
    restart(None)


# ------------------------------------------------------------------ ordering


def independent_collectives(feed, step):
    """Eight collectives with no order between them (Horovod's test shape):
    allreduces, allgathers and reducescatters of one placeholder each, and the
    expected result of each for ``step``."""
    rows = 2 * N + 1
    specs = [
        ("allreduce", (3,), hvd.Sum),
        ("allgather", None, None),
        ("reducescatter", (rows, 2), hvd.Sum),
        ("allreduce", (2, 2), hvd.Average),
        ("allgather", None, None),
        ("reducescatter", (N, 3), hvd.Average),
        ("allreduce", (5,), hvd.Max),
        ("reducescatter", (rows,), hvd.Sum),
    ]
    ops, expected = [], []
    for i, (kind, shape, op) in enumerate(specs):
        if kind == "allgather":
            shape_of = lambda r, i=i: (r + 1 + i % 2, 2)  # noqa: E731  (uneven first dims)
        else:
            shape_of = lambda r, shape=shape: shape  # noqa: E731
        values = [data(r, shape_of(r), seed=10 * step + i).astype(np.float32) for r in range(N)]
        ph = v1.placeholder(tf.float32, shape_of(R))
        feed[ph] = values[R]
        if kind == "allreduce":
            ops.append(hvd.allreduce(ph, op=op))
            stacked = np.stack(values)
            expected.append(
                {hvd.Sum: stacked.sum(0), hvd.Average: stacked.mean(0), hvd.Max: stacked.max(0)}[op]
            )
        elif kind == "allgather":
            ops.append(hvd.allgather(ph))
            expected.append(np.concatenate(values))
        else:
            ops.append(hvd.reducescatter(ph, op=op))
            total = np.sum(values, 0) / (N if op == hvd.Average else 1)
            n_rows = shape[0]
            mine = [n_rows // N + (1 if r < n_rows % N else 0) for r in range(N)]
            lo = sum(mine[:R])
            expected.append(total[lo : lo + mine[R]])
    return ops, expected


@pytest.mark.parametrize("threads", [1, 4])
def test_session_run_of_independent_collectives(fusion, threads):
    for step in range(3):
        graph = tf.Graph()
        with graph.as_default():
            feed = {}
            ops, expected = independent_collectives(feed, step)
            with session(graph, threads) as sess:
                for _ in range(2):  # the same graph again: the same order
                    got = sess.run(ops, feed_dict=feed)
                    for g, e in zip(got, expected, strict=True):
                        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_tf_function_of_independent_collectives(fusion):
    xs = [tf.constant(data(R, (4,), seed=s), tf.float32) for s in range(8)]

    @tf.function
    def step(*xs):
        return (
            [hvd.allreduce(x, op=hvd.Sum) for x in xs[:4]]
            + [hvd.allgather(x) for x in xs[4:6]]
            + [hvd.reducescatter(tf.reshape(x, (4, 1)), op=hvd.Sum) for x in xs[6:]]
        )

    for _ in range(3):
        outs = step(*xs)
        for s in range(4):
            np.testing.assert_allclose(
                outs[s], np.sum([data(r, (4,), seed=s) for r in range(N)], 0), rtol=1e-5
            )
        for s in (4, 5):
            np.testing.assert_allclose(
                outs[s], np.concatenate([data(r, (4,), seed=s) for r in range(N)]), rtol=1e-5
            )
        counts = [4 // N + (1 if r < 4 % N else 0) for r in range(N)]
        lo = sum(counts[:R])
        for s in (6, 7):
            total = np.sum([data(r, (4,), seed=s) for r in range(N)], 0)
            np.testing.assert_allclose(outs[s][:, 0], total[lo : lo + counts[R]], rtol=1e-5)


@pytest.fixture(params=["shared memory", "MPI"])
def allreduce_path(request):
    """The engine restarted with the shared-memory allreduce on (what ranks of one
    node use) or off, so that gradients take either of the reducer's graph plans."""

    def restart(disable):
        hvd.shutdown()
        if disable:
            os.environ["HVDLITE_SHM_ALLREDUCE_DISABLE"] = "1"
        else:
            os.environ.pop("HVDLITE_SHM_ALLREDUCE_DISABLE", None)
        hvd.init(process_sets=[PAIR])

    restart(request.param == "MPI")
    yield request.param
    restart(False)


def test_results_of_a_tf_function_outlive_its_next_run(allreduce_path):
    """TensorFlow takes a numpy function's aligned output arrays as its tensors'
    memory: the collectives must hand out new memory every run, or the next run
    rewrites the tensors an earlier run returned."""
    from hvdlite.tensorflow.gradient_reduction import GradientReducer

    # Sizes around alignment boundaries, small (packed in a graph) and large.
    shapes = [(1,), (1000,), (1001,), (1002,), (1003,), (3, 5), (70000,), (300, 64)]
    xs = [tf.constant(np.arange(np.prod(s), dtype=np.float32).reshape(s) % 7 + R) for s in shapes]
    reducer = GradientReducer(op=hvd.Sum)

    @tf.function
    def step(scale):
        scaled = [x * scale for x in xs]
        return (
            hvd.grouped_allreduce(scaled, op=hvd.Sum)
            + [hvd.allreduce(x, op=hvd.Sum) for x in scaled[:4]]
            + [hvd.broadcast(x, root_rank=0) for x in scaled[4:]]
            + reducer(scaled)
        )

    def expected(scale):
        total = [sum((x.numpy() - R + r) * scale for r in range(N)) for x in xs]
        root = [(x.numpy() - R) * scale for x in xs[4:]]
        return total + total[:4] + root + total

    first = step(tf.constant(1.0))
    second = step(tf.constant(2.0))
    for got, want in zip(first, expected(1.0), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    for got, want in zip(second, expected(2.0), strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


# ------------------------------------------------------------------ error classes

MODES = ["eager", "function", "session"]


def run_in(mode, build, *inputs):
    """``build(*inputs)`` eagerly, traced into a tf.function, or in a TF1 Session."""
    if mode == "eager":
        return build(*inputs)
    if mode == "function":
        return tf.function(build)(*inputs)
    graph = tf.Graph()
    with graph.as_default():
        placeholders = [
            v1.placeholder(tf.as_dtype(np.asarray(x).dtype), np.shape(x)) for x in inputs
        ]
        out = build(*placeholders)
        with session(graph) as sess:
            return sess.run(out, feed_dict=dict(zip(placeholders, inputs, strict=True)))


def still_works():
    out = hvd.allreduce(tf.ones(3), op=hvd.Sum)
    np.testing.assert_allclose(out, np.full(3, float(N)))


@pytest.mark.parametrize("mode", MODES)
def test_mismatches_raise_failed_precondition(mode):
    cases = [
        # shapes differ
        (lambda x: hvd.allreduce(x, name="mm.shape"), np.zeros(R + 2, np.float32)),
        # dtypes differ
        (
            lambda x: hvd.allgather(x, name="mm.dtype"),
            np.zeros((2, 2), np.float32 if R == 0 else np.float64),
        ),
        # root ranks differ
        (lambda x: hvd.broadcast(x, root_rank=R, name="mm.root"), np.zeros(2, np.float32)),
        # trailing dimensions differ
        (
            lambda x: hvd.reducescatter(x, op=hvd.Sum, name="mm.rs"),
            np.zeros((N, R + 1), np.float32),
        ),
        (lambda x: hvd.alltoall(x, name="mm.a2a"), np.zeros((N, R + 1), np.float32)),
    ]
    for build, value in cases:
        with pytest.raises(tf.errors.FailedPreconditionError, match="Mismatched") as info:
            run_in(mode, build, value)
        if mode == "eager":  # also hvdlite's (and Horovod's torch) class
            assert isinstance(info.value, hvd.HorovodInternalError)
        still_works()


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_raise_invalid_argument(mode):
    x = np.arange(2.0 * N, dtype=np.float32).reshape(N, 2)
    cases = [
        lambda t: hvd.reducescatter(t, op=hvd.Adasum),
        lambda t: hvd.broadcast(t, root_rank=N + 3),
        lambda t: hvd.alltoall(t, splits=[1] * (N + 1)),  # one split per rank, or bust
        lambda t: hvd.allgather(t[0, 0]),  # a scalar
    ]
    if R not in PAIR.ranks:
        cases.append(lambda t: hvd.allreduce(t, process_set=PAIR))
    for build in cases:
        with pytest.raises(tf.errors.InvalidArgumentError) as info:
            run_in(mode, build, x)
        if mode == "eager":
            assert isinstance(info.value, ValueError)
    still_works()


@pytest.mark.parametrize("mode", ["function", "session"])
def test_splits_known_only_when_the_graph_runs(mode):
    """Split lengths checked by the engine at run time: InvalidArgumentError too."""
    x = np.ones((N + 1, 2), np.float32)
    splits = np.ones(N + 1, np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits"):
        run_in(mode, lambda t, s: hvd.alltoall(t, splits=s)[0], x, splits)
    still_works()


# ------------------------------------------------------------------ join


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_join_returns_the_last_rank_to_join_on_every_rank(mode):
    """Horovod: joined ranks contribute zeros to the others' allreduces, and
    join() returns the last rank to join, the same everywhere."""
    last = N - 1

    def work():
        outs = []
        if R == last:  # one more batch than the others
            outs.append(hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"join.extra.{mode}"))
        return outs + [hvd.join()]

    outs = work() if mode == "eager" else tf.function(work)()
    if R == last:
        np.testing.assert_array_equal(outs[0], [1.0, 1.0])  # the others gave zeros
    assert int(outs[-1]) == last
    still_works()


# ------------------------------------------------------------------ TF1 helpers


def test_broadcast_global_variables_and_hook():
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)  # eagerly, as Horovod
    root = N - 1
    graph = tf.Graph()
    with graph.as_default():
        a = v1.Variable(data(R, (3,), seed=1).astype(np.float32), name="a")
        b = v1.Variable(np.full(2, R, np.int64), name="b")
        feed = v1.placeholder(tf.float32, [3])
        hvd.allreduce(feed)  # a collective that needs a feed, built before
        bcast = hvd.broadcast_global_variables(root)
        with session(graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(bcast)  # runs on its own: no feed needed
            np.testing.assert_allclose(sess.run(a), data(root, (3,), seed=1), rtol=1e-6)
            np.testing.assert_array_equal(sess.run(b), [root, root])

    graph = tf.Graph()
    with graph.as_default():
        c = v1.Variable(np.full(2, float(R), np.float32), name="c")
        hook = hvd.BroadcastGlobalVariablesHook(0)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            np.testing.assert_array_equal(sess.run(c), [0.0, 0.0])


def test_broadcast_inplace_in_a_graph_returns_the_assigned_value():
    graph = tf.Graph()
    with graph.as_default():
        v = v1.Variable(np.full(3, float(R), np.float32))
        ref = v1.Variable(np.full(2, float(R), np.float32), use_resource=False)
        new_v = hvd.broadcast_(v, root_rank=N - 1)
        new_pair = hvd.broadcast_([v, ref], root_rank=0)
        with session(graph) as sess:
            sess.run(v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(new_v), np.full(3, N - 1.0))
            np.testing.assert_array_equal(sess.run(v), np.full(3, N - 1.0))
            got_v, got_ref = sess.run(new_pair)  # v is N - 1 everywhere by now
            np.testing.assert_array_equal(got_v, np.full(3, N - 1.0))
            np.testing.assert_array_equal(got_ref, np.zeros(2))


def test_distributed_optimizer_over_a_tf1_optimizer():
    batch, features, steps, lr = 4, 3, 3, 0.1
    rs = np.random.RandomState(7)
    xs = rs.randn(steps, N * batch, features).astype(np.float32)
    ys = rs.randn(steps, N * batch, 1).astype(np.float32)
    w0 = data(R, (features, 1), seed=3).astype(np.float32)  # differs per rank

    def model():
        x = v1.placeholder(tf.float32, [None, features])
        y = v1.placeholder(tf.float32, [None, 1])
        w = v1.Variable(w0, name="w")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        return x, y, w, loss

    graph = tf.Graph()
    with graph.as_default():
        x, y, w, loss = model()
        opt = hvd.DistributedOptimizer(v1.train.MomentumOptimizer(lr, 0.9))
        assert isinstance(opt, v1.train.Optimizer)
        grads = opt.compute_gradients(loss, var_list=[w])
        train = opt.minimize(loss)
        bcast = hvd.broadcast_global_variables(0)
        assert opt.get_slot_names() == ["momentum"]
        with session(graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(bcast)
            mine = slice(R * batch, (R + 1) * batch)
            g = sess.run(grads[0][0], {x: xs[0][mine], y: ys[0][mine]})
            for s in range(steps):
                sess.run(train, {x: xs[s][mine], y: ys[s][mine]})
            got = sess.run(w)

    # One process on the global batch, from rank 0's initial weights.
    reference = tf.Graph()
    with reference.as_default():
        x, y, w, loss = model()
        sess_init = w.assign(data(0, (features, 1), seed=3).astype(np.float32))
        grad = tf.gradients(loss, [w])[0]
        train = v1.train.MomentumOptimizer(lr, 0.9).minimize(loss)
        with v1.Session(graph=reference) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run(sess_init)
            expected_g = sess.run(grad, {x: xs[0], y: ys[0]})
            for s in range(steps):
                sess.run(train, {x: xs[s], y: ys[s]})
            expected = sess.run(w)
    np.testing.assert_allclose(g, expected_g, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(lr), op=hvd.Adasum)


@pytest.fixture(params=["cond_v2", "cond_v1"])
def control_flow(request):
    """TF2 control flow (the default), or TF1's, as scripts that call
    ``tf.compat.v1.disable_v2_behavior()`` get it."""
    if request.param == "cond_v1":
        v1.disable_control_flow_v2()
    yield request.param
    v1.enable_control_flow_v2()


@pytest.mark.parametrize("average", [False, True])
def test_tf1_optimizer_aggregates_backward_passes(average, control_flow):
    """backward_passes_per_step=2: the first pass only accumulates (and advances the
    global step), the second reduces the sum (or mean) of both and applies it."""
    batch, features, lr = 4, 3, 0.1
    rs = np.random.RandomState(11)
    xs = rs.randn(2, N * batch, features).astype(np.float32)
    ys = rs.randn(2, N * batch, 1).astype(np.float32)
    w0 = np.ones((features, 1), np.float32)
    mine = slice(R * batch, (R + 1) * batch)

    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, features])
        y = v1.placeholder(tf.float32, [None, 1])
        w = v1.Variable(w0)
        step = v1.train.get_or_create_global_step()
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        opt = hvd.DistributedOptimizer(
            v1.train.GradientDescentOptimizer(lr),
            backward_passes_per_step=2,
            average_aggregated_gradients=average,
        )
        train = opt.minimize(loss, global_step=step)
        with session(graph) as sess:
            sess.run([v1.global_variables_initializer(), v1.local_variables_initializer()])
            sess.run(train, {x: xs[0][mine], y: ys[0][mine]})
            np.testing.assert_array_equal(sess.run(w), w0)
            assert sess.run(step) == 1
            sess.run(train, {x: xs[1][mine], y: ys[1][mine]})
            got = sess.run(w)
            assert sess.run(step) == 2

    def grad(xb, yb):  # d/dw mean((xw - y)^2)
        return 2.0 / len(xb) * xb.T @ (xb @ w0 - yb)

    per_rank = [
        sum(
            grad(xs[p][r * batch : (r + 1) * batch], ys[p][r * batch : (r + 1) * batch])
            for p in range(2)
        )
        for r in range(N)
    ]
    applied = np.mean(per_rank, 0) / (2 if average else 1)
    np.testing.assert_allclose(got, w0 - lr * applied, rtol=1e-5, atol=1e-6)
