"""Keras 3 on the PyTorch backend with hvdlite.keras, against one process.

Every rank also trains the single-process reference locally, on the global
batch (the concatenation of all ranks' batches), from the same initial
weights: ``model.fit`` with the DistributedOptimizer (gradients reduced through
hvdlite.torch), gradient aggregation and groups, the callbacks, the elastic
Keras state and its callbacks, ``load_model``, and the errors of backend
combinations that cannot work.
"""

import importlib
import os

from keras_backend_helpers import keras_on

keras = keras_on("torch")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.keras as hvd  # noqa: E402

# Two ranks: nothing here depends on the world's size; what this backend's reductions do
# at 1 and 3 ranks is tested by the hvdlite.torch modules (test_torch_*.py), at lower cost.
MPI_SIZES = (2,)
MPI_ENV = {"KERAS_BACKEND": "torch"}

hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank per step
STEPS = 3


def global_data(steps=STEPS, features=6, outputs=3, seed=0):
    rs = np.random.RandomState(seed)
    x = rs.randn(steps * N * B, features).astype(np.float32)
    y = rs.randn(steps * N * B, outputs).astype(np.float32)
    return x, y


def local_data(a, steps=STEPS):
    """This rank's rows of every global batch, in order."""
    return np.concatenate([a[s * N * B + R * B : s * N * B + (R + 1) * B] for s in range(steps)])


def make_model(seed=1, features=6, outputs=3, hidden=8):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(hidden, activation="tanh"),
            keras.layers.Dense(outputs),
        ]
    )


def weights_close(a, b, tol=1e-5):
    for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(wa, wb, rtol=tol, atol=tol)


def same_on_every_rank(model):
    first = np.concatenate([w.ravel() for w in model.get_weights()])
    for other in hvd.allgather_object(first):
        np.testing.assert_array_equal(other, first)


def fit_pair(dist_kwargs=None, epochs=2, callbacks=(), lr=0.05, seed=8, opt_cls=None, **opt):
    """(distributed model, its history, reference model, its history)."""
    opt_cls = opt_cls or keras.optimizers.SGD
    opt = opt or {"momentum": 0.9}
    x, y = global_data(seed=seed)
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(opt_cls(lr, **opt), **(dist_kwargs or {})), loss="mse"
    )
    hist = model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.MetricAverageCallback(), *callbacks],
    )
    ref = make_model()
    ref.compile(optimizer=opt_cls(lr, **opt), loss="mse")
    ref_hist = ref.fit(x, y, batch_size=N * B, epochs=epochs, shuffle=False, verbose=0)
    return model, hist, ref, ref_hist


# ------------------------------------------------------------------ model.fit


def test_fit_matches_one_process_and_metrics_are_averaged():
    model, hist, ref, ref_hist = fit_pair()
    weights_close(model, ref)
    same_on_every_rank(model)
    # the average of the ranks' losses is the loss of the global batch
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-5)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert type(model.optimizer).__name__ == "SGD"


def test_gradients_go_through_hvdlite_torch_in_one_grouped_submission(monkeypatch):
    import hvdlite.keras._backend_torch as backend

    calls = []
    real = backend.grouped_allreduce_async

    def spy(tensors, **kwargs):
        calls.append([type(t) for t in tensors])
        return real(tensors, **kwargs)

    monkeypatch.setattr(backend, "grouped_allreduce_async", spy)
    model, _, ref, _ = fit_pair(epochs=1)
    assert len(calls) == STEPS  # one submission per step, holding every gradient
    assert all(kinds == [torch.Tensor] * 4 for kinds in calls)
    weights_close(model, ref)


def test_fit_with_adam_groups_and_sum():
    x, y = global_data(seed=9)
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), groups=3), loss="mse"
    )
    model.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(model, ref, 1e-4)
    same_on_every_rank(model)

    # Sum with the loss divided by N is the global batch's mean loss: the same steps.
    model = make_model()
    sgd = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), op=hvd.Sum)
    model.compile(optimizer=sgd, loss=lambda t, p: keras.ops.mean((p - t) ** 2) / N)
    model.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(model, ref)


def test_partial_optimizer_keeps_local_layer_gradients():
    x, y = global_data(seed=11)
    model = make_model()
    local = model.layers[1]
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[local])
    model.compile(optimizer=opt, loss="mse")
    model.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    shared = [w.ravel() for w in model.layers[0].get_weights()]
    mine = np.concatenate([w.ravel() for w in local.get_weights()])
    for other in hvd.allgather_object(shared):
        for a, b in zip(other, shared, strict=True):
            np.testing.assert_array_equal(a, b)
    others = hvd.allgather_object(mine)
    assert not any(np.allclose(o, mine) for r, o in enumerate(others) if r != R)


