"""Data-parallel training with hvdlite.tensorflow / .keras against one process.

Every rank also trains the single-process reference locally, on the global
batch (the concatenation of all ranks' batches), from the same initial
weights, so each test compares the distributed result with it: gradient tape
loops (eager and tf.function), ``model.fit`` with the Keras 3
DistributedOptimizer, gradient aggregation, sparse gradients, SyncBatchNorm,
callbacks and misuse.
"""

import os

from tf_helpers import single_threaded_tensorflow

tf = single_threaded_tensorflow(stall_shutdown_seconds=90)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import hvdlite  # noqa: E402
import hvdlite.tensorflow as hvd  # noqa: E402
import hvdlite.tensorflow.keras as hk  # noqa: E402

MPI_SIZES = (2, 3)

hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank per step
STEPS = 3


def global_data(steps=STEPS, features=6, outputs=3, seed=0):
    rs = np.random.RandomState(seed)
    x = rs.randn(steps * N * B, features).astype(np.float32)
    y = rs.randn(steps * N * B, outputs).astype(np.float32)
    return x, y


def my_rows(a, step):
    """This rank's slice of global batch ``step``."""
    lo = step * N * B + R * B
    return a[lo : lo + B]


def local_data(a, steps=STEPS):
    return np.concatenate([my_rows(a, s) for s in range(steps)])


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


def reference_tape_training(x, y, optimizer, steps=STEPS, seed=1, hidden=8):
    model = make_model(seed, hidden=hidden)
    for s in range(steps):
        xb, yb = x[s * N * B : (s + 1) * N * B], y[s * N * B : (s + 1) * N * B]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        optimizer.apply_gradients(
            zip(
                tape.gradient(loss, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )
    return model


# ------------------------------------------------------------- gradient tape

TAPE_CASES = {
    "plain": ({}, 1e-5),
    "groups=2": ({"groups": 2}, 1e-5),
    "predivide": ({"gradient_predivide_factor": 2.0}, 1e-5),
    "fp16": ({"compression": hvd.Compression.fp16}, 2e-3),
}


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("case", list(TAPE_CASES))
def test_tape_training_matches_one_process(mode, case):
    kwargs, tol = TAPE_CASES[case]
    x, y = global_data()
    model = make_model()
    opt = keras.optimizers.SGD(0.1, momentum=0.9)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    step = tf.function(step) if mode == "graph" else step
    for s in range(STEPS):
        step(my_rows(x, s), my_rows(y, s))
    ref = reference_tape_training(x, y, keras.optimizers.SGD(0.1, momentum=0.9))
    weights_close(model, ref, tol)
    same_on_every_rank(model)


@pytest.mark.parametrize("plan", ["each gradient", "packed"])
def test_tape_training_with_each_submission_plan(plan, monkeypatch):
    # Where the set reduces through shared memory (here: every set of 2-4 ranks), the
    # gradients go to the engine as they are, but for the small ones, packed into one
    # tensor in the graph; elsewhere a group is packed into one buffer first (simulated
    # by a plan that names MPI).  4096 hidden units make a 96 KB first kernel (above
    # PACK_BYTES) and 160 KB of gradients, enough for the shared-memory path either way.
    from core_helpers import spy_on_shared_memory

    from hvdlite import basics

    batches = spy_on_shared_memory(monkeypatch)
    if plan == "packed":  # as where the set reduces through MPI
        monkeypatch.setattr(basics, "allreduce_uses_shared_memory", lambda process_set: False)
    x, y = global_data(seed=5)
    model = make_model(hidden=4096)
    opt = keras.optimizers.SGD(0.1, momentum=0.9)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for s in range(STEPS):
        step(my_rows(x, s), my_rows(y, s))
    ref = reference_tape_training(x, y, keras.optimizers.SGD(0.1, momentum=0.9), hidden=4096)
    weights_close(model, ref)
    same_on_every_rank(model)
    # Packed, the group is one tensor; otherwise the first kernel and the other three
    # gradients packed into one.
    assert batches == [1 if plan == "packed" else 2] * STEPS


def test_tape_groups_of_variables_and_sum():
    x, y = global_data(seed=3)
    model = make_model()
    first, second = model.layers
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(my_rows(x, 0)) - my_rows(y, 0)))
    tape = hvd.DistributedGradientTape(tape, groups=[[first.kernel, second.kernel]], op=hvd.Sum)
    grads = tape.gradient(loss, model.trainable_variables)
    with tf.GradientTape() as ref_tape:
        ref_loss = tf.reduce_mean(tf.square(model(x[: N * B]) - y[: N * B]))
    ref = ref_tape.gradient(ref_loss, model.trainable_variables)
    for g, r in zip(grads, ref, strict=True):  # Sum of per-rank means = N * global mean
        np.testing.assert_allclose(g.numpy(), N * r.numpy(), rtol=1e-5, atol=1e-6)


