"""Pieces the training benchmarks share: starting their jobs, timing steps, the floor.

A benchmark script is both the launcher and the worker: run plainly, it starts
one job per mode with :func:`run_job` (2 ranks, the mpiexec beside this
Python, the same environment for every mode); each rank of a job runs the
script again with ``--worker ...`` and rank 0 prints its figures with
:func:`report`.  Not a benchmark itself (``run_all.py`` runs ``bench_*.py``).

Worker side:

- :func:`median_step`: median seconds per step over blocks of steps;
- :func:`torch_floor` / :func:`tf_floor`: what any 2-rank allreduce from
  Python must at least do each step on this machine: a barrier (the ranks run
  in lockstep, so each step waits for the slower one) and one copy plus one
  add over every gradient (each rank must publish its gradients and fold the
  peer's into its own).  The ``floor`` modes run it in place of communication.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["RANKS", "ROOT", "JobFailed", "free_ports", "job_env", "median_step", "mpiexec",
           "paired_ratio_line", "rank_and_size", "report", "run_job", "tf_floor",
           "torch_floor"]

ROOT = Path(__file__).resolve().parent.parent
RANKS = 2
_RESULT = "RESULT "


class JobFailed(RuntimeError):
    """A benchmark job exited without its results; the message holds its output."""


# ------------------------------------------------------------------ launcher side


def mpiexec() -> str:
    """The mpiexec of this Python's environment, else the one on PATH."""
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


def free_ports(n: int = 1) -> list[int]:
    """``n`` distinct TCP ports free on localhost right now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def job_env() -> dict[str, str]:
    """The environment every mode's job runs in.

    hvdlite importable from this checkout, one OpenMP thread per rank, and
    glibc's malloc tuned as ``hvdlite.init()`` tunes it (the ``MALLOC_*``
    variables), so no mode pays page faults the others do not.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 << 20))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
    return env


