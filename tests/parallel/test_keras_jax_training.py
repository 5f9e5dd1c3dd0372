"""Keras 3 on the JAX backend with hvdlite.keras, against one process.

Every rank also trains the single-process reference locally, on the global
batch (the concatenation of all ranks' batches), from the same initial
weights: ``model.fit`` with the DistributedOptimizer (gradients reduced by
hvdlite.jax inside Keras' jitted train step, or eagerly with
``run_eagerly=True``), groups, Sum, fp16, gradient aggregation, the
callbacks, the elastic Keras state and its callbacks, and ``load_model``.
"""

import os

from keras_backend_helpers import keras_on

keras = keras_on("jax")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.collectives  # noqa: E402
import hvdlite.jax  # noqa: E402
import hvdlite.keras as hvd  # noqa: E402

# Two ranks: nothing here depends on the world's size; what this backend's reductions do
# at 1 and 3 ranks is tested by the hvdlite.jax modules (test_jax_*.py), at lower cost.
MPI_SIZES = (2,)
MPI_ENV = {"KERAS_BACKEND": "jax"}
MPI_REQUIRES = ("jax",)

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


def fit_local(model, x, y, steps=STEPS, epochs=1, callbacks=(), **kwargs):
    return model.fit(
        local_data(x, steps),
        local_data(y, steps),
        batch_size=B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(callbacks),
        **kwargs,
    )


def fit_reference(model, x, y, epochs=1):
    return model.fit(x, y, batch_size=N * B, epochs=epochs, shuffle=False, verbose=0)


def fit_pair(dist_kwargs=None, epochs=2, callbacks=(), lr=0.05, seed=8, compile_kwargs=None):
    """(distributed model, its history, reference model, its history), SGD with momentum."""
    x, y = global_data(seed=seed)
    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9), **(dist_kwargs or {}))
    model.compile(optimizer=opt, loss="mse", **(compile_kwargs or {}))
    hist = fit_local(
        model, x, y, epochs=epochs, callbacks=[hvd.callbacks.MetricAverageCallback(), *callbacks]
    )
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), loss="mse")
    return model, hist, ref, fit_reference(ref, x, y, epochs)


class Submissions:
    """What the engine receives: every grouped allreduce (``submitted``: name and
    tensor types) and which of them came through the blocking call an ordered
    host callback of hvdlite.jax makes inside jit (``blocking``).  Gradient
    reductions only: the optimizer names them ``allreduce.Distributed<Class>...``
    (the metric averages are unnamed)."""

    def __init__(self, monkeypatch):
        self.submitted, self.blocking = [], []
        real_sync = hvdlite.collectives.grouped_allreduce
        real_async = hvdlite.collectives.grouped_allreduce_async

        def gradients(name):
            return str(name).startswith("allreduce.Distributed")

        def spy_sync(tensors, *args, **kwargs):
            if gradients(kwargs.get("name")):
                self.blocking.append(kwargs.get("name"))
            return real_sync(tensors, *args, **kwargs)

        def spy_async(tensors, average=None, name=None, *args, **kwargs):
            if gradients(name):
                self.submitted.append((name, [type(t) for t in tensors]))
            return real_async(tensors, average, name, *args, **kwargs)

        monkeypatch.setattr(hvdlite.collectives, "grouped_allreduce", spy_sync)
        monkeypatch.setattr(hvdlite.collectives, "grouped_allreduce_async", spy_async)


# ------------------------------------------------------------------ model.fit


def test_hvdlite_keras_on_jax_compresses_with_hvdlite_jax():
    # That importing it loads no TensorFlow is checked in a fresh process by
    # tests/test_keras_backends.py (a process here may run other modules first).
    assert hvd.Compression is hvdlite.jax.Compression


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_fit_matches_one_process_and_metrics_are_averaged(mode):
    compile_kwargs = {"run_eagerly": True} if mode == "eager" else {}
    model, hist, ref, ref_hist = fit_pair(compile_kwargs=compile_kwargs)
    weights_close(model, ref)
    same_on_every_rank(model)
    # the average of the ranks' losses is the loss of the global batch
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-5)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert type(model.optimizer).__name__ == "SGD"


def test_inside_jit_one_grouped_submission_per_step_under_a_fixed_name(monkeypatch):
    spy = Submissions(monkeypatch)
    model, _, ref, _ = fit_pair(epochs=1)
    weights_close(model, ref)
    # one ordered host callback per step, holding every gradient as one group
    assert spy.blocking == ["allreduce.DistributedSGD"] * STEPS
    assert spy.submitted == [("allreduce.DistributedSGD", [np.ndarray] * 4)] * STEPS


