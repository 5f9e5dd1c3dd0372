"""hvdlite in a program that manages MPI itself.

Usage: ``mpiexec -n N python core_mpi_init.py MODE``.  MODE ``uninitialized``:
the program tells mpi4py not to initialize MPI and never does so itself, so
``hvd.init()`` must (and finalize it at exit).  MODE ``caller``: the program
initializes MPI itself and hands its communicator to ``hvd.init(comm=...)``,
which must use it as it is.  Each rank prints ``rank R: OK ...`` and the job
exits 0; tests/test_core_launch.py checks both.
"""

import sys

import mpi4py

mpi4py.rc.initialize = False
mpi4py.rc.finalize = False

from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

import hvdlite as hvd  # noqa: E402

mode = sys.argv[1]
if mode == "uninitialized":
    assert not MPI.Is_initialized()
    hvd.init()
elif mode == "caller":
    MPI.Init_thread(MPI.THREAD_MULTIPLE)
    hvd.init(comm=MPI.COMM_WORLD)
else:
    raise SystemExit(f"unknown mode {mode!r}")
total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="managed")[0]
print(
    f"rank {hvd.rank()}: OK {mode} sum={total:.0f} "
    f"threads={MPI.Query_thread() == MPI.THREAD_MULTIPLE}",
    flush=True,
)
hvd.shutdown()
if mode == "caller":
    MPI.Finalize()  # the program's own MPI: the program finalizes it
