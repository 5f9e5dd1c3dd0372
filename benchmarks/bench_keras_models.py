"""Keras 3 ``model.fit`` on real model shapes (~130-160 weights) beside the floor and tf.distribute.

Run as ``python benchmarks/bench_keras_models.py``: it starts every job
itself, 2 ranks each, with the mpiexec beside this Python.  Two kinds of job
take turns, each training both models one after the other:

- ``interleaved``: one process per rank holds four copies of the model,
  each compiled for one mode, and runs ``model.fit`` on them in turns of a
  few steps each (order reversed every other turn), so that whatever the
  machine does meanwhile falls on every mode alike:

  - ``nocomm``: no communication;
  - ``floor``: ``nocomm`` plus, every step where the optimizer applies the
    gradients, what any 2-rank allreduce from Python must at least do here:
    one ``numpy_function`` over the gradients that waits on a barrier (the
    ranks run in lockstep) and makes one copy and one add of every
    gradient, the small ones crossing packed as hvdlite packs them and a
    sparse one (the embedding's ``IndexedSlices``) staying sparse
    (``_jobs.tf_floor``, the floor of ``bench_tf_keras.py``).  hvdlite
    cannot beat it;
  - ``exchange``: the floor with its copy made in shared memory and its add
    taking the peer's copy (``tf_floor(exchange=True)``): every gradient byte
    crosses between the two processes once, as in any real allreduce, so it
    also pays what moving data between the cores costs at that minute;
  - ``hvdlite``: ``model.fit`` with ``hvdlite.tensorflow.keras.DistributedOptimizer``
    (its defaults: a sparse gradient is allgathered, as in Horovod);

- ``mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` (2 workers on
  localhost, ``TF_CONFIG``, gRPC collectives), same model, optimizer and
  global batch.  Keras 3's ``model.fit`` fails under this strategy (see
  ``bench_tf_keras.py``), so this job runs what a Keras 3 user writes
  instead: a ``tf.function`` train step under ``strategy.run``.

Workloads (Keras layers, SGD with momentum, one TensorFlow intra-op and
inter-op thread per rank, ``jit_compile=False`` in every mode):

- ``resnet``: ResNet-50's layout (bottleneck blocks 3-4-6-3, Conv2D without
  bias + BatchNormalization, 161 weights) at width 8 on 32x32x3 inputs,
  batch 8 per rank;
- ``transformer``: 8 encoder blocks (MultiHeadAttention, 4 heads, d_model 64,
  feed-forward 128, post-LayerNorm) over 32 tokens, batch 8 per rank (132
  weights).

Method: a turn's figure is its median step time (from batch-end callbacks);
a ratio is the median over all turns of all jobs of the two modes' ratio in
the same turn, and each job's own median ratio is printed beside it.  On this
machine the speed of memory shared between the two cores changes from
minute to minute (which the floor, touching only its own memory, does not
feel), so the per-job ratios differ by more than the noise of one job.
MWMS runs in jobs of its own: its figure is its best job against hvdlite's
best job.  Printed per model: each figure beside its baseline and the ratio
(target: hvdlite / floor step time <= 1.05; against MWMS for information).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import _jobs

RANKS = _jobs.RANKS
#: The modes that take turns inside one job; MWMS runs as a job of its own.
INTERLEAVED = ("nocomm", "floor", "exchange", "hvdlite")
JOBS = ("interleaved", "mwms")
MODELS = ("resnet", "transformer")
BATCH = {"resnet": 8, "transformer": 8}
SEQ = 32
VOCAB = 1000
WARMUP = 5
STAGES = (3, 4, 6, 3)  # bottleneck blocks per stage, as in ResNet-50
TITLE = {
    "resnet": "Keras ResNet-style CNN (bottlenecks 3-4-6-3, width 8, conv+BN), 32x32x3 inputs",
    "transformer": "Keras transformer encoder (8 blocks, d_model 64, 4 heads, ff 128), 32 tokens",
}


# ------------------------------------------------------------------ models


def _resnet(keras):
    from keras import layers

    def conv_bn(x, filters, kernel, stride=1):
        x = layers.Conv2D(filters, kernel, stride, padding="same", use_bias=False)(x)
        return layers.BatchNormalization()(x)

    width = 8
    inputs = keras.Input((32, 32, 3))
    # A stride-2 stem keeps the first stage at 16x16 (a step in tens of ms).
    x = layers.ReLU()(conv_bn(inputs, width, 3, 2))
    cin = width
    for stage, n in enumerate(STAGES):
        w = width << stage
        for i in range(n):
            stride = 2 if i == 0 and stage else 1
            y = layers.ReLU()(conv_bn(x, w, 1))
            y = layers.ReLU()(conv_bn(y, w, 3, stride))
            y = conv_bn(y, 4 * w, 1)
            if stride != 1 or cin != 4 * w:
                x = conv_bn(x, 4 * w, 1, stride)
            x = layers.ReLU()(layers.Add()([x, y]))
            cin = 4 * w
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10)(x))


def _transformer(keras, d_model=64, blocks=8):
    from keras import layers

    class AddPosition(layers.Layer):
        def build(self, input_shape):
            self.pos = self.add_weight(shape=input_shape[1:], initializer="zeros", name="pos")

        def call(self, x):
            return x + self.pos

    inputs = keras.Input((SEQ,), dtype="int32")
    x = AddPosition()(layers.Embedding(VOCAB, d_model)(inputs))
    for _ in range(blocks):
        x = layers.LayerNormalization()(x + layers.MultiHeadAttention(4, d_model // 4)(x, x))
        ff = layers.Dense(d_model)(layers.Dense(128, activation="relu")(x))
        x = layers.LayerNormalization()(x + ff)
    x = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, layers.Dense(10)(x))


def _data(name: str, rank: int, n: int):
    import numpy as np

    rs = np.random.RandomState(rank)
    if name == "resnet":
        x = rs.rand(n, 32, 32, 3).astype(np.float32)
    else:
        x = rs.randint(0, VOCAB, size=(n, SEQ)).astype(np.int32)
    return x, rs.randint(0, 10, size=n).astype(np.int64)


# ------------------------------------------------------------------ worker side


def worker(mode: str, models: list[str], steps: int, block: int, ports: list[int]) -> None:
    rank, _ = _jobs.rank_and_size()
    if mode == "mwms":
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                "task": {"type": "worker", "index": rank},
            }
        )
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if mode == "mwms":
        from mpi4py import MPI

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        for name in models:
            _time_mwms(tf, name, rank, strategy, MPI.COMM_WORLD.Barrier, steps, block)
        return
    import hvdlite.tensorflow as hvd

    hvd.init()
    for name in models:
        _time_interleaved(tf, name, rank, steps, block)


def _time_interleaved(tf, name, rank, steps, block) -> None:
    """``model.fit`` of one model per mode in INTERLEAVED, all in this process,
    taking turns a block of steps at a time (the order reversed every other
    turn), so whatever the machine does meanwhile falls on every mode alike."""
    import keras
    from mpi4py import MPI

    barrier = MPI.COMM_WORLD.Barrier
    batch = BATCH[name]
    x, y = _data(name, rank, (WARMUP + block + 1) * batch)
    fits = {}
    for mode in INTERLEAVED:
        keras.utils.set_random_seed(0)  # the same initial weights on every rank
        model = _resnet(keras) if name == "resnet" else _transformer(keras)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if mode == "hvdlite":
            import hvdlite.tensorflow.keras as hvd

            opt = hvd.DistributedOptimizer(opt)
        elif mode in ("floor", "exchange"):
            opt = _floor_optimizer(tf, keras, opt, exchange=mode == "exchange")
        # Built before the first trace: a train step that creates the optimizer's
        # variables is traced twice by tf.function (seconds per model, every mode).
        opt.build(model.trainable_variables)
        model.compile(
            optimizer=opt,
            jit_compile=False,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        warm = WARMUP * batch
        model.fit(x[:warm], y[:warm], batch_size=batch, epochs=1, verbose=0, shuffle=False)
        fits[mode] = model
    times: dict[str, list[float]] = {mode: [] for mode in INTERLEAVED}
    for turn in range(max(1, steps // block)):
        for mode in INTERLEAVED if turn % 2 == 0 else INTERLEAVED[::-1]:
            barrier()
            times[mode].append(
                _fit_block(keras, fits[mode], x[WARMUP * batch :], y[WARMUP * batch :], batch)
            )
    _jobs.report(model=name, weights=len(fits["hvdlite"].trainable_weights), turns=times)


def _fit_block(keras, model, x, y, batch) -> float:
    """One ``model.fit`` over the batches of *x*; the median step time, from the
    batch-end callbacks (the first batch ends the fit's own setup)."""
    ends: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False, callbacks=[Clock()])
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def _floor_optimizer(tf, keras, opt, exchange=False):
    """``opt`` (a Keras SGD) with the floor's work where hvdlite reduces: in ``apply``."""
    touch = _jobs.tf_floor(tf, exchange)

    class FloorSGD(type(opt)):
        def apply(self, grads, trainable_variables=None):
            return super().apply(touch(list(grads)), trainable_variables)

    return FloorSGD.from_config(opt.get_config())