def test_eagerly_one_grouped_submission_per_step(monkeypatch):
    spy = Submissions(monkeypatch)
    model, _, ref, _ = fit_pair(epochs=1, compile_kwargs={"run_eagerly": True})
    weights_close(model, ref)
    assert spy.blocking == []  # no host callback: hvdlite.jax's eager path
    assert [name for name, _ in spy.submitted] == ["allreduce.DistributedSGD"] * STEPS
    assert all(len(kinds) == 4 for _, kinds in spy.submitted)


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_fit_with_adam_and_groups_submits_every_group(monkeypatch, mode):
    x, y = global_data(seed=9)
    spy = Submissions(monkeypatch)
    model = make_model()
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), groups=3),
        loss="mse",
        run_eagerly=mode == "eager",
    )
    fit_local(model, x, y)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit_reference(ref, x, y)
    weights_close(model, ref, 1e-4)
    same_on_every_rank(model)
    names = [f"allreduce.DistributedAdam.{k}" for k in range(3)]
    assert [name for name, _ in spy.submitted] == names * STEPS
    assert sum(len(kinds) for _, kinds in spy.submitted) == 4 * STEPS
    assert spy.blocking == []  # inside jit too: one callback submits every group, then waits


def test_sum_predivide_and_fp16():
    x, y = global_data(seed=10)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    fit_reference(ref, x, y)

    # Sum with the loss divided by N is the global batch's mean loss: the same steps.
    model = make_model()
    sgd = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), op=hvd.Sum)
    model.compile(optimizer=sgd, loss=lambda t, p: keras.ops.mean((p - t) ** 2) / N)
    fit_local(model, x, y)
    weights_close(model, ref)

    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), gradient_predivide_factor=2.0)
    model.compile(optimizer=opt, loss="mse")
    fit_local(model, x, y)
    weights_close(model, ref)

    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=hvd.Compression.fp16)
    model.compile(optimizer=opt, loss="mse")
    fit_local(model, x, y)
    weights_close(model, ref, 2e-3)  # float16 on the wire
    same_on_every_rank(model)
    assert all(w.dtype == np.float32 for w in model.get_weights())


def test_partial_optimizer_keeps_local_layer_gradients():
    x, y = global_data(seed=11)
    model = make_model()
    local = model.layers[1]
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.05), local_layers=[local])
    model.compile(optimizer=opt, loss="mse")
    fit_local(model, x, y)
    shared = [w.ravel() for w in model.layers[0].get_weights()]
    mine = np.concatenate([w.ravel() for w in local.get_weights()])
    for other in hvd.allgather_object(shared):
        for a, b in zip(other, shared, strict=True):
            np.testing.assert_array_equal(a, b)
    others = hvd.allgather_object(mine)
    assert not any(np.allclose(o, mine) for r, o in enumerate(others) if r != R)


@pytest.mark.parametrize("average", [False, True])
@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_fit_backward_passes_per_step(monkeypatch, average, mode):
    steps = 4
    x, y = global_data(steps=steps, seed=12)
    spy = Submissions(monkeypatch)
    model = make_model()
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.05), backward_passes_per_step=2, average_aggregated_gradients=average
    )
    model.compile(optimizer=opt, loss="mse", run_eagerly=mode == "eager")
    fit_local(model, x, y, steps=steps)
    assert int(model.optimizer.iterations.numpy()) == steps
    assert len(spy.submitted) == steps // 2  # reduced on every second step only
    # Reference: Keras' own accumulation applies the mean of two global batches'
    # gradients every second step; summing them is the same with twice the rate.
    ref = make_model()
    rate = 0.05 if average else 0.1
    ref.compile(optimizer=keras.optimizers.SGD(rate, gradient_accumulation_steps=2), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(model, ref)
    same_on_every_rank(model)


# ------------------------------------------------------------------ callbacks


def test_broadcast_callback_makes_ranks_start_equal():
    x, y = global_data(seed=13)
    model = make_model(seed=100 + R)  # every rank starts from different weights
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    fit_local(model, x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    same_on_every_rank(model)
    ref = make_model(seed=100)  # rank 0's initial weights
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    fit_reference(ref, x, y)
    weights_close(model, ref)


def test_broadcast_in_the_middle_of_an_epoch_reaches_the_jitted_state():
    """Between steps the trainer holds the state outside the Keras variables: a
    broadcast after the first batch reads and writes the live values."""
    x, y = global_data(seed=14)

    class Skew(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 0:  # every rank but 0 moves its weights and momentums away
                self.model.jax_state_sync()
                for v in self.model.trainable_variables + self.model.optimizer.momentums:
                    v.assign(v.value + float(R))

    class LateBroadcast(hvd.callbacks.BroadcastGlobalVariablesCallback):
        def on_train_begin(self, logs=None):
            pass  # everything at the end of the first batch

    model = make_model()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
    model.compile(optimizer=opt, loss="mse")
    fit_local(model, x, y, callbacks=[Skew(), LateBroadcast(0)])
    same_on_every_rank(model)
    ref = make_model()  # rank 0's run: as if nothing had moved
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    fit_reference(ref, x, y)
    weights_close(model, ref)


def test_learning_rate_schedule_is_what_the_jitted_step_uses():
    x, y = global_data(seed=15)
    schedule = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.08, multiplier=0.5, start_epoch=1, momentum_correction=False
    )
    model = make_model()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.08)), loss="mse")
    hist = fit_local(model, x, y, epochs=3, callbacks=[schedule])
    np.testing.assert_allclose(hist.history["lr"], [0.08, 0.04, 0.02], rtol=1e-6)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.08), loss="mse")
    for lr in (0.08, 0.04, 0.02):
        ref.optimizer.learning_rate = lr
        fit_reference(ref, x, y)
    weights_close(model, ref)


