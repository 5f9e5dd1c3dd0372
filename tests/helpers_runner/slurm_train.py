"""A stand-in for a training script in the SLURM tests (numpy + mpi4py only).

Fits y = 3x + 1 by gradient descent with each rank's gradient averaged over
all ranks (Allreduce), as data-parallel training does, and prints what the
test checks: the world each rank saw and a "training finished" line.
"""

import os

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
local = os.environ.get("MPI_LOCALRANKID", os.environ.get("SLURM_LOCALID", "?"))
print(f"rank {rank} of {size} (local rank {local}) on {MPI.Get_processor_name()}", flush=True)

rng = np.random.default_rng(rank)
x = rng.uniform(-1, 1, 256)
y = 3 * x + 1
w = np.zeros(2)
for _step in range(200):
    err = w[0] * x + w[1] - y
    grad = np.array([np.mean(err * x), np.mean(err)])
    comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
    w -= 0.5 * grad / size
weights = comm.gather(w, root=0)
if rank == 0:
    assert all(np.allclose(weights[0], other) for other in weights), "ranks disagree"
print(f"rank {rank} of {size}: training finished, w={w[0]:.3f} b={w[1]:.3f}", flush=True)
