"""The training job that tools/soak.py runs under hvdrun: digits, for a set time.

    hvdrun -np 4 python tools/soak_train.py --seconds 1800

Every rank trains a small convolutional net on its shard of scikit-learn's bundled
digits with ``hvd.DistributedOptimizer`` (its gradients, about 140 KB, go through
the shared-memory allreduce when the ranks share a node), epoch after epoch until
rank 0's clock says ``--seconds`` have passed; rank 0 broadcasts that decision,
so every rank stops after the same epoch.  Each epoch also sends the other kinds
of traffic a training job sends, so that a leak in any of their paths shows up in
the soak's samples:

- allgather: every rank's per-batch losses (a different row count on each rank)
  and its test-set logits (rows of 10 floats, large enough for the shared-memory
  allgather); a grouped allgather of both;
- broadcast: the stop flag, and rank 0's parameters every few epochs;
- allreduce: the metrics, named and unnamed (automatic names count up for ever),
  an async one waited on through its handle, a grouped one, and one in a process
  set of the even ranks (its own shared-memory window) when there are four ranks
  or more;
- reducescatter and alltoall of a few rows per rank.

Rank 0 prints a line every ``--report`` seconds and a last line,
``soak-train: done ...``, that the soak looks for.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvdlite.torch as hvd

DONE = "soak-train: done"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1800.0, help="how long to train")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--report", type=float, default=60.0, help="seconds between progress lines")
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def datasets(seed: int):
    """Train and test sets: the 1797 digits split 80/20 by a seeded permutation."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def loaders(seed: int, batch_size: int):
    train_set, test_set = datasets(seed)
    train_sampler = DistributedSampler(
        train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=seed
    )
    test_sampler = DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    return (
        DataLoader(train_set, batch_size=batch_size, sampler=train_sampler),
        DataLoader(test_set, batch_size=1024, sampler=test_sampler),
        train_sampler,
    )


def train_epoch(model, optimizer, loader) -> torch.Tensor:
    """One pass over this rank's shard; the loss of each batch."""
    model.train()
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def evaluate(model, loader) -> tuple[float, torch.Tensor]:
    """Test accuracy over every rank's shard, and this rank's logits."""
    model.eval()
    correct, count, logits = 0.0, 0.0, []
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            correct += (out.argmax(1) == y).sum().item()
            count += len(y)
            logits.append(out)
    totals = hvd.allreduce(torch.tensor([correct, count]), op=hvd.Sum, name="soak.eval")
    return (totals[0] / totals[1]).item(), torch.cat(logits)


def side_traffic(epoch: int, losses, logits, even_set) -> float:
    """The epoch's collectives besides the gradients' (see the module docstring);
    returns the mean loss over every rank's batches."""
    rank, size = hvd.rank(), hvd.size()
    # A different row count on each rank: the allgather negotiates the sizes.
    mine = losses[: max(1, len(losses) - rank)]
    gathered = hvd.allgather(mine, name="soak.losses")
    hvd.allgather(logits, name="soak.logits")
    hvd.grouped_allgather([mine.unsqueeze(1), logits[:, :1]], name="soak.grouped")
    hvd.allreduce(torch.tensor([float(epoch)]))  # unnamed: a new automatic name each time
    handle = hvd.allreduce_async(logits.sum(0), name="soak.async")
    hvd.grouped_allreduce([logits.mean(0), gathered.mean().reshape(1)], name="soak.grouped")
    hvd.synchronize(handle)
    rows = torch.full((2 * size, 3), float(rank))
    hvd.reducescatter(rows, name="soak.rs")
    hvd.alltoall(rows, name="soak.a2a")
    if even_set is not None and even_set.included():
        hvd.allreduce(torch.ones(64 << 10), name="soak.even", process_set=even_set)
    return gathered.mean().item()


def stop_now(deadline: float) -> bool:
    """Rank 0's clock decides; every rank gets its answer."""
    flag = torch.tensor([1 if hvd.rank() == 0 and time.monotonic() >= deadline else 0])
    return bool(hvd.broadcast(flag, root_rank=0, name="soak.stop").item())


def main(argv=None) -> None:
    args = parse_args(argv)
    hvd.init(process_sets="dynamic")
    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(args.seed)
    even_set = None
    if hvd.size() >= 4:  # two ranks or more, and not every rank
        even_set = hvd.add_process_set(list(range(0, hvd.size(), 2)))
    train_loader, test_loader, sampler = loaders(args.seed, args.batch_size)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    start = time.monotonic()
    deadline = start + args.seconds
    epoch = steps = 0
    accuracy = loss = 0.0
    next_report = start + args.report
    while not stop_now(deadline):
        epoch += 1
        sampler.set_epoch(epoch)
        losses = train_epoch(model, optimizer, train_loader)
        steps += len(losses)
        accuracy, logits = evaluate(model, test_loader)
        loss = side_traffic(epoch, losses, logits, even_set)
        if epoch % 5 == 0:
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if hvd.rank() == 0 and time.monotonic() >= next_report:
            next_report += args.report
            print(
                f"soak-train: epoch {epoch}  {time.monotonic() - start:.0f} s  "
                f"loss {loss:.4f}  test accuracy {accuracy:.2%}",
                flush=True,
            )
    if hvd.rank() == 0:
        print(
            f"{DONE}: {epoch} epochs, {steps} steps per rank in "
            f"{time.monotonic() - start:.0f} s on {hvd.size()} ranks; loss {loss:.4f}, "
            f"test accuracy {accuracy:.2%}",
            flush=True,
        )
    hvd.shutdown()


if __name__ == "__main__":
    main()
