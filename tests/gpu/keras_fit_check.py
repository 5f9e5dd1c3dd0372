"""Keras 3 ``fit`` on a GPU with hvdlite.keras, checked against one process.

Run by tests/gpu/test_gpu_keras.py as ``KERAS_BACKEND=<torch|jax> python
keras_fit_check.py`` (1 rank) or under ``mpiexec -n N`` (ranks sharing the GPU).
Every rank trains a small model with ``DistributedOptimizer`` on its rows of
each global batch, and also the single-process reference on the whole global
batch from the same initial weights; it checks that the model's variables live
on the GPU, that the two trainings end with the same weights, and that every
rank holds the same weights.  It prints ``OK <backend> <ranks> <device>`` and
exits 0, or raises.
"""

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # ranks share the GPU
os.environ.setdefault("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", "60")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hvdlite.keras as hvd  # noqa: E402

B, STEPS, EPOCHS, FEATURES, OUTPUTS = 8, 4, 3, 16, 4


def variable_device(model) -> str:
    """Where the model's first variable lives, as 'cuda'/'gpu' or 'cpu'."""
    value = model.weights[0].value
    if keras.backend.backend() == "torch":
        return value.device.type
    return next(iter(value.devices())).platform


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(32, activation="tanh"),
            keras.layers.Dense(OUTPUTS),
        ]
    )


def main() -> int:
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")  # no TF32
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    rs = np.random.RandomState(0)
    x = rs.randn(STEPS * size * B, FEATURES).astype(np.float32)
    y = rs.randn(STEPS * size * B, OUTPUTS).astype(np.float32)
    rows = np.concatenate(
        [np.arange(s * size * B + rank * B, s * size * B + (rank + 1) * B) for s in range(STEPS)]
    )

    model = make_model()
    device = variable_device(model)
    if device not in ("cuda", "gpu"):
        raise AssertionError(f"Keras on {backend} put the model on {device}, not the GPU")
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    model.fit(
        x[rows],
        y[rows],
        batch_size=B,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )

    reference = make_model()
    reference.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    reference.fit(x, y, batch_size=size * B, epochs=EPOCHS, shuffle=False, verbose=0)
    for ours, ref in zip(model.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)

    flat = np.concatenate([w.ravel() for w in model.get_weights()])
    for other in hvd.allgather_object(flat):
        np.testing.assert_array_equal(other, flat)
    print(f"OK {backend} {size} {device}", flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
