"""What ``HVDLITE_CHECK_ORDER=1`` costs: the collective-order check on against off, same job.

Run as ``python benchmarks/bench_check_order.py`` (it starts its own 2-rank
job) or under ``mpiexec -n 2``.  With the check on, every collective goes to
the coordinator (rank 0) instead of being answered by the response cache, and
rank 0 numbers each rank's requests.  One job switches the check on and off on
every rank between repetitions (after a barrier, with nothing in flight), so
load from elsewhere hits both alike.

Figures, each as a time per step with the check on beside it off:
- a synchronous 4 KB allreduce (a metric each step);
- 40 named 16 KB allreduces submitted asynchronously, then synchronized (a
  bucketed backward pass);
- one grouped allreduce of the same 40 arrays.
The check is a debugging aid, off by default; the ratio says what turning it on
for a run costs.
"""

from __future__ import annotations

import sys

from _jobs import paired_times, run_self_or_launch, short_time  # this script's folder

ARRAYS = 40


def run_ranks() -> None:
    import numpy as np
    from mpi4py import MPI

    import hvdlite as hvd
    from hvdlite import basics
    from hvdlite.engine.order_check import OrderCheck

    hvd.init()
    comm = MPI.COMM_WORLD
    engine = basics.state().engine

    def checking(on: bool) -> None:
        engine.flight.check_order = on
        if engine.coordinator is not None:
            engine.coordinator.order = OrderCheck(engine.sets.members.get) if on else None

    def mode(fn, on: bool):
        def run():
            checking(on)
            fn()

        return run

    small = np.ones(1024, np.float32)
    arrays = [np.ones(4096, np.float32) for _ in range(ARRAYS)]

    def metric():
        hvd.allreduce(small, name="metric", op=hvd.Average)

    def bucketed():
        handles = [hvd.allreduce_async(a, name=f"grad.{i}", output=a) for i, a in enumerate(arrays)]
        for handle in handles:
            hvd.synchronize(handle)

    def grouped():
        hvd.grouped_allreduce(arrays, name="grads", outputs=arrays)

    rows = []
    for label, step, iters in (
        ("sync allreduce 4 KB", metric, 200),
        (f"{ARRAYS} x 16 KB async + sync", bucketed, 20),
        (f"{ARRAYS} x 16 KB grouped", grouped, 50),
    ):
        for on in (False, True):
            for _ in range(5):
                mode(step, on)()
        t_on, t_off = paired_times(mode(step, True), mode(step, False), iters, 15, comm.Barrier)
        rows.append((label, t_on, t_off))
    checking(False)
    if comm.Get_rank() == 0:
        print(f"\ncollective-order check (HVDLITE_CHECK_ORDER): {comm.Get_size()} ranks")
        print(f"{'per step':28} {'check on':>10} {'off':>10} {'ratio':>7}")
        for label, t_on, t_off in rows:
            print(
                f"{label:28} {short_time(t_on):>10} {short_time(t_off):>10} {t_on / t_off:>6.2f}x"
            )
    hvd.shutdown()


if __name__ == "__main__":
    sys.exit(run_self_or_launch(run_ranks, __file__))
