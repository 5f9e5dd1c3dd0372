"""Keras 3 ``model.fit`` on the JAX backend: hvdlite's DistributedOptimizer beside
the same fit without communication.

Run as ``python benchmarks/bench_keras_jax.py`` (it starts its own 2-rank job with
the mpiexec beside this Python) or directly under ``mpiexec -n 2``.

Workload: the MLP of ``bench_jax`` (784-1024-1024-10, 1.8 M float32 parameters,
7.3 MB of gradients) as a Keras ``Sequential``, batch 64 per rank, SGD with
momentum, Keras' jitted train step, XLA's CPU client on one thread per rank.
Each rank holds two compiled copies of the model:

- ``hvdlite``: ``hvdlite.keras.DistributedOptimizer``: the gradients are averaged
  inside the jitted step, one ordered host callback (one grouped allreduce) per step;
- ``nocomm``: the plain optimizer, the same step without communication.

A repetition is one ``model.fit`` of 10 steps (``verbose=0``, no callbacks), the
two modes alternating (so load from elsewhere on the machine hits both alike); the
figure is the median time per step over the repetitions, and the ratio hvdlite /
nocomm.  For information, the same pair with ``run_eagerly=True`` (hvdlite.jax's
eager path: zero-copy host views, no callback).
"""

from __future__ import annotations

import os
import sys

from _jobs import paired_times, run_self_or_launch, short_time  # this script's folder

BATCH = 64
STEPS = 10


def run_ranks() -> None:
    os.environ["KERAS_BACKEND"] = "jax"
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    )
    import jax
    import keras
    import numpy as np
    from mpi4py import MPI

    import hvdlite.keras as hvd

    hvd.init()
    comm = MPI.COMM_WORLD
    rank = hvd.rank()
    rs = np.random.RandomState(rank)
    x = rs.randn(STEPS * BATCH, 784).astype(np.float32)
    y = rs.randint(0, 10, STEPS * BATCH).astype(np.int32)

    def fitter(distributed: bool, eager: bool = False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(1024, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        opt = keras.optimizers.SGD(1e-3, momentum=0.9)
        if distributed:
            opt = hvd.DistributedOptimizer(opt)
        model.compile(
            optimizer=opt,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=eager,
        )

        def run():
            model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
            jax.block_until_ready(model.trainable_variables[0].value)

        for _ in range(2):  # compile (both batch shapes) and warm up
            run()
        return run

    rows = []
    for label, eager, repeats in (("fit step, jitted", False, 11), ("fit step, eager", True, 5)):
        dist, plain = fitter(True, eager), fitter(False, eager)
        t_dist, t_plain = paired_times(dist, plain, 1, repeats, comm.Barrier)
        rows.append((label, t_dist / STEPS, t_plain / STEPS))

    if rank == 0:
        print(
            f"\nKeras {keras.__version__} on JAX {jax.__version__}: {comm.Get_size()} ranks, "
            f"MLP 784-1024-1024-10, batch {BATCH}/rank, SGD momentum, 1 XLA thread/rank"
        )
        print(f"{'figure':20} {'hvdlite':>10} {'no comm':>10} {'ratio':>7}")
        for label, t, tb in rows:
            print(f"{label:20} {short_time(t):>10} {short_time(tb):>10} {t / tb:>6.2f}x")
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(run_self_or_launch(run_ranks, __file__))
