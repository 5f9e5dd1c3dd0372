"""Train a digit classifier with Keras 3 ``model.fit`` and hvdlite on scikit-learn's digits.

    hvdrun -np 2 python examples/keras_digits.py
    hvdrun -np 2 python examples/keras_digits.py --compression fp16 --epochs 30
    KERAS_BACKEND=torch hvdrun -np 2 python examples/keras_digits.py
    KERAS_BACKEND=jax hvdrun -np 2 python examples/keras_digits.py

A Horovod Keras script with one changed import: every rank fits on its shard of
the training set, ``hvd.DistributedOptimizer`` averages the gradients inside
the compiled train step, the callbacks broadcast the initial state from rank 0,
average the epoch metrics and warm the learning rate up; only rank 0 shows the
progress bar, prints the test accuracy (averaged over ranks) and writes the best
model.  The 1797 8x8 images ship with scikit-learn, so nothing is downloaded.
The same script runs on Keras' TensorFlow, PyTorch or JAX backend (``KERAS_BACKEND``;
on JAX the gradients are averaged inside the jitted train step).
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
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.002, help="per rank; scaled by size")
    parser.add_argument("--warmup-epochs", type=int, default=3)
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument(
        "--checkpoint",
        default=os.path.join("checkpoints", "keras_digits.keras"),
        help="where rank 0 keeps the best model ('' to skip)",
    )
    parser.add_argument("--threads", type=int, default=1, help="framework threads per rank")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def datasets(seed: int):
    digits = load_digits()
    x = (digits.images.reshape(len(digits.images), 8, 8, 1) / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def build_model() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def limit_threads(threads: int) -> None:
    """Each rank computes on *threads* threads of its backend (ranks share the cores)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    elif keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(threads)
    # JAX: XLA fixes its CPU threads when jax is imported; for one per rank start the
    # job with XLA_FLAGS=--xla_cpu_multi_thread_eigen=false.


def progress_verbosity() -> int:
    """Keras' progress bar redraws one line with terminal codes: fine in a terminal,
    garbage in a log file or under hvdrun (which reads each rank's output through a
    pipe).  There, one line per epoch (verbose=2)."""
    return 1 if sys.stdout.isatty() else 2


def main(argv=None) -> float:
    args = parse_args(argv)
    limit_threads(args.threads)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(args.seed + rank)  # ranks differ; the callback aligns them

    x_train, x_test, y_train, y_test = datasets(args.seed)
    if rank == 0:
        print(
            f"training on {size} rank(s): {len(x_train)} train / {len(x_test)} test images, "
            f"compression={args.compression}, Keras backend {keras.backend.backend()}",
            flush=True,
        )
    x_train, y_train = x_train[rank::size], y_train[rank::size]  # this rank's shard

    model = build_model()
    optimizer = hvd.DistributedOptimizer(
        keras.optimizers.Adam(args.lr * size),
        compression=getattr(hvd.Compression, args.compression),
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=args.lr * size, warmup_epochs=args.warmup_epochs, verbose=1
        ),
    ]
    if args.checkpoint:
        if rank == 0:
            os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        callbacks.append(
            hvd.callbacks.BestModelCheckpoint(monitor="val_loss", filepath=args.checkpoint)
        )

    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        validation_data=(x_test[rank::size], y_test[rank::size]),
        callbacks=callbacks,
        verbose=progress_verbosity() if rank == 0 else 0,
    )

    # Each rank scores its shard of the test set; the average is the test accuracy.
    _, accuracy = model.evaluate(x_test[rank::size], y_test[rank::size], verbose=0)
    counts = hvd.allgather_object((accuracy, len(y_test[rank::size])))
    accuracy = sum(a * n for a, n in counts) / sum(n for _, n in counts)
    if rank == 0:
        print(f"final test accuracy {100 * accuracy:.2f}% ({size} ranks)", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
