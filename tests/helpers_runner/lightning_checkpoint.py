"""One job of tests/test_lightning_jobs.py: Trainer(strategy="hvdlite") fits a small
regression to ``epochs`` epochs, resuming from DIR/last.ckpt when it exists, and
rank 0's ModelCheckpoint writes DIR/last.ckpt.

    mpiexec -n 2 python lightning_checkpoint.py DIR 1     # epoch 1 at 2 ranks
    mpiexec -n 3 python lightning_checkpoint.py DIR 2     # resumes: epoch 2 at 3 ranks

Each rank writes DIR/report.<rank>.pt: the weights it resumed from and ended
with, the steps it found, and how many checkpoint files it wrote itself.
"""

import os
import sys
import warnings

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins import TorchCheckpointIO
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import hvdlite.lightning  # noqa: F401 - registers strategy="hvdlite"
import hvdlite.torch as hvd

ROWS, B = 48, 4
warnings.filterwarnings("ignore", message=".*does not have many workers.*")


def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g))


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
        self.report = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def on_train_start(self):
        self.report["start_weights"] = {k: v.clone() for k, v in self.state_dict().items()}
        self.report["start_step"] = self.trainer.global_step
        self.report["start_epoch"] = self.trainer.current_epoch
        opt = self.trainer.optimizers[0]
        self.report["start_momentum"] = [
            opt.state[p]["momentum_buffer"].clone() for p in self.parameters() if p in opt.state
        ]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class CountingIO(TorchCheckpointIO):
    """Lightning's own checkpoint writer, counting the files this rank writes."""

    written = 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        CountingIO.written += 1
        super().save_checkpoint(checkpoint, path, storage_options)


def main(directory: str, epochs: int) -> None:
    torch.set_num_threads(1)
    last = os.path.join(directory, "last.ckpt")
    resume = last if os.path.exists(last) else None
    model = Regression()
    trainer = L.Trainer(
        strategy="hvdlite",
        accelerator="cpu",
        max_epochs=epochs,
        plugins=[CountingIO()],
        callbacks=[ModelCheckpoint(dirpath=directory, save_last=True, save_top_k=0)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(dataset(), batch_size=B), ckpt_path=resume)
    report = dict(model.report, end_weights=model.state_dict(), written=CountingIO.written)
    torch.save(report, os.path.join(directory, f"report.{hvd.rank()}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
