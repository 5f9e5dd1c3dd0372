"""hvdlite.tensorflow pieces that need no MPI job: compression, naming, wrappers, callbacks.

Nothing here calls ``hvd.init()`` in the pytest process; the one-process run
(size 1: collectives are identities, training is plain training) happens in a
subprocess.
"""

import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import hvdlite.tensorflow as hvd  # noqa: E402
import hvdlite.tensorflow.keras as hk  # noqa: E402
from hvdlite.exceptions import ArgumentError, HorovodInternalError, MismatchError  # noqa: E402
from hvdlite.tensorflow import _bridge, _errors  # noqa: E402
from hvdlite._optimizer_args import split_groups  # noqa: E402
from hvdlite.tensorflow.gradient_reduction import normalize_groups  # noqa: E402
from hvdlite.tensorflow.keras.callbacks import LearningRateScheduleCallback  # noqa: E402


# ---------------------------------------------------------------- compression


def test_none_compression_is_identity():
    x = tf.constant([1.5, 2.5])
    out, ctx = hvd.Compression.none.compress(x)
    assert out is x and hvd.Compression.none.decompress(out, ctx) is x


@pytest.mark.parametrize("name,wire", [("fp16", tf.float16), ("bf16", tf.bfloat16)])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_cast_compression_round_trip(name, wire, dtype):
    comp = getattr(hvd.Compression, name)
    x = tf.constant([0.1, -2.0, 300.0], dtype=dtype)
    out, ctx = comp.compress(x)
    assert out.dtype == wire
    back = comp.decompress(out, ctx)
    assert back.dtype == dtype
    np.testing.assert_allclose(back.numpy(), x.numpy(), rtol=1e-2)


def test_cast_compression_leaves_integers_alone():
    x = tf.constant([1, 2], dtype=tf.int32)
    out, ctx = hvd.Compression.fp16.compress(x)
    assert out.dtype == tf.int32 and hvd.Compression.fp16.decompress(out, ctx).dtype == tf.int32


# ------------------------------------------------------------- names and dtypes


def test_graph_names_count_collectives_per_graph():
    names = []

    @tf.function
    def f(x):
        names.extend(
            [
                _bridge.op_name("Allreduce", [x], None),
                _bridge.op_name("Allreduce", [x], None),
                _bridge.op_name("Allgather", [x], None),
            ]
        )
        with tf.name_scope("outer"):
            names.extend(
                [
                    _bridge.op_name("Allreduce", [x], "mine"),
                    _bridge.op_name("Allreduce", [x], "mine"),
                    _bridge.op_name("Allreduce", [x], "bare", ignore_name_scope=True),
                ]
            )
        return x

    f(tf.constant(1.0))
    assert names == [
        "HorovodAllreduce_0",
        "HorovodAllreduce_1",
        "HorovodAllgather_0",
        "outer/mine",
        "outer/mine_1",
        "bare",
    ]
    names.clear()
    f(tf.constant([1.0, 2.0]))  # a retrace is a new graph: the same names again
    assert names[:3] == ["HorovodAllreduce_0", "HorovodAllreduce_1", "HorovodAllgather_0"]
    assert _bridge.op_name("Allreduce", [], None) is None  # eager: engine counter
    assert _bridge.op_name("Allreduce", [], "given") == "given"


def test_dtype_checks_name_the_fix():
    _bridge.check_dtype(tf.bfloat16, "allreduce", op=hvd.Sum)
    with pytest.raises(ValueError, match="complex128.*Cast the tensor"):
        _bridge.check_dtype(tf.complex128, "allreduce")
    with pytest.raises(ValueError, match="bool tensor"):
        _bridge.check_dtype(tf.bool, "allreduce", op=hvd.Average)
    _bridge.check_dtype(tf.bool, "allreduce", op=hvd.Max)


def test_xla_compiled_functions_are_refused_with_the_fix():
    @tf.function(jit_compile=True)
    def f(x):
        return _bridge.run(lambda a, outputs=None: [a], [x], [x.dtype], [x.shape])[0]

    with pytest.raises(ValueError, match="jit_compile=False"):
        f(tf.constant(1.0))


# ------------------------------------------------------ graph order and errors


def _node(x, fn=None, **kw):
    """One bridge node of ``fn`` (default: identity) on ``x``."""
    fn = fn or (lambda a, outputs=None: [a])
    return _bridge.run(fn, [x], [x.dtype], [x.shape], **kw)[0]


def _pyfuncs(graph):
    return [op for op in graph.get_operations() if op.type == "PyFunc"]


