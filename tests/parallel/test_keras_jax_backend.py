"""Keras on JAX is not supported yet: every rank is told so, with the fix, and
the job goes on (no rank is left waiting in a collective)."""

from keras_backend_helpers import keras_on

keras = keras_on("jax")

import pytest  # noqa: E402

import hvdlite.keras as hvd  # noqa: E402

MPI_SIZES = (2,)
MPI_ENV = {"KERAS_BACKEND": "jax"}

hvd.init()


def test_distributed_optimizer_refuses_on_every_rank_naming_the_fix():
    with pytest.raises(NotImplementedError, match="'jax' is not supported yet") as info:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    message = str(info.value)
    assert "KERAS_BACKEND" in message and "tensorflow, torch" in message
    # every rank raised the same error and can still communicate
    assert hvd.allgather_object(message) == [message] * hvd.size()
