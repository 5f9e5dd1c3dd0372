"""Train a digit classifier with hvdlite.jax (plain JAX + optax) on scikit-learn's digits.

    hvdrun -np 2 python examples/jax_digits.py
    hvdrun -np 2 python examples/jax_digits.py --compression fp16 --epochs 30
    hvdrun -np 2 python examples/jax_digits.py --eager-reduce

A two-layer MLP written with jax.numpy: every rank trains on its shard of the
training set, ``hvd.DistributedOptimizer`` averages the gradients (inside the
jitted step, as one ordered host callback per step; with ``--eager-reduce`` the
step is jitted up to the gradients and the reduction runs eagerly), rank 0
prints progress and the test accuracy (summed over ranks' shards).  The 1797
8x8 images ship with scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import hvdlite.jax as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by size")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument(
        "--compression", choices=["none", "fp16", "bf16"], default="none", help="wire dtype"
    )
    parser.add_argument(
        "--eager-reduce",
        action="store_true",
        help="reduce the gradients eagerly, outside the jitted gradient step",
    )
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def datasets(seed: int):
    digits = load_digits()
    x = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)


def init_params(key, hidden: int):
    k1, k2 = jax.random.split(key)
    return {
        "hidden": {"w": jax.random.normal(k1, (64, hidden)) * 64**-0.5, "b": jnp.zeros(hidden)},
        "out": {"w": jax.random.normal(k2, (hidden, 10)) * hidden**-0.5, "b": jnp.zeros(10)},
    }


def logits(params, x):
    h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits(params, x), y).mean()


def make_step(tx, eager_reduce: bool):
    """One training step: the whole step jitted (the reduction an ordered host
    callback inside it), or the gradient jitted and the reduction eager."""
    if eager_reduce:
        grad = jax.jit(jax.value_and_grad(loss_fn))
        apply = jax.jit(optax.apply_updates)

        def step(params, state, x, y):
            loss, grads = grad(params, x, y)
            updates, state = tx.update(grads, state, params)
            return apply(params, updates), state, loss

        return step

    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return step


def shard(n: int, epoch: int, seed: int) -> np.ndarray:
    """This rank's rows of the epoch's permutation: the same count on every rank,
    so every rank runs the same number of steps."""
    order = np.random.RandomState(seed + epoch).permutation(n)
    rows = n // hvd.size()
    return order[hvd.rank() * rows : (hvd.rank() + 1) * rows]


def evaluate(params, x, y) -> tuple[float, float]:
    """Loss and accuracy over every rank's shard of the test set."""
    mine = np.arange(hvd.rank(), len(y), hvd.size())
    out = logits(params, x[mine])
    totals = jnp.array(
        [
            optax.softmax_cross_entropy_with_integer_labels(out, y[mine]).sum(),
            (out.argmax(1) == y[mine]).sum(),
            len(mine),
        ],
        dtype=jnp.float32,
    )
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval_totals")
    return float(totals[0] / totals[2]), float(totals[1] / totals[2])


def main(argv=None) -> float:
    args = parse_args(argv)
    hvd.init()
    x_train, x_test, y_train, y_test = datasets(args.seed)

    # Start every rank from rank 0's parameters (each rank draws its own here).
    params = init_params(jax.random.PRNGKey(args.seed + hvd.rank()), args.hidden)
    params = hvd.broadcast_parameters(params, root_rank=0)
    # Averaged gradients of size x the batch allow size x the step.
    tx = hvd.DistributedOptimizer(
        optax.sgd(args.lr * hvd.size(), momentum=0.9),
        compression=getattr(hvd.Compression, args.compression),
    )
    state = tx.init(params)
    step = make_step(tx, args.eager_reduce)
    if hvd.rank() == 0:
        print(
            f"training on {hvd.size()} rank(s): {len(y_train)} train / {len(y_test)} test "
            f"images, compression={args.compression}, "
            f"reduction {'eager' if args.eager_reduce else 'inside jit'}",
            flush=True,
        )

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        rows = shard(len(y_train), epoch, args.seed)
        loss_sum, batches = 0.0, 0
        for first in range(0, len(rows), args.batch_size):
            idx = rows[first : first + args.batch_size]
            params, state, loss = step(params, state, x_train[idx], y_train[idx])
            loss_sum, batches = loss_sum + float(loss), batches + 1
        train_loss = float(hvd.allreduce(jnp.float32(loss_sum / batches), name="train_loss"))
        test_loss, accuracy = evaluate(params, x_test, y_test)
        if hvd.rank() == 0:
            print(
                f"epoch {epoch:3d}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                f"test accuracy {accuracy:.2%}",
                flush=True,
            )
    if hvd.rank() == 0:
        print(
            f"final test accuracy {accuracy:.2%} after {args.epochs} epochs in "
            f"{time.perf_counter() - start:.1f} s",
            flush=True,
        )
    return accuracy


if __name__ == "__main__":
    main()
