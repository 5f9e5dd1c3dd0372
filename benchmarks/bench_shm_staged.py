"""The staged shared-memory allreduce against the same engine with staging off, same job.

Run as ``python benchmarks/bench_shm_staged.py`` (it starts its own 2-rank job
with the mpiexec beside this Python) or directly under ``mpiexec -n 2``.

A loop's cached batch is *staged* (``hvdlite/engine/transports/shm.py``): each rank copies its
part in before the engine's status exchange, which then stands in for the
first barrier.  The baseline is the same process with the engine's staging
step declining (``Execution.stage`` returning False), so both modes run the same
code but for that step; their repetitions alternate.  Workloads: one grouped
in-place allreduce of 20 float32 arrays per step, at three sizes (128 KB, the
1.6 MB of the transformer in ``bench_torch_models``, 8 MB), back to back, and
the 1.6 MB one after 2 ms of numpy work per step (so ranks arrive apart, as
in training).  Figures are median seconds per step; ratio = staged / off.
"""

from __future__ import annotations

import os
import sys

from _jobs import paired_times, run_self_or_launch, short_time  # this script's folder

ARRAYS = 20
# One BLAS thread per rank: the 2 ms of work is a rank's own, as a training step's is.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run_ranks() -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd
    from hvdlite import basics

    hvd.init()
    comm = MPI.COMM_WORLD
    engine = basics.state().engine
    execution = engine._execution
    staged_step = execution.stage
    rows = []
    work = np.random.default_rng(0).standard_normal((160, 160))

    def compute():
        a = work
        for _ in range(8):
            a = np.tanh(a @ work * 0.01)

    def mode(fn, staged: bool):
        def run():
            execution.stage = staged_step if staged else (lambda: False)
            fn()

        return run

    for label, kb, busy in (
        ("128 KB", 128, False),
        ("1.6 MB", 1600, False),
        ("8 MB", 8000, False),
        ("1.6 MB + 2 ms compute", 1600, True),
    ):
        arrays = [np.ones(kb * 256 // ARRAYS, np.float32) for _ in range(ARRAYS)]
        name = f"staged.{kb}.{busy}"

        def step(arrays=arrays, name=name, busy=busy):
            if busy:
                compute()
            hvd.grouped_allreduce(arrays, name=name, op=hvd.Average, outputs=arrays)

        for _ in range(5):
            step()
        t_on, t_off = paired_times(mode(step, True), mode(step, False), 20, 21, comm.Barrier)
        rows.append((label, t_on, t_off))
    execution.stage = staged_step
    runs = engine.executor._shm[0].staged_runs

    if comm.Get_rank() == 0:
        print(
            f"\nstaged shared-memory allreduce: {comm.Get_size()} ranks, "
            f"{ARRAYS} float32 arrays per step, {runs} staged runs on rank 0"
        )
        print(f"{'grouped allreduce per step':28} {'staged':>10} {'off':>10} {'ratio':>7}")
        for label, t_on, t_off in rows:
            print(
                f"{label:28} {short_time(t_on):>10} {short_time(t_off):>10} {t_on / t_off:>6.3f}x"
            )
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(run_self_or_launch(run_ranks, __file__))
