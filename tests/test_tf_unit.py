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
from hvdlite.tensorflow import _bridge  # noqa: E402
from hvdlite.tensorflow.gradient_reduction import _split_evenly, normalize_groups  # noqa: E402
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
        names.extend([_bridge.op_name("Allreduce", [x], None),
                      _bridge.op_name("Allreduce", [x], None),
                      _bridge.op_name("Allgather", [x], None)])
        with tf.name_scope("outer"):
            names.extend([_bridge.op_name("Allreduce", [x], "mine"),
                          _bridge.op_name("Allreduce", [x], "mine"),
                          _bridge.op_name("Allreduce", [x], "bare", ignore_name_scope=True)])
        return x

    f(tf.constant(1.0))
    assert names == ["HorovodAllreduce_0", "HorovodAllreduce_1", "HorovodAllgather_0",
                     "outer/mine", "outer/mine_1", "bare"]
    names.clear()
    f(tf.constant([1.0, 2.0]))  # a retrace is a new graph: the same names again
    assert names[:3] == ["HorovodAllreduce_0", "HorovodAllreduce_1", "HorovodAllgather_0"]
    assert _bridge.op_name("Allreduce", [], None) is None          # eager: engine counter
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


def test_bfloat16_wire_round_trip_is_exact():
    x = tf.constant([1.0078125, -3.5, 65280.0], dtype=tf.bfloat16)
    moved = _bridge.to_wire(x, reduce=False)
    assert moved.dtype == tf.int16
    assert _bridge.from_wire(moved, tf.bfloat16, reduce=False).numpy().tolist() == \
        x.numpy().tolist()
    assert _bridge.to_wire(x, reduce=True).dtype == tf.float32


def test_groups_normalization_and_split():
    with pytest.warns(DeprecationWarning, match="num_groups"):
        assert normalize_groups(3, None) == 3
    assert normalize_groups(0, None) is None
    with pytest.raises(ValueError, match="groups"):
        normalize_groups(0, 0)
    assert _split_evenly(list(range(5)), 2) == [[0, 1], [2, 3, 4]]
    assert _split_evenly([0, 1], 4) == [[0], [1]]


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
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=opt, loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras.optimizers.SGD    # no hvdlite needed to reload


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
    code = ("import sys, hvdlite.tensorflow as h; "
            "assert 'hvdlite.tensorflow.keras' not in sys.modules; "
            "assert 'hvdlite.tensorflow.sync_batch_norm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


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
    print("one-process ok")
""")


def test_one_process_job_runs_plainly():
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", ONE_PROCESS], capture_output=True, text=True,
                         timeout=180, env=env)
    assert out.returncode == 0 and "one-process ok" in out.stdout, out.stderr[-3000:]
