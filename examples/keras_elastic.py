"""Elastic Keras ``model.fit``: a rank fails mid-epoch, the job resumes from its last commit.

    hvdrun -np 2 --max-restarts 1 python examples/keras_elastic.py
    hvdrun -np 2 --max-restarts 1 python examples/keras_elastic.py --fail-at-step 0  # no failure
    KERAS_BACKEND=torch hvdrun -np 2 --max-restarts 1 python examples/keras_elastic.py
    KERAS_BACKEND=jax hvdrun -np 2 --max-restarts 1 python examples/keras_elastic.py

Horovod's Keras elastic API on scikit-learn's digits.  ``KerasState`` keeps the
model (with its optimizer) and the number of finished epochs; the callbacks
keep ``state.epoch`` and ``state.batch`` current and call ``state.commit()``
every ``--commit-every`` batches and at each epoch's end (rank 0 writes it to
hvdrun's state directory, ``--elastic-state-dir``).

To show the recovery, the last rank of the first launch exits in the middle of
the second epoch (``--fail-at-step``, counted from the start).  hvdrun stops the
other ranks and starts the job again; every rank resumes from the last commit
and ``fit`` runs the epochs that are left.  (Keras 3's ``fit`` cannot start in
the middle of an epoch: the interrupted epoch runs all its steps again, from
the committed weights.)  Rank 0 prints one line per epoch and the test accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import hvdlite.keras as hvd  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="per rank; scaled by size")
    parser.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=30,
        help="in the first launch, the last rank exits after this step (0: never)",
    )
    return parser.parse_args(argv)


class SimulatedFailure(keras.callbacks.Callback):
    """In the first launch, the last rank exits after global step *at*."""

    def __init__(self, at: int, launch: int) -> None:
        super().__init__()
        self.at, self.launch, self.steps = at, launch, 0

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.steps += 1
        if self.launch == 0 and hvd.rank() == hvd.size() - 1 and self.steps == self.at:
            print(f"rank {hvd.rank()}: simulated failure after step {self.steps}", flush=True)
            os._exit(1)


def main(argv=None) -> float:
    args = parse_args(argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))  # hvdrun counts launches
    keras.utils.set_random_seed(0)  # the same initial weights on every rank

    digits = load_digits()
    x = (digits.images.reshape(len(digits.images), 64) / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=42, stratify=digits.target
    )
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this rank's shard

    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(args.lr * size)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)
    callbacks = [
        hvd.callbacks.MetricAverageCallback(),
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),
        SimulatedFailure(args.fail_at_step, launch),
    ]

    @hvd.elastic.run
    def train(state) -> None:
        if rank == 0:
            print(f"launch {launch}: {hvd.size()} rank(s) start at epoch {state.epoch}", flush=True)
        model.fit(
            x_train,
            y_train,
            batch_size=args.batch_size,
            epochs=args.epochs - state.epoch,
            callbacks=callbacks,
            # One line per epoch unless rank 0 writes to a terminal (under hvdrun it never does).
            verbose=(1 if sys.stdout.isatty() else 2) if rank == 0 else 0,
        )

    train(state)

    # Each rank scores its shard of the test set; the average is the test accuracy.
    _, accuracy = model.evaluate(x_test[rank::size], y_test[rank::size], verbose=0)
    counts = hvd.allgather_object((accuracy, len(y_test[rank::size])))
    accuracy = sum(a * n for a, n in counts) / sum(n for _, n in counts)
    if rank == 0:
        print(f"final test accuracy {100 * accuracy:.2f}% ({size} ranks)", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
