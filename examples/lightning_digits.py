"""Train examples/torch_digits.py's classifier with PyTorch Lightning on hvdlite.

    hvdrun -np 2 python examples/lightning_digits.py
    hvdrun -np 2 python examples/lightning_digits.py --compression fp16 --precision bf16-mixed
    hvdrun -np 2 python examples/lightning_digits.py --resume checkpoints/lightning_digits/last.ckpt

The same network, data split and hyperparameters as torch_digits.py, as a
``LightningModule`` trained by ``Trainer(strategy="hvdlite")``: Lightning gives
each rank its shard of the data (``DistributedSampler``), hvdlite averages the
gradients, ``self.log(..., sync_dist=True)`` averages the metrics over the ranks,
and rank 0 writes the checkpoints.  Needs ``pip install hvdlite[lightning]``.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdlite.lightning  # noqa: F401 - registers Trainer(strategy="hvdlite")
import hvdlite.torch as hvd
from hvdlite.lightning import HvdliteStrategy


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by size")
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    parser.add_argument("--precision", default="32-true", help="e.g. bf16-mixed (CPU)")
    parser.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    parser.add_argument(
        "--checkpoint-dir",
        default=os.path.join("checkpoints", "lightning_digits"),
        help="where rank 0 writes last.ckpt",
    )
    parser.add_argument("--resume", default=None, help="a checkpoint to resume from")
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


class Digits(L.LightningModule):
    def __init__(self, lr: float):
        super().__init__()
        self.save_hyperparameters()
        self.conv = nn.Conv2d(1, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        # sync_dist: the mean over every rank's shard of the test set, not rank 0's.
        self.log("test_loss", F.cross_entropy(out, y), sync_dist=True)
        self.log("test_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


class PrintEpochs(L.Callback):
    """One line per epoch on rank 0 (the progress bar redraws its line, which reads
    badly in a log)."""

    def on_train_epoch_end(self, trainer, module):
        # Every rank reads the metrics: computing a sync_dist value is a collective.
        m = {k: float(v) for k, v in trainer.callback_metrics.items()}
        if trainer.is_global_zero:
            print(
                f"epoch {trainer.current_epoch + 1:3d}  "
                f"train loss {m.get('train_loss', float('nan')):.4f}  "
                f"test loss {m.get('test_loss', float('nan')):.4f}  "
                f"test accuracy {m.get('test_acc', float('nan')):.2%}",
                flush=True,
            )


def main(argv=None) -> float:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per rank
    strategy = HvdliteStrategy(compression=getattr(hvd.Compression, args.compression))
    L.seed_everything(args.seed, verbose=False)
    train_set, test_set = datasets(args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=256)
    # Averaged gradients of size x the batch allow size x the step, as in torch_digits.py.
    model = Digits(lr=args.lr * hvd.size())
    trainer = L.Trainer(
        strategy=strategy,  # or strategy="hvdlite" without options
        accelerator="cpu",
        max_epochs=args.epochs,
        precision=args.precision,
        accumulate_grad_batches=args.accumulate,
        callbacks=[PrintEpochs(), ModelCheckpoint(dirpath=args.checkpoint_dir, save_last=True)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if trainer.is_global_zero:
        print(
            f"training on {trainer.world_size} rank(s): {len(train_set)} train / "
            f"{len(test_set)} test images, compression={args.compression}, "
            f"precision={args.precision}",
            flush=True,
        )
    start = time.perf_counter()
    trainer.fit(model, train_loader, test_loader, ckpt_path=args.resume)
    accuracy = float(trainer.callback_metrics["test_acc"])
    if trainer.is_global_zero:
        print(
            f"final test accuracy {accuracy:.2%} after {trainer.current_epoch} epochs in "
            f"{time.perf_counter() - start:.1f} s; checkpoint in {args.checkpoint_dir}",
            flush=True,
        )
    return accuracy


if __name__ == "__main__":
    main()