def _time_mwms(tf, name, rank, strategy, barrier, steps, block) -> None:
    import keras

    keras.utils.set_random_seed(0)  # the same initial weights on every rank
    batch = BATCH[name]
    x, y = _data(name, rank, (WARMUP + steps + 1) * batch)
    with strategy.scope():
        model = _resnet(keras) if name == "resnet" else _transformer(keras)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        opt.build(model.trainable_variables)
    seconds = _time_strategy_step(
        tf, keras, strategy, model, opt, x, y, batch, steps, block, barrier
    )
    _jobs.report(model=name, step=seconds)


def _time_strategy_step(
    tf, keras, strategy, model, opt, x, y, batch, steps, block, barrier
) -> float:
    global_batch = batch * strategy.num_replicas_in_sync
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(loss_fn(yb, model(xb, training=True))) / global_batch
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function(jit_compile=False)
    def train_step(xb, yb):
        # This worker's loss only: no extra collective beyond the gradients'.
        return strategy.experimental_local_results(strategy.run(replica_step, args=(xb, yb)))[0]

    batches = [
        (tf.constant(x[i : i + batch]), tf.constant(y[i : i + batch]))
        for i in range(0, len(x) - batch + 1, batch)
    ]
    for xb, yb in batches[:WARMUP]:
        float(train_step(xb, yb))
    barrier()
    timed = iter(batches[WARMUP:])

    def step():
        float(train_step(*next(timed)))

    return _jobs.median_step(step, steps, block)


