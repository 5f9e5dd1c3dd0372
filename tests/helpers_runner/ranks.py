"""A rank program for the launcher tests (mpi4py only; no hvdlite engine).

Usage: ranks.py MODE [ARG]
  ok            print "rank R of N" and a sum over all ranks, exit 0
  exit CODE     rank 1 prints a line and exits at once with CODE (os._exit: MPI_Finalize
                would wait for the other ranks); the others wait
  raise         rank 1 raises an exception (run it under python -m mpi4py: MPI_Abort)
  kill          rank 1 kills itself with SIGKILL; the others wait
  sleep         print "ready", then sleep until stopped
  env NAME...   print NAME=value for each variable, then exit 0
"""

import os
import signal
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"

if mode == "env":
    for name in sys.argv[2:]:
        print(f"{name}={os.environ.get(name, '<unset>')}")
    sys.exit(0)

from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

if mode == "ok":
    total = comm.allreduce(rank)
    print(f"rank {rank} of {size} sum {total}")
    sys.exit(0)
if mode == "exit":
    if rank == 1:
        print(f"rank {rank} is about to fail", flush=True)
        os._exit(int(sys.argv[2]))
elif mode == "raise":
    if rank == 1:
        print(f"rank {rank} is about to raise", flush=True)
        raise RuntimeError("boom on rank 1")
elif mode == "kill":
    if rank == 1:
        print(f"rank {rank} is about to be killed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
elif mode == "sleep":
    print(f"rank {rank} ready", flush=True)
else:
    sys.exit(f"unknown mode {mode!r}")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # wait without spinning in MPI
    time.sleep(0.2)
sys.exit(5)