def test_learning_rate_warmup_every_batch():
    warmup = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * N, warmup_epochs=2)
    _, hist, _, _ = fit_pair(epochs=3, callbacks=[warmup], lr=0.05 * N)
    # after the last batch of epoch e the rate is initial/N * ((e+1)(N-1)/2 + 1)
    expected = [0.05 * ((e + 1) * (N - 1) / 2 + 1) for e in range(2)] + [0.05 * N]
    np.testing.assert_allclose(hist.history["lr"], expected, rtol=1e-5)


def test_best_model_checkpoint_written_by_rank_0(tmp_path_factory):
    path = tmp_path_factory.mktemp(f"best{R}") / "best.keras"
    path = hvd.broadcast_object(str(path), root_rank=0)  # rank 0's path everywhere
    checkpoint = hvd.callbacks.BestModelCheckpoint(monitor="loss", filepath=path)
    fit_pair(epochs=2, callbacks=[checkpoint])
    exists = os.path.exists(path)
    assert hvd.allgather_object(exists)[0]
    if R == 0:
        assert hasattr(hvd.load_model(path).optimizer, "_hvd")


# ------------------------------------------------------------------ saving and elastic


def test_load_model_wraps_the_saved_optimizer(tmp_path):
    x, y = global_data(seed=16)
    model, _, ref, _ = fit_pair(epochs=1, seed=16)
    path = os.path.join(str(tmp_path), f"model-rank{R}.keras")
    model.save(path)
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    assert hasattr(loaded.optimizer, "_hvd")  # distributed, state kept
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    fit_local(loaded, x, y)
    fit_reference(ref, x, y)
    weights_close(loaded, ref)
    same_on_every_rank(loaded)


def test_elastic_state_commit_restore_sync_and_callbacks():
    x, y = global_data(seed=17)
    model = make_model(seed=200 + R)  # different on every rank until sync()
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    state.sync()  # rank 0's weights and optimizer state (built by the state) everywhere
    same_on_every_rank(model)
    start = model.get_weights()

    mid_epoch = []

    class Peek(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1 and not mid_epoch:  # just committed after 2 batches
                mid_epoch.append([np.array(w) for w in state._saved_model_state])

    callbacks = [
        hvd.callbacks.MetricAverageCallback(),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
        Peek(),
    ]
    fit_local(model, x, y, epochs=2, callbacks=callbacks)
    assert (state.epoch, state.batch) == (2, 0)
    committed = model.get_weights()

    ref = make_model(seed=200)
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    ref.fit(x[: 2 * N * B], y[: 2 * N * B], batch_size=N * B, shuffle=False, verbose=0)
    # the commit in the middle of the epoch saw the live weights of the jitted step
    for a, b in zip(mid_epoch[0], ref.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    ref = make_model(seed=200)
    ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    fit_reference(ref, x, y, epochs=2)
    weights_close(model, ref, 1e-4)

    # Train on past the commit, then restore: the committed weights and values come back.
    fit_local(model, x, y)
    state.epoch = 7
    assert not np.allclose(model.get_weights()[0], committed[0])
    state.restore()
    assert state.epoch == 2
    for now, then in zip(model.get_weights(), committed, strict=True):
        np.testing.assert_array_equal(now, then)
    assert not np.allclose(committed[0], start[0])


# ------------------------------------------------------------------ values


def test_value_collectives_return_jax_arrays():
    total = hvd.allreduce(np.float32(R), op=hvd.Sum)
    assert isinstance(total, jax.Array) and float(total) == N * (N - 1) / 2
    np.testing.assert_array_equal(np.asarray(hvd.allgather(np.array([R]))), np.arange(N))
    assert int(hvd.broadcast(np.array([R + 5]), root_rank=0)[0]) == 5
    assert hvd.broadcast_object_fn(root_rank=0)(R) == 0
    # the top-level entry point picks hvdlite.keras for a Keras optimizer on JAX
    assert hasattr(hvdlite.DistributedOptimizer(keras.optimizers.SGD(0.1)), "_hvd")
