"""What hvdlite.keras cannot do on Keras' JAX backend says so, on every rank,
naming the fix, and the job goes on (no rank is left waiting in a collective)."""

import importlib

from keras_backend_helpers import keras_on

keras = keras_on("jax")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hvdlite.keras as hvd  # noqa: E402

MPI_SIZES = (2,)
MPI_ENV = {"KERAS_BACKEND": "jax"}
MPI_REQUIRES = ("jax",)

hvd.init()


def same_message_everywhere(error: Exception) -> str:
    message = str(error)
    assert hvd.allgather_object(message) == [message] * hvd.size()
    return message


@pytest.fixture
def keras_data_parallel():
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    try:
        yield
    finally:
        keras.distribution.set_distribution(None)


def test_keras_distribution_is_refused_when_the_optimizer_is_made(keras_data_parallel):
    with pytest.raises(ValueError, match="keras.distribution") as info:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    message = same_message_everywhere(info.value)
    assert "DataParallel" in message and "one rank per device" in message


def test_keras_distribution_set_after_compile_is_refused_by_the_train_step():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    try:
        with pytest.raises(ValueError, match="leave keras.distribution unset") as info:
            model.fit(np.zeros((4, 3), "f"), np.zeros((4, 2), "f"), batch_size=4, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
    same_message_everywhere(info.value)


def test_tensorflow_only_parts_say_what_to_do():
    with pytest.raises(ImportError, match="import hvdlite.keras as hvd"):
        importlib.import_module("hvdlite.tensorflow.keras")
    with pytest.raises(AttributeError, match="KERAS_BACKEND=tensorflow"):
        hvd.SyncBatchNormalization  # noqa: B018
    assert "SyncBatchNormalization" not in hvd.__all__
    with pytest.raises(ValueError, match="Average and Sum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Max)