def test_sparse_gradients_allgathered_or_densified():
    ids = np.random.RandomState(4).randint(0, 10, size=(N * B, 2))
    target = np.random.RandomState(5).randn(N * B, 2, 3).astype(np.float32)
    results = []
    for sparse_as_dense in (False, True):
        keras.utils.set_random_seed(2)
        emb = keras.layers.Embedding(10, 3)
        emb.build((None, 2))
        with tf.GradientTape() as tape:
            mine = slice(R * B, (R + 1) * B)
            loss = tf.reduce_mean(tf.square(emb(ids[mine]) - target[mine]))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        (grad,) = tape.gradient(loss, emb.trainable_variables)
        assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense
        results.append(tf.convert_to_tensor(grad).numpy())
        with tf.GradientTape() as tape:
            ref_loss = tf.reduce_mean(tf.square(emb(ids) - target))
        ref = tf.convert_to_tensor(tape.gradient(ref_loss, emb.trainable_variables)[0]).numpy()
        np.testing.assert_allclose(results[-1], ref, rtol=1e-5, atol=1e-6)


def test_partial_tape_keeps_local_layer_gradients():
    x, y = global_data(seed=6)
    model = make_model()
    local = model.layers[1]
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_mean(tf.square(model(my_rows(x, 0)) - my_rows(y, 0)))
    local_grads = tape.gradient(loss, model.trainable_variables)
    dist = hvd.PartialDistributedGradientTape(tape, local_layers=local)
    grads = dist.gradient(loss, model.trainable_variables)
    with tf.GradientTape() as ref_tape:
        ref_loss = tf.reduce_mean(tf.square(model(x[: N * B]) - y[: N * B]))
    ref = ref_tape.gradient(ref_loss, model.trainable_variables)
    for var, g, lg, r in zip(model.trainable_variables, grads, local_grads, ref, strict=True):
        if any(var is w for w in local.trainable_weights):
            np.testing.assert_allclose(g.numpy(), lg.numpy() / N, rtol=1e-6)  # scaled, local
        else:
            np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


