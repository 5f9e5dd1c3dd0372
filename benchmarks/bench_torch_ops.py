"""The torch adapter's per-tensor cost: torch ops beside raw mpi4py, same run, as ratios.

Run as ``python benchmarks/bench_torch_ops.py`` (it starts its own 2-rank job
with the mpiexec beside this Python) or directly under ``mpiexec -n 2``.

Figures (each beside its baseline from the same run):

- 200 torch tensors of 64 KB, ``hvdlite.torch.allreduce_async_`` each, then
  ``synchronize`` each, as a user calling the ops would: against raw mpi4py
  copy of every tensor into one buffer + one ``Allreduce`` + copy back out
  (target <= 1.10x);
- a synchronous 4 KB torch ``allreduce`` (target <= 40 us absolute), beside a
  raw 4 KB ``Allreduce``, and beside its floor in this design: the same call's
  Python path measured alone (a job of one rank, started first) plus the raw
  MPI cost of the two collectives each call makes (the status exchange, a
  non-blocking AND of a few words, then the data);
- for information, the same 200 tensors as one ``grouped_allreduce_`` (one
  handle: what a gradient bucket costs).

Times are medians over repetitions, hvdlite's and the baseline's alternating,
so load from elsewhere on the machine hits both alike.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from _jobs import ROOT, paired_times, run_self_or_launch, short_time  # this script's folder

#: How the launcher hands the 1-rank measurement to the 2-rank job.
_PYTHON_PATH_ENV = "HVDLITE_BENCH_PYTHON_PATH"

TENSORS = 200
ELEMENTS = 16 << 10  # 64 KB of float32


def run_ranks() -> None:
    import numpy as np
    import torch
    from mpi4py import MPI

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    comm = MPI.COMM_WORLD
    rows = []

    tensors = [torch.zeros(ELEMENTS) for _ in range(TENSORS)]  # sums stay finite
    names = [f"grad.{i}" for i in range(TENSORS)]
    fused = torch.empty(TENSORS * ELEMENTS)
    fused_np = fused.numpy()
    views = list(fused.split(ELEMENTS))

    def hvd_many():
        handles = [hvd.allreduce_async_(t, name=n, op=hvd.Sum) for t, n in zip(tensors, names)]
        for h in handles:
            hvd.synchronize(h)

    def mpi_many():
        torch.cat(tensors, out=fused)
        comm.Allreduce(MPI.IN_PLACE, fused_np, MPI.SUM)
        for t, v in zip(tensors, views):
            t.copy_(v)

    def hvd_grouped():
        hvd.synchronize(hvd.grouped_allreduce_async_(tensors, name="bucket", op=hvd.Sum))

    for _ in range(3):
        hvd_many()
        mpi_many()
        hvd_grouped()
    raw = "copy-in + 1 Allreduce + copy-out"
    t_hvd, t_mpi = paired_times(hvd_many, mpi_many, 5, 21, comm.Barrier)
    rows.append((f"{TENSORS} x 64 KB async_ + synchronize", t_hvd, raw, t_mpi, "<= 1.10x"))
    t_grp, t_mpi2 = paired_times(hvd_grouped, mpi_many, 5, 15, comm.Barrier)
    rows.append((f"{TENSORS} x 64 KB grouped_ (info)", t_grp, raw, t_mpi2, ""))

    small = torch.ones(1024)
    small_np = small.numpy()
    small_out = small_np.copy()
    for _ in range(20):
        hvd.allreduce(small, name="small", op=hvd.Sum)
    t_small, t_raw = paired_times(
        lambda: hvd.allreduce(small, name="small", op=hvd.Sum),
        lambda: comm.Allreduce(small_np, small_out, MPI.SUM),
        200,
        15,
        comm.Barrier,
    )
    rows.append(("sync allreduce 4 KB", t_small, "raw Allreduce 4 KB", t_raw, "<= 40 us"))
    # The floor of a synchronous call in this design: its Python path (measured alone,
    # in a job of one rank, by main()) plus what its two collectives cost in raw MPI
    # (the status exchange, a non-blocking AND of a few words, then the data).
    status = np.zeros(4, dtype=np.uint64)
    control = comm.Dup()

    def raw_two_collectives():
        req = control.Iallreduce(MPI.IN_PLACE, status, MPI.BAND)
        while not req.Test():
            pass
        comm.Allreduce(small_np, small_out, MPI.SUM)

    python_path = float(os.environ.get(_PYTHON_PATH_ENV, "nan"))
    t_small2, t_mpi_floor = paired_times(
        lambda: hvd.allreduce(small, name="small", op=hvd.Sum),
        raw_two_collectives,
        200,
        15,
        comm.Barrier,
    )
    rows.append(
        (
            "sync allreduce 4 KB vs its floor",
            t_small2,
            f"Python path {short_time(python_path)} (1 rank) + raw status and data "
            f"collectives {short_time(t_mpi_floor)}",
            python_path + t_mpi_floor,
            "",
        )
    )
    control.Free()

    if comm.Get_rank() == 0:
        print(f"\nhvdlite torch ops benchmark: {comm.Get_size()} ranks, torch {torch.__version__}")
        print(f"{'figure':36} {'hvdlite':>10} {'baseline':>10} {'ratio':>7}  target   baseline is")
        for label, t, base_label, tb, target in rows:
            print(
                f"{label:36} {short_time(t):>10} {short_time(tb):>10} {t / tb:>6.2f}x  "
                f"{target:8} {base_label}"
            )
    hvd.shutdown()


def python_path_alone() -> None:
    """A job of one rank: the synchronous 4 KB call with no peer to wait for, i.e. the
    whole Python path of submit, cycle, collective and completion; printed for main()."""
    import torch

    import hvdlite.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    small = torch.ones(1024)
    for _ in range(200):
        hvd.allreduce(small, name="small", op=hvd.Sum)
    t, _ = paired_times(
        lambda: hvd.allreduce(small, name="small", op=hvd.Sum), lambda: None, 200, 15, lambda: None
    )
    print(f"PYTHON_PATH {t!r}", flush=True)
    hvd.shutdown()


def main() -> int:
    if os.environ.get(_PYTHON_PATH_ENV) == "measure":
        python_path_alone()
        return 0
    if any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")):
        run_ranks()
        return 0
    alone = subprocess.run(
        [sys.executable, __file__],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, **{_PYTHON_PATH_ENV: "measure"}, PYTHONPATH=str(ROOT)),
    )
    found = re.search(r"PYTHON_PATH (\S+)", alone.stdout)
    if alone.returncode != 0 or not found:
        print(alone.stdout + alone.stderr, file=sys.stderr)
        return alone.returncode or 1
    os.environ[_PYTHON_PATH_ENV] = found.group(1)
    return run_self_or_launch(run_ranks, __file__)


if __name__ == "__main__":
    sys.exit(main())
