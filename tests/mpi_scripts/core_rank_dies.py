"""A job in which one rank dies while the others wait for it in a collective.

Usage: ``mpiexec -n N python core_rank_dies.py MODE`` where MODE is
``sigkill`` (the last rank kills itself with SIGKILL), ``raise`` (an uncaught
exception on the last rank) or ``exit`` (the last rank returns early, cleanly:
shutdown at exit stops the engine everywhere).  Every other rank waits in an
allreduce the dying rank never submits.  tests/test_core_launch.py checks that
the job ends within seconds with a non-zero exit code instead of hanging.
"""

import os
import signal
import sys
import time

import numpy as np

import hvdlite as hvd

mode = sys.argv[1]
hvd.init()
rank, size = hvd.rank(), hvd.size()
assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="warmup")[0] == size
print(f"rank {rank}: warmed up", flush=True)

if rank == size - 1:
    time.sleep(0.3)  # the others are now waiting in the allreduce below
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "raise":
        raise RuntimeError(f"deliberate failure on rank {rank}")
    elif mode == "exit":
        print(f"rank {rank}: leaving early", flush=True)
        sys.exit(0)
    raise SystemExit(f"unknown mode {mode!r}")

try:
    hvd.allreduce(np.ones(2), name="never.completes")
except hvd.HorovodInternalError as exc:
    print(f"rank {rank}: HorovodInternalError: {exc}", flush=True)
    sys.exit(3)
print(f"rank {rank}: the allreduce completed without the dead rank", flush=True)
sys.exit(4)