@pytest.mark.parametrize("average", [False, True])
def test_fit_backward_passes_per_step(average):
    steps = 4
    x, y = global_data(steps=steps, seed=10)
    model = make_model()
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.05), backward_passes_per_step=2, average_aggregated_gradients=average
    )
    model.compile(optimizer=opt, loss="mse")
    model.fit(
        local_data(x, steps), local_data(y, steps), batch_size=B, epochs=1, shuffle=False, verbose=0
    )
    assert int(model.optimizer.iterations.numpy()) == steps
    # Reference: the global batches' gradients, summed in pairs (halved when averaging).
    ref = make_model()
    ref_opt = keras.optimizers.SGD(0.05)
    ref_opt.build(ref.trainable_variables)
    pending = None
    for s in range(steps):
        xb = torch.from_numpy(x[s * N * B : (s + 1) * N * B])
        yb = torch.from_numpy(y[s * N * B : (s + 1) * N * B])
        ref.zero_grad()
        loss = torch.mean((ref(xb) - yb) ** 2)
        loss.backward()
        grads = [v.value.grad.clone() for v in ref.trainable_variables]
        pending = grads if pending is None else [p + g for p, g in zip(pending, grads, strict=True)]
        if s % 2 == 1:
            if average:
                pending = [p / 2 for p in pending]
            with torch.no_grad():
                ref_opt.apply(pending, ref.trainable_variables)
            pending = None
    weights_close(model, ref)


# ------------------------------------------------------------------ callbacks


def test_broadcast_callback_makes_ranks_start_equal():
    x, y = global_data(seed=12)
    model = make_model(seed=100 + R)  # every rank starts from different weights
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    same_on_every_rank(model)
    ref = make_model(seed=100)  # rank 0's initial weights
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(model, ref)


def test_learning_rate_schedule_and_warmup_callbacks():
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.08, multiplier=0.5, start_epoch=1
    )
    _, hist, _, _ = fit_pair(epochs=3, callbacks=[schedule], lr=0.08)
    np.testing.assert_allclose(hist.history["lr"], [0.08, 0.04, 0.02], rtol=1e-6)

    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * N, warmup_epochs=2)
    _, hist, _, _ = fit_pair(epochs=3, callbacks=[warmup], lr=0.05 * N)
    # after the last batch of epoch e the rate is initial/N * ((e+1)(N-1)/2 + 1)
    expected = [0.05 * ((e + 1) * (N - 1) / 2 + 1) for e in range(2)] + [0.05 * N]
    np.testing.assert_allclose(hist.history["lr"], expected, rtol=1e-5)


# ------------------------------------------------------------------ saving and elastic


def test_load_model_wraps_the_saved_optimizer(tmp_path):
    x, y = global_data(seed=14)
    model, _, ref, _ = fit_pair(epochs=1, seed=14)
    path = os.path.join(str(tmp_path), f"model-rank{R}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    assert hasattr(loaded.optimizer, "_hvd")  # distributed, state kept
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    loaded.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(loaded, ref)
    same_on_every_rank(loaded)


def test_elastic_state_commit_restore_sync_and_callbacks():
    x, y = global_data(seed=15)
    model = make_model(seed=200 + R)  # different on every rank until sync()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    state.sync()  # rank 0's weights and optimizer state (built by the state) everywhere
    same_on_every_rank(model)
    start = model.get_weights()

    callbacks = [
        hvd.callbacks.MetricAverageCallback(),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
    ]
    model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=callbacks,
    )
    assert (state.epoch, state.batch) == (2, 0)
    committed = model.get_weights()
    ref = make_model(seed=200)
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=2, shuffle=False, verbose=0)
    weights_close(model, ref, 1e-4)

    # Train on past the commit, then restore: the committed weights and values come back.
    model.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    state.epoch = 7
    assert not np.allclose(model.get_weights()[0], committed[0])
    state.restore()
    assert state.epoch == 2
    for now, then in zip(model.get_weights(), committed, strict=True):
        np.testing.assert_array_equal(now, then)
    assert not np.allclose(committed[0], start[0])


# ------------------------------------------------------------------ values and misuse


def test_value_collectives_return_backend_tensors():
    total = hvd.allreduce(np.float32(R), op=hvd.Sum)
    assert isinstance(total, torch.Tensor) and float(total) == N * (N - 1) / 2
    np.testing.assert_array_equal(hvd.allgather(np.array([R])).numpy(), np.arange(N))
    assert int(hvd.broadcast(torch.tensor([R + 5]), root_rank=0)) == 5
    assert hvd.broadcast_object_fn(root_rank=0)(R) == 0


def test_tensorflow_only_parts_say_what_to_do():
    with pytest.raises(ImportError, match="import hvdlite.keras as hvd"):
        importlib.import_module("hvdlite.tensorflow.keras")
    with pytest.raises(AttributeError, match="KERAS_BACKEND=tensorflow"):
        hvd.SyncBatchNormalization  # noqa: B018
    assert "SyncBatchNormalization" not in hvd.__all__
    # the top-level entry point picks hvdlite.keras for a Keras optimizer on torch
    assert hasattr(hvdlite.DistributedOptimizer(keras.optimizers.SGD(0.1)), "_hvd")
    with pytest.raises(ValueError, match="Average and Sum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Max)
