"""TensorFlow GPU tensors on a GPU: eager collectives stay on the GPU (DLPack), tape
training with DistributedGradientTape converges, and XLA says plainly it cannot run
collectives."""

import numpy as np
import pytest

hvd = None  # hvdlite.tensorflow, imported by the fixture (CPU runs never import TensorFlow here)


@pytest.fixture(scope="module")
def tf():
    global hvd
    tf = pytest.importorskip(
        "tensorflow", reason="TensorFlow is not installed here (pip install tensorflow[and-cuda])"
    )

    import hvdlite.tensorflow as hvd

    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU (a CPU build of TensorFlow?)")
    hvd.init()
    yield tf
    hvd.shutdown()


def test_eager_gpu_allreduce_stays_on_gpu(tf):
    with tf.device("/GPU:0"):
        x = tf.ones([4], dtype=tf.float32) * (hvd.rank() + 1)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert "GPU" in out.device
    np.testing.assert_allclose(out.numpy(), hvd.size() * (hvd.size() + 1) / 2)
    g = hvd.allgather(x[None, :])
    assert g.shape == (hvd.size(), 4)


def test_tape_training_on_gpu(tf):
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    with tf.device("/GPU:0"):
        w = tf.Variable(tf.zeros([4, 1]))
        xs, ys = tf.constant(x), tf.constant(y)
    hvd.broadcast_variables([w], root_rank=0)
    opt = tf.keras.optimizers.SGD(0.1)
    first = None
    for _ in range(60):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((xs @ w - ys) ** 2)
        tape = hvd.DistributedGradientTape(tape)
        opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
        first = float(loss) if first is None else first
    assert float(loss) < 0.01 * first


def test_xla_is_refused_plainly(tf):
    @tf.function(jit_compile=True)
    def step(x):
        return hvd.allreduce(x)

    with pytest.raises(Exception, match="XLA"):
        step(tf.ones([2]))
