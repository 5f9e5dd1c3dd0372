"""Keras 3 training with hvdlite beside no communication and beside tf.distribute.

Run as ``python benchmarks/bench_tf_keras.py``: it starts every job itself,
2 ranks each, with the mpiexec beside this Python:

- ``nocomm-fit`` / ``nocomm-tape``: 2 processes each training its own copy
  with ``model.fit`` / a ``tf.function`` GradientTape step, no communication
  (the floor: the same compute competing for the same cores);
- ``hvdlite-fit``: ``model.fit`` with ``hvdlite.tensorflow.keras.DistributedOptimizer``;
- ``hvdlite-tape``: the tape step with ``hvdlite.tensorflow.DistributedGradientTape``;
- ``mwms-tape``: the tape step under ``tf.distribute.MultiWorkerMirroredStrategy``
  (2 workers on localhost, gRPC collectives), ``strategy.run`` in a ``tf.function``;
- ``floor-tape``: the no-communication tape step plus, every step, what any
  2-rank allreduce from Python must at least do here: one ``numpy_function``
  over the gradients that waits on a barrier (the ranks run in lockstep) and
  makes one copy and one add of every gradient.  hvdlite cannot beat it;
- ``mwms-fit`` (run once): ``model.fit`` under that strategy, to record whether
  Keras 3 supports it.

Workload: Keras MLP 784-1024-1024-10, batch 64 per rank, SGD with momentum, one
TensorFlow intra-op (and inter-op) thread per rank.  The jobs run in rounds
(every mode once per round) so load from elsewhere on the machine hits all
alike; a job's figure is the median step time over its steps (fit: time between
consecutive batch ends) or blocks of steps (tape), a mode's figure the median
over rounds, and a ratio the median of the ratios within each round (so a round
disturbed by load elsewhere compares like with like).  Printed: each figure
beside its baseline and the ratio (targets: hvdlite / no-communication step
time <= 1.2, hvdlite / MWMS throughput >= 2.5).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import _jobs

ROOT = _jobs.ROOT
BATCH = 64
RANKS = _jobs.RANKS
MODES = ("nocomm-fit", "hvdlite-fit", "nocomm-tape", "hvdlite-tape", "mwms-tape", "floor-tape")


# ------------------------------------------------------------------ worker side


def _model(keras):
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(1024, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _data(rank, steps):
    import numpy as np

    rs = np.random.RandomState(rank)
    return (
        rs.rand(steps * BATCH, 784).astype(np.float32),
        rs.randint(0, 10, size=steps * BATCH).astype(np.int64),
    )


def worker(mode: str, steps: int, block: int, ports: list[int]) -> None:
    rank, _ = _jobs.rank_and_size()
    if mode.startswith("mwms"):
        os.environ["TF_CONFIG"] = json.dumps(
            {
                "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                "task": {"type": "worker", "index": rank},
            }
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    barrier = lambda: None  # noqa: E731
    strategy = None
    if mode.startswith("mwms"):
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif mode.startswith("hvdlite"):
        import hvdlite.tensorflow as hvd

        hvd.init()
        barrier = hvd.barrier
    else:
        from mpi4py import MPI

        barrier = MPI.COMM_WORLD.Barrier

    x, y = _data(rank, steps)
    scope = strategy.scope() if strategy else _nullcontext()
    with scope:
        model = _model(keras)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
        if mode == "hvdlite-fit":
            import hvdlite.tensorflow.keras as hk

            opt = hk.DistributedOptimizer(opt)
    per_example = strategy is not None and mode.endswith("tape")
    loss_fn = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none" if per_example else "sum_over_batch_size"
    )

    if mode.endswith("fit"):
        times = _run_fit(keras, model, opt, loss_fn, x, y, steps, barrier)
    else:
        times = _run_tape(tf, model, opt, loss_fn, x, y, steps, block, barrier, mode, strategy)
    if rank == 0:
        print("RESULT " + json.dumps({"mode": mode, "step": statistics.median(times)}), flush=True)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _run_fit(keras, model, opt, loss_fn, x, y, steps, barrier):
    model.compile(optimizer=opt, loss=loss_fn)
    warm = 10
    model.fit(
        x[: warm * BATCH], y[: warm * BATCH], batch_size=BATCH, epochs=1, verbose=0, shuffle=False
    )
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            ends.append(time.perf_counter())

    barrier()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False, callbacks=[Clock()])
    return [b - a for a, b in zip(ends[1:], ends[2:], strict=False)]


def _run_tape(tf, model, opt, loss_fn, x, y, steps, block, barrier, mode, strategy):
    batches = [
        (tf.constant(x[i * BATCH : (i + 1) * BATCH]), tf.constant(y[i * BATCH : (i + 1) * BATCH]))
        for i in range(steps)
    ]
    if strategy is None:
        distributed = mode.startswith("hvdlite")
        if distributed:
            import hvdlite.tensorflow as hvd

        touch = _jobs.tf_floor(tf) if mode == "floor-tape" else None

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            if touch is not None:
                grads = touch(grads)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss
    else:
        global_batch = BATCH * strategy.num_replicas_in_sync

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(loss_fn(yb, model(xb, training=True))) / global_batch
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        @tf.function
        def step(xb, yb):
            per_replica = strategy.run(replica_step, args=(xb, yb))
            return strategy.reduce("SUM", per_replica, axis=None)

    for xb, yb in batches[:10]:
        step(xb, yb)
    float(step(*batches[0]))
    barrier()
    times = []
    for start in range(0, steps - block + 1, block):
        t = time.perf_counter()
        for xb, yb in batches[start : start + block]:
            loss = step(xb, yb)
        float(loss)
        times.append((time.perf_counter() - t) / block)
    return times


# ------------------------------------------------------------------ launcher side


def run_job(mode: str, steps: int, block: int, timeout: float = 600) -> tuple[float | None, str]:
    """(median step seconds or None, the job's output)."""
    ports = _jobs.free_ports(RANKS)
    cmd = [
        _jobs.mpiexec(),
        "-n",
        str(RANKS),
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--steps",
        str(steps),
        "--block",
        str(block),
        "--ports",
        ",".join(map(str, ports)),
    ]
    env = _jobs.job_env()  # glibc's malloc tuned as hvdlite.init() tunes it, in every mode
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        return None, f"timed out after {timeout:.0f}s\n{e.stdout or ''}"
    text = out.stdout + out.stderr
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])["step"], text
    return None, text