# ------------------------------------------------------------------ launcher side


def _print_model(
    name: str, weights: int, turns: dict, jobs: list[dict], mwms: list[float], block: int
) -> None:
    """*turns*: mode -> every turn's step time over all jobs; *jobs*: each job's
    turns (mode -> list); *mwms*: each MWMS job's step time."""
    batch = BATCH[name]
    unit = "img/s" if name == "resnet" else "seq/s"
    n_turns = len(turns["hvdlite"])
    print(
        f"\n{name}: {TITLE[name]}; {weights} weights, batch {batch}/rank, {RANKS} ranks; "
        f"{len(jobs)} jobs x {n_turns // len(jobs)} turns of {block} steps per mode, "
        "modes interleaved within each job (median step per turn)"
    )
    print(f"{'':40s}{'hvdlite':>12s}{'baseline':>12s}{'ratio':>8s}  target")
    h, f, n = (statistics.median(turns[m]) for m in ("hvdlite", "floor", "nocomm"))
    r = _jobs.paired(turns, "hvdlite", "floor")
    print(
        f"{'fit step vs the floor, per turn':40s}{h * 1e3:10.2f}ms{f * 1e3:10.2f}ms{r:8.3f}  "
        f"<= 1.05  {'ok' if r <= 1.05 else 'MISSED'}"
    )
    print(
        f"{'  the same, each job':40s}{'':24s}  "
        + ", ".join(f"{_jobs.paired(job, 'hvdlite', 'floor'):.3f}" for job in jobs)
    )
    e = statistics.median(turns["exchange"])
    r_e = _jobs.paired(turns, "hvdlite", "exchange")
    print(
        f"{'fit step vs the exchange floor, per turn':40s}{h * 1e3:10.2f}ms{e * 1e3:10.2f}ms"
        f"{r_e:8.3f}  (info; each job: "
        + ", ".join(f"{_jobs.paired(job, 'hvdlite', 'exchange'):.3f}" for job in jobs)
        + ")"
    )
    crossing = _jobs.paired(turns, "exchange", "floor")
    print(
        f"{'exchange floor vs the floor, per turn':40s}{e * 1e3:10.2f}ms{f * 1e3:10.2f}ms"
        f"{crossing:8.3f}  (info; what moving the data between the cores adds; "
        + ("the 1.05 target is below the exchange floor" if crossing > 1.05 else "room for 1.05")
        + ")"
    )
    print(
        f"{'fit step vs no communication, per turn':40s}{h * 1e3:10.2f}ms{n * 1e3:10.2f}ms"
        f"{_jobs.paired(turns, 'hvdlite', 'nocomm'):8.3f}  (info; floor / no-comm = "
        f"{_jobs.paired(turns, 'floor', 'nocomm'):.3f})"
    )
    m = min(mwms)
    best = min(statistics.median(job["hvdlite"]) for job in jobs)
    print(
        f"{'throughput vs MultiWorkerMirrored':40s}{RANKS * batch / best:7.0f}{unit}"
        f"{RANKS * batch / m:7.0f}{unit}{m / best:8.3f}  (info; best job of each, "
        "separate jobs)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=JOBS, help=argparse.SUPPRESS)
    parser.add_argument("--ports", default="", help=argparse.SUPPRESS)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument(
        "--turns",
        type=int,
        default=6,
        help="turns per mode and job (modes take turns within a job)",
    )
    parser.add_argument("--block", type=int, default=10, help="steps per turn")
    parser.add_argument("--rounds", type=int, default=3, help="jobs of each kind, alternating")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if not set(models) <= set(MODELS):
        parser.error(f"--models: choose from {', '.join(MODELS)}")
    steps = args.turns * args.block
    if args.worker:
        ports = [int(p) for p in args.ports.split(",") if p]
        worker(args.worker, models, steps, args.block, ports)
        return 0

    jobs: dict[str, list[dict]] = {name: [] for name in models}
    mwms: dict[str, list[float]] = {name: [] for name in models}
    weights: dict[str, int] = {}
    try:
        for r in range(args.rounds):
            start = time.perf_counter()
            for job in JOBS:
                ports = ",".join(map(str, _jobs.free_ports(RANKS)))
                for rec in _jobs.run_job(
                    __file__,
                    [
                        job,
                        "--models",
                        args.models,
                        "--turns",
                        args.turns,
                        "--block",
                        args.block,
                        "--ports",
                        ports,
                    ],
                ):
                    if job == "mwms":
                        mwms[rec["model"]].append(rec["step"])
                    else:
                        jobs[rec["model"]].append(rec["turns"])
                        weights[rec["model"]] = rec["weights"]
            print(
                f"round {r + 1}/{args.rounds} ({time.perf_counter() - start:.0f}s): "
                + "; ".join(
                    f"{name} "
                    + ", ".join(
                        f"{m} {statistics.median(jobs[name][-1][m]) * 1e3:.1f}ms"
                        for m in INTERLEAVED
                    )
                    + f", mwms {mwms[name][-1] * 1e3:.1f}ms"
                    for name in models
                ),
                flush=True,
            )
    except _jobs.JobFailed as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    for name in models:
        turns = {m: [t for job in jobs[name] for t in job[m]] for m in INTERLEAVED}
        _print_model(name, weights[name], turns, jobs[name], mwms[name], args.block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
