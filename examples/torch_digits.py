"""Train a digit classifier with hvdlite.torch on scikit-learn's bundled digits.

    hvdrun -np 2 python examples/torch_digits.py            # or: make demo
    hvdrun -np 2 python examples/torch_digits.py --compression fp16 --epochs 20
    hvdrun -np 2 python examples/torch_digits.py --compression topk --topk-ratio 0.01
    hvdrun -np 2 python examples/torch_digits.py --compression powersgd --powersgd-rank 4
    hvdrun -np 2 python examples/torch_digits.py --op adasum

A Horovod script with one changed import: every rank trains on its shard of
the training set (``DistributedSampler``), gradients are averaged by
``hvd.DistributedOptimizer``, rank 0 prints progress and the test accuracy
(averaged over ranks) and writes the checkpoint.  The 1797 8x8 images ship
with scikit-learn, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hvdlite.torch as hvd


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by size")
    parser.add_argument(
        "--compression",
        choices=["none", "fp16", "bf16", "topk", "powersgd"],
        default="none",
        help="gradient compression on the wire",
    )
    parser.add_argument(
        "--topk-ratio",
        type=float,
        default=0.01,
        help="topk: fraction of each gradient sent per step",
    )
    parser.add_argument("--powersgd-rank", type=int, default=4, help="powersgd: factor rank")
    parser.add_argument(
        "--powersgd-start-step",
        type=int,
        default=50,
        help="powersgd: uncompressed steps before compression starts",
    )
    parser.add_argument(
        "--op",
        choices=["average", "adasum"],
        default="average",
        help="average gradients, or combine local steps with Adasum (2, 4, 8... ranks)",
    )
    parser.add_argument(
        "--checkpoint",
        default=os.path.join("checkpoints", "torch_digits.pt"),
        help="where rank 0 writes the final checkpoint ('' to skip)",
    )
    parser.add_argument("--seed", type=int, default=42)
    return parser.parse_args(argv)


def datasets(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # N x 1 x 8 x 8
    y = torch.tensor(digits.target, dtype=torch.int64)
    train_idx, test_idx = train_test_split(
        range(len(y)), test_size=0.2, random_state=seed, stratify=digits.target
    )
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[test_idx], y[test_idx])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def make_compression(args):
    if args.compression == "topk":
        return hvd.Compression.topk(args.topk_ratio)
    if args.compression == "powersgd":
        return hvd.Compression.powersgd(
            rank=args.powersgd_rank, start_step=args.powersgd_start_step
        )
    return getattr(hvd.Compression, args.compression)


def metric_average(value: float, name: str) -> float:
    return hvd.allreduce(torch.tensor(value), name=name).item()


def evaluate(model, loader) -> tuple[float, float]:
    """Loss and accuracy over every rank's shard of the test set."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)  # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            totals += torch.tensor(
                [
                    F.cross_entropy(out, y, reduction="sum").item(),
                    (out.argmax(1) == y).sum().item(),
                    len(y),
                ],
                dtype=torch.float64,
            )
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval_totals")
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main(argv=None) -> float:
    args = parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)  # one core per rank
    torch.manual_seed(args.seed)

    train_set, test_set = datasets(args.seed)
    train_sampler = DistributedSampler(
        train_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True, seed=args.seed
    )
    test_sampler = DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False
    )
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()
    # Averaged gradients of size x the batch allow size x the step; Adasum's
    # combination already grows with how much the ranks' steps disagree.
    lr = args.lr if args.op == "adasum" else args.lr * hvd.size()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    # Start every rank from rank 0's weights and optimizer state.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    op = hvd.Adasum if args.op == "adasum" else hvd.Average
    optimizer = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=make_compression(args),
        op=op,
    )
    if hvd.rank() == 0:
        print(
            f"training on {hvd.size()} rank(s): {len(train_set)} train / {len(test_set)} "
            f"test images, compression={args.compression}, op={args.op}",
            flush=True,
        )

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)
        loss_sum, batches = 0.0, 0
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum, batches = loss_sum + loss.item(), batches + 1
        train_loss = metric_average(loss_sum / max(batches, 1), "train_loss")
        test_loss, accuracy = evaluate(model, test_loader)
        if hvd.rank() == 0:
            print(
                f"epoch {epoch:3d}  train loss {train_loss:.4f}  test loss {test_loss:.4f}  "
                f"test accuracy {accuracy:.2%}",
                flush=True,
            )
    if hvd.rank() == 0:
        print(
            f"final test accuracy {accuracy:.2%} after {args.epochs} epochs in "
            f"{time.perf_counter() - start:.1f} s; {optimizer.bytes_sent_last_step} bytes "
            f"sent per step by each rank",
            flush=True,
        )
        if args.checkpoint:
            os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
            torch.save(
                {
                    "epoch": args.epochs,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "accuracy": accuracy,
                },
                args.checkpoint,
            )
            print(f"checkpoint written to {args.checkpoint}", flush=True)
    return accuracy


if __name__ == "__main__":
    main()