def test_sync_batch_normalization_uses_global_statistics():
    x = np.random.RandomState(7).randn(N * B, 5).astype(np.float32) * 3 + 1
    keras.utils.set_random_seed(3)
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    sync.build((None, 5))
    keras.utils.set_random_seed(3)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    plain.build((None, 5))
    mine = tf.constant(x[R * B : (R + 1) * B])
    with tf.GradientTape() as tape:
        out = sync(mine, training=True)
        loss = tf.reduce_sum(out * tf.range(5, dtype=tf.float32))
    grads = hvd.DistributedGradientTape(tape).gradient(loss, sync.trainable_variables)
    with tf.GradientTape() as tape:
        ref_out = plain(tf.constant(x), training=True)
        ref_loss = tf.reduce_sum(ref_out * tf.range(5, dtype=tf.float32)) / N
    ref_grads = tape.gradient(ref_loss, plain.trainable_variables)
    np.testing.assert_allclose(
        out.numpy(), ref_out.numpy()[R * B : (R + 1) * B], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(sync.moving_mean.numpy(), plain.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        sync.moving_variance.numpy(), plain.moving_variance.numpy(), rtol=1e-4
    )
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(g.numpy(), r.numpy(), rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ model.fit


def fit_pair(
    dist_kwargs=None,
    epochs=2,
    callbacks=(),
    ref_callbacks=(),
    lr=0.05,
    seed=8,
    opt_cls=keras.optimizers.SGD,
    opt_kwargs=None,
):
    """(distributed model, its history, reference model, its history)."""
    x, y = global_data(seed=seed)
    opt_kwargs = opt_kwargs if opt_kwargs is not None else {"momentum": 0.9}
    model = make_model()
    opt = hk.DistributedOptimizer(opt_cls(lr, **opt_kwargs), **(dist_kwargs or {}))
    model.compile(optimizer=opt, loss="mse")
    hist = model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=[hk.callbacks.MetricAverageCallback(), *callbacks],
    )
    ref = make_model()
    ref.compile(optimizer=opt_cls(lr, **opt_kwargs), loss="mse")
    ref_hist = ref.fit(
        x,
        y,
        batch_size=N * B,
        epochs=epochs,
        shuffle=False,
        verbose=0,
        callbacks=list(ref_callbacks),
    )
    return model, hist, ref, ref_hist


def test_fit_matches_one_process_and_metrics_are_averaged():
    model, hist, ref, ref_hist = fit_pair()
    weights_close(model, ref)
    same_on_every_rank(model)
    np.testing.assert_allclose(hist.history["loss"], ref_hist.history["loss"], rtol=1e-5)
    assert isinstance(model.optimizer, keras.optimizers.SGD)
    assert type(model.optimizer).__name__ == "SGD"


def test_fit_with_adam_groups_steps_per_execution_and_run_eagerly():
    x, y = global_data(seed=9)
    for run_eagerly in (False, True):
        model = make_model()
        if run_eagerly:
            with pytest.warns(DeprecationWarning, match="num_groups"):
                opt = hk.DistributedOptimizer(keras.optimizers.Adam(0.01), num_groups=2)
        else:
            opt = hk.DistributedOptimizer(keras.optimizers.Adam(0.01), groups=3)
        # graph: two train steps per tf.function call (a tf.while_loop); eager: no graph
        model.compile(
            optimizer=opt,
            loss="mse",
            run_eagerly=run_eagerly,
            steps_per_execution=1 if run_eagerly else 2,
        )
        model.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
        ref = make_model()
        ref.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
        weights_close(model, ref, 1e-4)


@pytest.mark.parametrize("average", [False, True])
def test_fit_backward_passes_per_step(average):
    steps = 4
    x, y = global_data(steps=steps, seed=10)
    model = make_model()
    opt = hk.DistributedOptimizer(
        keras.optimizers.SGD(0.05), backward_passes_per_step=2, average_aggregated_gradients=average
    )
    model.compile(optimizer=opt, loss="mse")
    model.fit(
        local_data(x, steps), local_data(y, steps), batch_size=B, epochs=1, shuffle=False, verbose=0
    )
    assert int(model.optimizer.iterations.numpy()) == steps
    ref = make_model()
    ref_opt = keras.optimizers.SGD(0.05)
    pending = None
    for s in range(steps):
        xb, yb = x[s * N * B : (s + 1) * N * B], y[s * N * B : (s + 1) * N * B]
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(ref(xb) - yb))
        grads = tape.gradient(loss, ref.trainable_variables)
        pending = grads if pending is None else [p + g for p, g in zip(pending, grads, strict=True)]
        if s % 2 == 1:
            if average:
                pending = [p / 2 for p in pending]
            ref_opt.apply_gradients(zip(pending, ref.trainable_variables, strict=True))
            pending = None
    weights_close(model, ref)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_custom_loop_with_distributed_optimizer(mode):
    x, y = global_data(seed=11)
    model = make_model()
    opt = hvdlite.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5))
    assert isinstance(opt, keras.optimizers.SGD)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        opt.apply_gradients(
            zip(
                tape.gradient(loss, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )

    step = tf.function(step) if mode == "graph" else step
    for s in range(STEPS):
        step(my_rows(x, s), my_rows(y, s))
    weights_close(model, reference_tape_training(x, y, keras.optimizers.SGD(0.1, momentum=0.5)))


# ------------------------------------------------------------------ callbacks


def test_broadcast_callback_makes_ranks_start_equal():
    x, y = global_data(seed=12)
    model = make_model(seed=100 + R)  # every rank starts from different weights
    model.compile(
        optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse"
    )
    model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=1,
        shuffle=False,
        verbose=0,
        callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)],
    )
    same_on_every_rank(model)
    ref = make_model(seed=100)  # rank 0's initial weights
    ref.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(model, ref)


def test_learning_rate_schedule_and_warmup_callbacks():
    schedule = hk.callbacks.LearningRateScheduleCallback(
        initial_lr=0.08, multiplier=0.5, start_epoch=1
    )
    model, hist, ref, _ = fit_pair(epochs=3, callbacks=[schedule], lr=0.08)
    np.testing.assert_allclose(hist.history["lr"], [0.08, 0.04, 0.02], rtol=1e-6)

    warmup = hk.callbacks.LearningRateWarmupCallback(initial_lr=0.05 * N, warmup_epochs=2)
    model, hist, _, _ = fit_pair(epochs=3, callbacks=[warmup], lr=0.05 * N)
    # after the last batch of epoch e the rate is initial/N * ((e+1)(N-1)/2 + 1)
    expected = [0.05 * ((e + 1) * (N - 1) / 2 + 1) for e in range(2)] + [0.05 * N]
    np.testing.assert_allclose(hist.history["lr"], expected, rtol=1e-5)