def run_job(script: str | Path, worker_args: Sequence[str], *, ranks: int = RANKS,
            timeout: float = 600) -> list[dict]:
    """Run ``script --worker ...`` on ``ranks`` ranks; the records rank 0 reported.

    Raises :class:`JobFailed` (with the tail of the job's output) when the job
    exits non-zero, times out or reports nothing.
    """
    worker_args = [str(a) for a in worker_args]
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(Path(script).resolve()),
           "--worker", *worker_args]
    try:
        out = subprocess.run(cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True,
                             timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise JobFailed(f"{' '.join(worker_args)}: timed out after {timeout:.0f}s\n"
                        f"{_text(e.stdout)[-3000:]}\n{_text(e.stderr)[-3000:]}") from None
    records = [json.loads(line[len(_RESULT):]) for line in out.stdout.splitlines()
               if line.startswith(_RESULT)]
    if out.returncode or not records:
        raise JobFailed(f"{' '.join(worker_args)}: job failed (exit {out.returncode})\n"
                        f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return records


def _text(data) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


# ------------------------------------------------------------------ worker side


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the job size, from the launcher's environment."""
    for rank_var, size_var in (("PMI_RANK", "PMI_SIZE"),
                               ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def report(**fields) -> None:
    """Hand one record to the launcher (rank 0 only; the others stay quiet)."""
    if rank_and_size()[0] == 0:
        print(_RESULT + json.dumps(fields), flush=True)


def paired_ratio_line(times: dict, model: str, width: int, target: float = 1.05) -> str:
    """The hvdlite / floor ratio of *model* taken within each round (the two jobs
    ran one after the other, so slow drift of the machine's speed cancels), then
    the median over rounds, as one printed row; *times* maps (model, mode) to
    each round's step time."""
    paired = [h / f for h, f in zip(times[model, "hvdlite"], times[model, "floor"],
                                    strict=True)]
    r = statistics.median(paired)
    return (f"{'  the same, median of per-round ratios':{width}s}{'':24s}{r:8.3f}  "
            f"<= {target:.2f}  {'ok' if r <= target else 'MISSED'}  "
            f"({', '.join(f'{x:.3f}' for x in paired)})")


def median_step(step: Callable[[], object], steps: int, block: int) -> float:
    """Median seconds per call of ``step`` over ``steps // block`` blocks of ``block`` calls."""
    times = []
    for _ in range(max(1, steps // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        times.append((time.perf_counter() - t0) / block)
    return statistics.median(times)


def torch_floor(params) -> Callable[[], None]:
    """The floor's per-step work for torch: barrier, then copy and add every ``.grad``."""
    import torch
    from mpi4py import MPI

    pairs = [(p, torch.empty_like(p)) for p in params]

    def lockstep_and_touch():
        MPI.COMM_WORLD.Barrier()
        for p, shadow in pairs:
            shadow.copy_(p.grad)
            p.grad.add_(shadow)

    return lockstep_and_touch


def tf_floor(tf) -> Callable[[list], list]:
    """The floor's per-step work for TensorFlow, ``grads -> grads``: one
    ``numpy_function`` over all gradients that waits on a barrier, then makes
    one copy and one add of every gradient.  Inside a graph the small
    gradients cross into numpy packed into one flat tensor per dtype, by the
    rule hvdlite's own graph path uses (:mod:`hvdlite.tensorflow.packing`):
    TensorFlow charges every tensor that crosses, and a floor that paid that
    per gradient would be beaten by hvdlite on a model of many small weights.
    A sparse gradient (``tf.IndexedSlices``, an embedding's) stays sparse: its
    values are copied and added, its indices copied, and the optimizer gets
    it back as IndexedSlices, so the floor leaves the optimizer's own work
    as it is."""
    import numpy as np
    from mpi4py import MPI

    from hvdlite.tensorflow.packing import Packing

    def touch_arrays(*arrays):
        MPI.COMM_WORLD.Barrier()
        out = []
        for a in arrays:
            shadow = np.array(a)  # the copy a peer would read
            if shadow.dtype.kind == "f":
                np.add(shadow, a, out=shadow)
            out.append(shadow)
        return out

    def touch(grads):
        grads = list(grads)
        sparse = [i for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
        dense = [g for g in grads if not isinstance(g, tf.IndexedSlices)]
        everything = [list(range(len(dense)))]
        packing = Packing(dense, everything if not tf.executing_eagerly() else [])
        packed, _ = packing.pack(dense, everything)
        for i in sparse:
            packed += [grads[i].values, grads[i].indices]
        outs = tf.numpy_function(touch_arrays, packed, [g.dtype for g in packed], stateful=True)
        for o, g in zip(outs, packed, strict=True):
            o.set_shape(g.shape)
        n = len(outs) - 2 * len(sparse)
        dense_out = iter(packing.unpack(outs[:n]))
        result = [None if isinstance(g, tf.IndexedSlices) else next(dense_out) for g in grads]
        for j, i in enumerate(sparse):
            result[i] = tf.IndexedSlices(outs[n + 2 * j], outs[n + 2 * j + 1],
                                         grads[i].dense_shape)
        return result

    return touch


# ------------------------------------------------- in-job timing (one MPI job)


def paired_times(fn, base, iters: int, repeats: int, barrier) -> tuple[float, float]:
    """Median seconds per call of *fn* and of *base*, timed in alternating repetitions
    so that load from elsewhere on the machine hits both alike."""
    samples: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for f, out in ((fn, samples[0]), (base, samples[1])):
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                f()
            out.append((time.perf_counter() - t0) / iters)
    return statistics.median(samples[0]), statistics.median(samples[1])


def short_time(seconds: float) -> str:
    """``12.3 us`` below 10 ms, ``12.34 ms`` above."""
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-2 else f"{seconds * 1e3:.2f} ms"


def run_self_or_launch(run_ranks: Callable[[], None], script: str, ranks: int = RANKS) -> int:
    """Inside an MPI job, run *run_ranks*; otherwise start *script* on *ranks* ranks
    with this environment's mpiexec and return its exit code."""
    if any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")):
        run_ranks()
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, str(Path(script).resolve())]
    return subprocess.run(cmd, env=env, timeout=600).returncode
