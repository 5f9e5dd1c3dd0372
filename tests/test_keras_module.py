"""hvdlite.keras (for ``import horovod.keras as hvd`` users): the same objects as
hvdlite.tensorflow.keras, Horovod's signatures, and a 2-rank training run through
hvdlite.run (nothing here calls init() in the pytest process)."""

import inspect
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

import hvdlite  # noqa: E402
import hvdlite.keras as hvd  # noqa: E402
import hvdlite.tensorflow.keras as hk  # noqa: E402


def _params(func, count):
    """The first *count* parameters as (name, default) pairs."""
    params = list(inspect.signature(func).parameters.values())[:count]
    return [(p.name, p.default) for p in params]


def test_same_objects_as_tensorflow_keras():
    assert hvd.__all__ == hk.__all__
    for name in hk.__all__:
        if name not in ("callbacks", "elastic"):
            assert getattr(hvd, name) is getattr(hk, name), name
    import hvdlite.keras.callbacks as callbacks
    import hvdlite.keras.elastic as elastic

    # the submodules are this package's own, holding the same objects
    for mine, theirs, module in (
        (callbacks, hk.callbacks, "callbacks"),
        (elastic, hk.elastic, "elastic"),
    ):
        assert getattr(hvd, module) is mine and mine.__name__ == f"hvdlite.keras.{module}"
        for name in theirs.__all__:
            assert getattr(mine, name) is getattr(theirs, name), name


def test_horovod_signatures():
    none = object()
    assert _params(hvd.callbacks.BroadcastGlobalVariablesCallback, 3) == [
        ("root_rank", inspect.Parameter.empty),
        ("device", ""),
        ("local_variables", None),
    ]
    assert _params(hvd.callbacks.BestModelCheckpoint, 5) == [
        ("monitor", "val_loss"),
        ("verbose", 0),
        ("save_weights_only", False),
        ("mode", "auto"),
        ("save_freq", "epoch"),
    ]
    assert _params(hvd.load_model, 5) == [
        ("filepath", inspect.Parameter.empty),
        ("custom_optimizers", None),
        ("custom_objects", None),
        ("compression", hvd.Compression.none),
        ("legacy_opts", False),
    ]
    assert getattr(hvd.ProcessSet([0, 1]), "mpi_comm", none) is None  # given as ranks


def _train_two_ranks(path):
    import numpy as np
    import keras
    import tensorflow as tf

    import hvdlite.keras as hvd

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # each rank starts from other weights
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
    local = model.layers[1].kernel  # kept per rank: not broadcast
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    best = hvd.callbacks.BestModelCheckpoint(
        monitor="loss", save_weights_only=True, filepath=path + ".weights.h5"
    )
    x, y = np.ones((4, 2), "float32"), np.ones((4, 1), "float32")
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=1,
        verbose=0,
        callbacks=[
            hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local]),
            best,
        ],
    )
    if hvd.rank() == 0:
        model.save(path + ".keras")
    hvd.broadcast_object(None, 0)  # rank 0 has saved
    loaded = hvd.load_model(path + ".keras", legacy_opts=False)
    return (
        model.layers[0].kernel.numpy().tolist(),
        local.numpy().tolist(),
        hasattr(loaded.optimizer, "_hvd"),
        os.path.exists(path + ".weights.h5"),
    )


@pytest.mark.timeout(180)
def test_two_rank_training_with_the_keras_module(tmp_path):
    path = str(tmp_path / "model")
    (shared0, local0, dist0, saved0), (shared1, local1, dist1, saved1) = hvdlite.run(
        _train_two_ranks, args=(path,), np=2, env={"TF_CPP_MIN_LOG_LEVEL": "3"}
    )
    assert shared0 == shared1  # broadcast from rank 0
    assert local0 != local1  # local_variables stayed each rank's own
    assert dist0 and dist1  # load_model made the optimizer distributed again
    assert saved0 and saved1  # rank 0 wrote the best weights