def test_best_model_checkpoint_written_by_rank_zero_only(tmp_path):
    x, y = global_data(seed=13)
    path = os.path.join(str(tmp_path), f"best-rank{R}.keras")
    model = make_model()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    checkpoint = hk.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=path)
    model.fit(
        local_data(x),
        local_data(y),
        batch_size=B,
        epochs=2,
        verbose=0,
        validation_data=(x[:8], y[:8]),
        callbacks=[hk.callbacks.MetricAverageCallback(), checkpoint],
    )
    assert os.path.exists(path) == (R == 0)
    assert checkpoint.best is not None
    assert hvd.allgather_object(float(checkpoint.best)) == [float(checkpoint.best)] * N
    unset = hk.callbacks.BestModelCheckpoint()
    with pytest.raises(ValueError, match="filepath"):
        model.fit(x[:B], y[:B], epochs=1, verbose=0, callbacks=[unset])


def test_load_model_wraps_the_saved_optimizer(tmp_path):
    x, y = global_data(seed=14)
    model, _, ref, _ = fit_pair(epochs=1, seed=14)
    path = os.path.join(str(tmp_path), f"model-rank{R}.keras")
    model.save(path)
    loaded = hk.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    assert hasattr(loaded.optimizer, "_hvd")  # distributed, state kept
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    loaded.fit(local_data(x), local_data(y), batch_size=B, epochs=1, shuffle=False, verbose=0)
    ref.fit(x, y, batch_size=N * B, epochs=1, shuffle=False, verbose=0)
    weights_close(loaded, ref)


# ------------------------------------------------------------------ misuse and values


def test_keras_value_collectives():
    np.testing.assert_allclose(hk.allreduce(np.float32(R), op=hk.Sum).numpy(), N * (N - 1) / 2)
    np.testing.assert_array_equal(hk.allgather(np.array([R])).numpy(), np.arange(N))
    np.testing.assert_array_equal(hk.broadcast(np.array([R, R]), N - 1).numpy(), [N - 1] * 2)
    assert hk.reducescatter(np.ones((N, 2), np.float32), op=hk.Sum).numpy().tolist() == [
        [float(N), float(N)]
    ]


def test_keras_value_collectives_take_uint16():
    mine = np.array([R, 2 * R], np.uint16)
    outs = [
        hk.allreduce(mine, op=hk.Sum),
        hk.allreduce(mine, op=hk.Max),
        hk.allgather(mine),
        hk.broadcast(mine, N - 1),
        hk.reducescatter(np.tile(mine, (N, 1)), op=hk.Sum),
    ]
    assert all(o.dtype == tf.uint16 for o in outs)
    total = N * (N - 1) // 2
    np.testing.assert_array_equal(outs[0].numpy(), [total, 2 * total])
    np.testing.assert_array_equal(outs[1].numpy(), [N - 1, 2 * (N - 1)])
    np.testing.assert_array_equal(outs[2].numpy(), np.stack([[r, 2 * r] for r in range(N)]).ravel())
    np.testing.assert_array_equal(outs[3].numpy(), [N - 1, 2 * (N - 1)])
    np.testing.assert_array_equal(outs[4].numpy(), [[total, 2 * total]])


def test_misuse_errors():
    sgd = keras.optimizers.SGD(0.1)
    wrapped = hk.DistributedOptimizer(sgd)
    with pytest.raises(ValueError, match="already a DistributedOptimizer"):
        hk.DistributedOptimizer(wrapped)
    with pytest.raises(ValueError, match="Average and Sum"):
        hk.DistributedOptimizer(sgd, op=hk.Max)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hk.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op != Average"):
        hk.DistributedOptimizer(sgd, op=hk.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups"):
        hk.DistributedOptimizer(sgd, groups=-1)
    with pytest.raises(ValueError, match="Keras 3 optimizer"):
        hk.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="Keras optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(TypeError, match="tf.GradientTape"):
        hvd.DistributedGradientTape(object())
    with pytest.raises(TypeError, match="unsupported optimizer"):
        hvdlite.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="local layers"):
        hk.PartialDistributedOptimizer(sgd, local_layers=[object()])
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hk.broadcast_global_variables(0)