def test_collectives_of_a_tf1_graph_run_in_creation_order():
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        a, b = v1.placeholder(tf.float32, [2]), v1.placeholder(tf.float32, [2])
        outs = [_node(a), _node(b), _node(a, ordered=False), _node(b, collective=False), _node(a)]
        first, second, alone, local, third = _pyfuncs(graph)
        # a v1 while loop keeps its own chain: nothing crosses its frame
        v1.disable_control_flow_v2()
        try:
            looped = v1.while_loop(
                lambda i, t: i < 2, lambda i, t: (i + 1, _node(t)), [tf.constant(0), a]
            )[1]
        finally:
            v1.enable_control_flow_v2()
        in_loop = _pyfuncs(graph)[-1]
        after = _node(b)
        with v1.Session(graph=graph) as sess:
            got = sess.run(outs + [looped, after], {a: [1.0, 2.0], b: [3.0, 4.0]})
    assert first.control_inputs == [] and second.control_inputs == [first]
    assert alone.control_inputs == [] and local.control_inputs == []
    assert third.control_inputs == [second]
    assert all(op not in in_loop.control_inputs for op in (first, second, third))
    assert _pyfuncs(graph)[-1].control_inputs == [third]
    assert [g.tolist() for g in got] == [[1.0, 2.0], [3.0, 4.0]] * 2 + [[1.0, 2.0]] * 2 + [
        [3.0, 4.0]
    ]


def _raising(error):
    def fn(a, outputs=None):
        raise error

    return fn


@pytest.mark.parametrize(
    "error,eager,graph",
    [
        (
            MismatchError("Mismatched shapes for allreduce 'x': rank 0: [2]; rank 1: [3]."),
            (tf.errors.FailedPreconditionError, HorovodInternalError, MismatchError),
            tf.errors.FailedPreconditionError,
        ),
        (
            ArgumentError("alltoall: splits must be 2 non-negative ints"),
            (tf.errors.InvalidArgumentError, ArgumentError, ValueError),
            tf.errors.InvalidArgumentError,
        ),
        (
            ValueError("alltoall: splits must be 2 non-negative ints"),
            (tf.errors.InvalidArgumentError, ArgumentError),
            tf.errors.InvalidArgumentError,
        ),
        (
            HorovodInternalError("hvdlite was shut down"),
            (HorovodInternalError,),
            tf.errors.UnknownError,
        ),
    ],
)
def test_engine_errors_take_horovods_tensorflow_classes(error, eager, graph):
    x = tf.constant([1.0, 2.0])
    fn = _raising(error)
    with pytest.raises(eager[0]) as info:
        _node(x, fn)
    assert all(isinstance(info.value, cls) for cls in eager)
    assert str(error) in str(info.value)
    with pytest.raises(graph, match=str(error)[:20]):
        tf.function(lambda t: _node(t, fn))(x)
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.Session(graph=g) as sess:
        out = _node(tf.constant([1.0, 2.0]), fn)
        with pytest.raises(graph, match=str(error)[:20]):
            sess.run(out)


def test_trace_time_argument_errors_keep_their_class_through_autograph():
    def build(t):
        raise _errors.ArgumentError(message="hvdlite reducescatter supports op=Sum")

    with pytest.raises(tf.errors.InvalidArgumentError, match="op=Sum") as info:
        tf.function(build)(tf.constant(1.0))
    assert isinstance(info.value, ValueError)


def test_bfloat16_wire_round_trip_is_exact():
    x = tf.constant([1.0078125, -3.5, 65280.0], dtype=tf.bfloat16)
    moved = _bridge.to_wire(x, reduce=False)
    assert moved.dtype == tf.int16
    assert (
        _bridge.from_wire(moved, tf.bfloat16, reduce=False).numpy().tolist() == x.numpy().tolist()
    )
    assert _bridge.to_wire(x, reduce=True).dtype == tf.float32


def test_groups_normalization_and_split():
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert normalize_groups(3, None) == 3
    assert normalize_groups(0, None) is None
    with pytest.raises(ValueError, match="groups"):
        normalize_groups(0, 0)
    assert split_groups(list(range(5)), 2, None) == [[0, 1], [2, 3, 4]]
    assert split_groups([0, 1], 4, None) == [[0], [1]]


# ------------------------------------------------------------ keras optimizer


def test_distributed_optimizer_keeps_class_config_and_reloads_plain(tmp_path):
    sgd = keras.optimizers.SGD(0.25, momentum=0.5, nesterov=True)
    opt = hk.DistributedOptimizer(sgd, backward_passes_per_step=2)
    assert isinstance(opt, keras.optimizers.SGD) and type(opt).__name__ == "SGD"
    assert type(opt).__module__ == type(sgd).__module__
    assert opt.get_config() == sgd.get_config() | {"name": opt.get_config()["name"]}
    assert opt is not sgd and not hasattr(sgd, "_hvd")
    import hvdlite

    via_top = hvdlite.DistributedOptimizer(keras.optimizers.Adam(0.1))
    assert isinstance(via_top, keras.optimizers.Adam) and hasattr(via_top, "_hvd")
    tf1 = hvdlite.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    assert isinstance(tf1, tf.compat.v1.train.Optimizer)  # Horovod's TF1 wrapper
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.SGD  # no hvdlite needed to reload


