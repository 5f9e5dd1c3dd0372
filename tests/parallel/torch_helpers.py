"""Shared set-up of the torch optimizer tests (imported by test_torch_optimizer.py and
test_torch_compression.py): hvdlite.torch initialized with a two-rank process set,
a tiny model, and a global batch of which every rank trains on its own rows."""

import torch
from mpi4py import MPI
from torch import nn

import hvdlite.torch as hvd

torch.set_num_threads(1)
_WORLD = MPI.COMM_WORLD.Get_size()
PAIR = hvd.ProcessSet([0, 1]) if _WORLD > 2 else hvd.global_process_set  # ranks 0 and 1


def init():
    """hvdlite.init() as every module of these tests starts it."""
    hvd.init(process_sets=[PAIR] if _WORLD > 2 else None)


init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def batch(step, ranks=N):
    """The global batch of *step*: B rows for each of *ranks* ranks (same on every rank)."""
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(ranks * B, 5, generator=g), torch.randn(ranks * B, 3, generator=g)


def mine(t, rank=R):
    """*rank*'s rows of a global batch."""
    return t[rank * B : (rank + 1) * B]
