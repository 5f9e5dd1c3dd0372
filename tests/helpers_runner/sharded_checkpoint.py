"""One job of the sharded-checkpoint round trip (tests/test_torch_sharded_jobs.py).

``python sharded_checkpoint.py DIR START STEPS``: every rank builds the model,
loads DIR/ckpt.pt when it exists (weights and a consolidated optimizer state, saved
at any number of ranks), trains STEPS steps from step START on its share of each
global batch with ``shard_optimizer_state=True`` (AdamW, a frozen parameter),
then rank 0 saves the weights and the consolidated state back to DIR/ckpt.pt.
"""

import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

import hvdlite.torch as hvd

ROWS = 12  # global batch rows: divisible by 1, 2 and 3 ranks


def make_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 13), nn.Tanh(), nn.Linear(13, 7), nn.Linear(7, 3))
    model[2].bias.requires_grad_(False)  # a frozen parameter
    return model


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g)


def main(folder, start, steps, sharded=True):
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    if sharded:
        opt = hvd.DistributedOptimizer(opt, shard_optimizer_state=True)
    path = os.path.join(folder, "ckpt.pt")
    if os.path.exists(path):
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    share = ROWS // size
    for step in range(start, start + steps):
        opt.zero_grad()
        x, y = batch(step)
        if sharded:
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
        F.mse_loss(model(x), y).backward()
        opt.step()
    if sharded:
        opt.consolidate_state_dict(to=0)
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    hvd.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sharded=sys.argv[4:] != ["plain"])