def test_momentum_correction_scales_the_momentum_buffers():
    opt = keras.optimizers.SGD(0.1, momentum=0.9)
    var = keras.Variable(np.ones(3, np.float32))
    opt.build([var])
    opt.momentums[0].assign(np.array([1.0, 2.0, 3.0], np.float32))
    LearningRateScheduleCallback._correct_momentum(opt, 0.5)
    np.testing.assert_allclose(opt.momentums[0].numpy(), [0.5, 1.0, 1.5])
    plain = keras.optimizers.Adam(0.1)  # no momentum buffers: nothing to do
    plain.build([var])
    LearningRateScheduleCallback._correct_momentum(plain, 0.5)


def test_schedule_callback_needs_initial_lr_and_known_epoch_length():
    with pytest.raises(ValueError, match="initial_lr"):
        LearningRateScheduleCallback(None, 0.5)
    cb = LearningRateScheduleCallback(0.1, lambda e: 1.0, staircase=False)
    cb.set_params({"epochs": 1, "steps": None})
    with pytest.raises(ValueError, match="steps_per_epoch"):
        cb.on_train_begin()


def test_import_does_not_need_keras_for_tensorflow_ops():
    code = (
        "import sys, hvdlite.tensorflow as h; "
        "assert 'hvdlite.tensorflow.keras' not in sys.modules; "
        "assert 'hvdlite.tensorflow.sync_batch_norm' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        timeout=120,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )


# ----------------------------------------------------------- one-process run

ONE_PROCESS = textwrap.dedent("""
    import numpy as np, tensorflow as tf, keras
    import hvdlite.tensorflow as hvd, hvdlite.tensorflow.keras as hk
    tf.config.threading.set_intra_op_parallelism_threads(1)
    hvd.init()
    assert (hvd.size(), hvd.rank()) == (1, 0)
    x = tf.constant([[1.0, 2.0]])
    assert hvd.allreduce(x).numpy().tolist() == [[1.0, 2.0]]
    assert hvd.allgather(x).shape == (1, 2)
    assert tf.function(lambda t: hvd.broadcast(t, 0))(x).numpy().tolist() == [[1.0, 2.0]]
    w = tf.Variable([3.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    (g,) = hvd.DistributedGradientTape(tape).gradient(loss, [w])
    assert g.numpy().tolist() == [6.0]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(hk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    data = np.random.rand(8, 2).astype("float32"), np.random.rand(8, 1).astype("float32")
    hist = model.fit(*data, batch_size=4, epochs=2, verbose=0, callbacks=[
        hk.callbacks.BroadcastGlobalVariablesCallback(0), hk.callbacks.MetricAverageCallback(),
        hk.callbacks.LearningRateWarmupCallback(0.1, warmup_epochs=1)])
    assert len(hist.history["loss"]) == 2 and hist.history["lr"][-1] == np.float32(0.1)
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():                        # TF1: optimizer wrapper and broadcast
        v = v1.Variable([1.0, 2.0])
        opt = hvd.DistributedOptimizer(v1.train.GradientDescentOptimizer(0.5))
        train = opt.minimize(tf.reduce_sum(v * v))
        bcast = hvd.broadcast_global_variables(0)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            sess.run([bcast])
            sess.run(train)
            assert sess.run(v).tolist() == [0.0, 0.0]
    print("one-process ok")
""")


def test_one_process_job_runs_plainly():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")]
    )
    out = subprocess.run(
        [sys.executable, "-c", ONE_PROCESS], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0 and "one-process ok" in out.stdout, out.stderr[-3000:]


def test_sharding_is_refused_for_keras_and_tf1_optimizers_naming_why():
    """shard_optimizer_state is torch's: the Keras and TF1 wrappers refuse it, saying
    why and what to do, before any collective (so every rank raises it alike)."""
    with pytest.raises(NotImplementedError, match="builds its state for every variable"):
        hk.DistributedOptimizer(keras.optimizers.Adam(0.1), shard_optimizer_state=True)
    with pytest.raises(NotImplementedError, match="Drop the argument"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(0.1), shard_optimizer_state=True)
    legacy = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(NotImplementedError, match="tf.compat.v1 optimizer creates its slots"):
        hvd.DistributedOptimizer(legacy, shard_optimizer_state=True)
