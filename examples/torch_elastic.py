"""Elastic training with hvdlite.torch: a rank fails mid-epoch, the job resumes from a commit.

    hvdrun -np 2 --max-restarts 1 python examples/torch_elastic.py
    hvdrun -np 2 --max-restarts 1 python examples/torch_elastic.py --fail-at-step 0  # no failure

Horovod's elastic API on scikit-learn's digits.  What must survive a failure
lives in one ``TorchState``: the model, the optimizer, the ``ElasticSampler``'s
position in the epoch, and the epoch.  Every ``--commit-every`` batches (and at
the end of each epoch) ``state.commit()`` has rank 0 write it to hvdrun's state
directory (``--elastic-state-dir``, default ``.hvdlite-elastic``).

To show the recovery, the last rank of the first launch exits in the middle of
the second epoch (``--fail-at-step``, counted from the start).  hvdrun stops the
other ranks, starts the job again, and every rank resumes from the last commit:
the sampler shares out only the rest of that epoch, and the reset callback sets
the learning rate for the number of ranks there are now.  Rank 0 says where each
launch starts and prints the test accuracy (averaged over ranks) at the end.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdlite.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by size")
    parser.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    parser.add_argument(
        "--fail-at-step",
        type=int,
        default=30,
        help="in the first launch, the last rank exits before this step (0: never)",
    )
    return parser.parse_args(argv)


def datasets(seed: int = 42):
    digits = load_digits()
    x = torch.tensor(digits.images.reshape(len(digits.images), 64) / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=seed, stratify=y
    )
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


def main(argv=None) -> float:
    args = parse_args(argv)
    torch.set_num_threads(1)
    hvd.init()
    torch.manual_seed(0)  # the same initial weights on every rank (a commit restores them too)
    launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))  # hvdrun counts launches

    train_set, test_set = datasets()
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0)

    def rescale_lr():  # runs after a relaunch: hvd.size() may have changed
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([rescale_lr])

    @hvd.elastic.run
    def train(state) -> None:
        if hvd.rank() == 0:
            print(
                f"launch {launch}: {hvd.size()} rank(s) start at epoch {state.epoch}, "
                f"{sampler.processed_num} of its {len(train_set)} samples done",
                flush=True,
            )
        steps = 0
        while state.epoch < args.epochs:
            for batch, (x, y) in enumerate(loader):
                if launch == 0 and hvd.rank() == hvd.size() - 1 and steps + 1 == args.fail_at_step:
                    print(
                        f"rank {hvd.rank()}: simulated failure before step {steps + 1}", flush=True
                    )
                    os._exit(1)
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                steps += 1
                sampler.record_batch(batch, args.batch_size)
                if (batch + 1) % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch} done", flush=True)

    train(state)

    # Each rank scores its shard of the test set; the average is the test accuracy.
    xs, ys = test_set.tensors
    with torch.no_grad():
        correct = model(xs[hvd.rank() :: hvd.size()]).argmax(1) == ys[hvd.rank() :: hvd.size()]
    counts = hvd.allgather_object((int(correct.sum()), len(correct)))
    accuracy = sum(c for c, _ in counts) / sum(n for _, n in counts)
    if hvd.rank() == 0:
        print(f"final test accuracy {100 * accuracy:.2f}% ({hvd.size()} ranks)", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
