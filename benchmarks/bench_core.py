"""Core engine benchmark: hvdlite beside raw mpi4py in the same run, as ratios.

Run as ``python benchmarks/bench_core.py`` (it starts its own 2-rank job with the
mpiexec beside this Python) or directly under ``mpiexec -n 2``.

Figures (each beside its baseline from the same run):
- allreduce of 4 KB, 256 KB, 4 MB, 64 MB: hvdlite time / raw ``Allreduce``;
- 200 arrays of 64 KB submitted async, then all synchronized: hvdlite time / raw
  copy-into-one-buffer + one ``Allreduce`` + copy-out (and, for information, the
  same arrays as one ``grouped_allreduce``);
- allreduce of 16 MB of float16 (reduced in float32 on one node), values near 1
  and values of 1e-5 (subnormal in float16, as many gradients are): hvdlite's
  casts / numpy's own float16 casts in the same call;
- CPU used by an idle initialized process over 5 s (% of one core).
Times are medians over repetitions, hvdlite's and the baseline's alternating, so
one descheduled iteration on a busy machine does not decide a figure and load
from elsewhere hits both alike.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

from _jobs import paired_times, run_self_or_launch, short_time  # this script's folder

import numpy as np


def run_ranks() -> None:
    import hvdlite as hvd
    from mpi4py import MPI

    hvd.init()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    rows = []

    for nbytes, iters, repeats in (
        (4 << 10, 200, 15),
        (256 << 10, 100, 11),
        (4 << 20, 20, 9),
        (64 << 20, 3, 5),
    ):
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)
        for _ in range(3):
            hvd.allreduce(x, name=f"a{nbytes}", op=hvd.Sum, output=out)
            comm.Allreduce(x, out, MPI.SUM)
        name = f"a{nbytes}"
        t_hvd, t_mpi = paired_times(
            lambda x=x, out=out, name=name: hvd.allreduce(x, name=name, op=hvd.Sum, output=out),
            lambda x=x, out=out: comm.Allreduce(x, out, MPI.SUM),
            iters,
            repeats,
            comm.Barrier,
        )
        rows.append((f"allreduce {_human(nbytes)}", t_hvd, "raw mpi4py Allreduce", t_mpi))

    arrays = [np.full(16 << 10, i, dtype=np.float32) for i in range(200)]  # 64 KB each
    outs = [np.empty_like(a) for a in arrays]
    fused = np.empty(sum(a.size for a in arrays), dtype=np.float32)

    submit_times = []

    def hvd_many():
        t0 = time.perf_counter()
        handles = [
            hvd.allreduce_async(a, name=f"t{i}", op=hvd.Sum, output=o)
            for i, (a, o) in enumerate(zip(arrays, outs))
        ]
        submit_times.append(time.perf_counter() - t0)
        for h in handles:
            h.result()

    def mpi_many():
        np.concatenate(arrays, out=fused)
        comm.Allreduce(MPI.IN_PLACE, fused, MPI.SUM)
        offset = 0
        for o in outs:
            n = o.size
            o[...] = fused[offset : offset + n]
            offset += n

    for _ in range(3):
        hvd_many()
        mpi_many()
    t_hvd, t_mpi = paired_times(hvd_many, mpi_many, 5, 15, comm.Barrier)
    rows.append(("200 x 64 KB async + sync", t_hvd, "copy-in + 1 Allreduce + copy-out", t_mpi))
    # The Python floor of that figure: creating 200 handles (validation, Future,
    # engine entry), before any negotiation or data movement.
    rows.append(
        (
            "  of which: 200 submissions",
            statistics.median(submit_times),
            "copy-in + 1 Allreduce + copy-out",
            t_mpi,
        )
    )
    # The same arrays as one grouped submission: one handle, the same data path.
    t_grouped, t_mpi = paired_times(
        lambda: hvd.grouped_allreduce(arrays, name="grouped", op=hvd.Sum, outputs=outs),
        mpi_many,
        5,
        15,
        comm.Barrier,
    )
    rows.append(
        ("200 x 64 KB grouped (info)", t_grouped, "copy-in + 1 Allreduce + copy-out", t_mpi)
    )

    rows += _float16_rows(hvd, comm)

    # Idle cost: an initialized process doing nothing for 5 s.
    comm.Barrier()
    hvd.allreduce(np.ones(1), name="wake")  # the engine was active just before going idle
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    time.sleep(5.0)
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - t0
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    idle = comm.gather(100.0 * cpu / wall, root=0)

    if rank == 0:
        print(
            f"\nhvdlite core benchmark: {comm.Get_size()} ranks, "
            f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}"
        )
        print(f"{'figure':28} {'hvdlite':>12} {'baseline':>12} {'ratio':>7}  baseline is")
        for label, t, base_label, tb in rows:
            print(
                f"{label:28} {short_time(t):>12} {short_time(tb):>12} {t / tb:>6.2f}x  {base_label}"
            )
        print(
            f"{'idle CPU over 5 s':28} {max(idle):>11.2f}% {'':>12} {'':>7}  "
            "(% of one core, worst rank; target <= 2 %)"
        )
        print(f"{'allreduce 4 KB absolute':28} {short_time(rows[0][1]):>12}   (target <= 100 us)")
    hvd.shutdown()


def _float16_rows(hvd, comm) -> list:
    """float16 allreduces with hvdlite's float16 casts, beside the same calls with
    numpy's own (``np.copyto``), alternating."""
    from hvdlite.util import half_casts

    def numpy_cast(src, out):
        np.copyto(out, src, casting="unsafe")

    rows = []
    rng = np.random.default_rng(comm.Get_rank())
    for scale in (1.0, 1e-5):
        x = (rng.standard_normal(8 << 20) * scale).astype(np.float16)
        out = np.empty_like(x)
        name = f"f16.{scale:g}"

        def ours(x=x, out=out, name=name):
            hvd.allreduce(x, name=name, op=hvd.Average, output=out)

        def numpys(x=x, out=out, name=name):
            kept = half_casts.register(numpy_cast, numpy_cast)
            try:
                hvd.allreduce(x, name=name, op=hvd.Average, output=out)
            finally:
                half_casts.register(*kept)

        for _ in range(2):
            ours()
            numpys()
        t_ours, t_numpy = paired_times(ours, numpys, 2, 7, comm.Barrier)
        label = f"float16 16 MB, values ~{scale:g}"
        rows.append((label, t_ours, "the same with numpy's float16 casts", t_numpy))
    return rows


def _human(nbytes: int) -> str:
    return f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"


def main() -> int:
    return run_self_or_launch(run_ranks, __file__)


if __name__ == "__main__":
    sys.exit(main())