def _first_error(text: str) -> str:
    """The exception of a failed job, in one line."""
    errors = [ln.strip() for ln in text.splitlines() if re.match(r"^\w+(Error|Exception): ", ln)]
    if "PerReplica" in text and "unsupported type" in text:
        return (
            "ValueError: Attempt to convert a value (PerReplica:{...}) with an unsupported "
            "type (PerReplica) to a Tensor"
        )
    if errors:
        return errors[-1][:200]
    return text.strip().splitlines()[-1][:200] if text.strip() else "no output"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--ports", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, args.steps, args.block, [int(p) for p in args.ports.split(",")])
        return 0

    results: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for mode in MODES:
            step, text = run_job(mode, args.steps, args.block)
            if step is None:
                print(f"{mode} failed:\n{text[-3000:]}", flush=True)
                return 1
            results[mode].append(step)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{m} {results[m][-1] * 1e3:.1f}ms" for m in MODES),
            flush=True,
        )
    fit_step, fit_text = run_job("mwms-fit", 20, args.block)
    step = {m: statistics.median(v) for m, v in results.items()}
    img_s = {m: RANKS * BATCH / s for m, s in step.items()}

    def ratio(a, b):
        return statistics.median(x / y for x, y in zip(results[a], results[b], strict=True))

    print(
        f"\nKeras MLP 784-1024-1024-10, batch {BATCH}/rank, SGD momentum, 1 thread/rank, "
        f"{RANKS} ranks, median of {args.rounds} rounds"
    )
    print(f"{'':40s}{'hvdlite':>12s}{'baseline':>12s}{'ratio':>8s}  target")
    for kind in ("fit", "tape"):
        h, b = step[f"hvdlite-{kind}"], step[f"nocomm-{kind}"]
        print(
            f"{f'{kind}: step time vs no communication':40s}{h * 1e3:10.2f}ms{b * 1e3:10.2f}ms"
            f"{ratio(f'hvdlite-{kind}', f'nocomm-{kind}'):7.2f}x  <= 1.2x"
        )
    h, m = img_s["hvdlite-tape"], img_s["mwms-tape"]
    print(
        f"{'tape: throughput vs MultiWorkerMirrored':40s}{h:8.0f}img/s{m:8.0f}img/s"
        f"{ratio('mwms-tape', 'hvdlite-tape'):7.2f}x  >= 2.5x"
    )
    h, f = step["hvdlite-tape"], step["floor-tape"]
    print(
        f"{'tape: step time vs the floor (see above)':40s}{h * 1e3:10.2f}ms{f * 1e3:10.2f}ms"
        f"{ratio('hvdlite-tape', 'floor-tape'):7.2f}x  (info; floor / no-comm = "
        f"{ratio('floor-tape', 'nocomm-tape'):.2f}x)"
    )
    print(
        f"(MWMS step time = {ratio('mwms-tape', 'nocomm-tape'):.2f}x the "
        "no-communication step time)"
    )
    if fit_step is None:
        print(f"model.fit under MultiWorkerMirroredStrategy failed: {_first_error(fit_text)}")
    else:
        print(
            f"model.fit under MultiWorkerMirroredStrategy: {fit_step * 1e3:.2f}ms/step "
            f"({step['hvdlite-fit'] / fit_step:.2f}x hvdlite's fit step time)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
