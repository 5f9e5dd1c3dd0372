"""A rank program for the multi-host tests (numpy + mpi4py only).

Usage: host_rank.py [sleep] [--floats N]
  (default)  print "rank R of N on HOST local L/S", allreduce N float32 ones
             (default 1 << 20, 4 MB) and print "rank R sum ok" when every
             element equals the world size
  sleep      print "rank R of N on HOST ready", then sleep until stopped

HOST is this process's host name; L/S its rank and size on the node as MPI
sees it (``MPI_Comm_split_type`` shared), so a test can tell that MPI put the
ranks on different machines.
"""

import argparse
import socket
import sys
import time

import numpy as np
from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("mode", nargs="?", default="allreduce", choices=["allreduce", "sleep"])
parser.add_argument("--floats", type=int, default=1 << 20)
args = parser.parse_args()

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
node = comm.Split_type(MPI.COMM_TYPE_SHARED)
where = f"rank {rank} of {size} on {socket.gethostname()} local {node.Get_rank()}/{node.Get_size()}"
if args.mode == "sleep":
    print(f"{where} ready", flush=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait without spinning in MPI
        time.sleep(0.2)
    sys.exit(5)
print(where, flush=True)
data = np.ones(args.floats, dtype=np.float32)
comm.Allreduce(MPI.IN_PLACE, data)
ok = bool(np.all(data == size))
print(f"rank {rank} sum {'ok' if ok else 'WRONG'}", flush=True)
sys.exit(0 if ok else 1)
