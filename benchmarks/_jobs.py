"""Pieces the training benchmarks share: starting their jobs, timing steps, the floor.

A benchmark script is both the launcher and the worker: run plainly, it starts
its jobs with :func:`run_job` (2 ranks, the mpiexec beside this
Python, the same environment for every mode); each rank of a job runs the
script again with ``--worker ...`` and rank 0 prints its figures with
:func:`report`.  Not a benchmark itself (``run_all.py`` runs ``bench_*.py``).

Worker side:

- :func:`median_step`: median seconds per step over blocks of steps;
  :func:`paired`: the median ratio of two modes that took turns in one job;
- :func:`torch_floor` / :func:`tf_floor`: what any 2-rank allreduce from
  Python must at least do each step on this machine: a barrier (the ranks run
  in lockstep, so each step waits for the slower one) and one copy plus one
  add over every gradient (each rank must publish its gradients and fold the
  peer's into its own).  The ``floor`` modes run it in place of communication.
- the same with ``exchange=True``: the copy goes to memory the peer reads
  (one shared-memory window, :class:`SharedCopies`) and the add takes the
  peer's copy, so every gradient byte really crosses between the processes
  once.  The plain floor touches only a rank's own memory; this one also
  pays what this machine charges for moving data between its cores, which
  no real allreduce escapes (``exchange`` modes).
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

__all__ = [
    "RANKS",
    "ROOT",
    "JobFailed",
    "SharedCopies",
    "free_ports",
    "job_env",
    "median_step",
    "mpiexec",
    "paired",
    "rank_and_size",
    "report",
    "run_job",
    "tf_floor",
    "torch_floor",
]

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


def run_job(
    script: str | Path, worker_args: Sequence[str], *, ranks: int = RANKS, timeout: float = 600
) -> list[dict]:
    """Run ``script --worker ...`` on ``ranks`` ranks; the records rank 0 reported.

    Raises :class:`JobFailed` (with the tail of the job's output) when the job
    exits non-zero, times out or reports nothing.
    """
    worker_args = [str(a) for a in worker_args]
    cmd = [
        mpiexec(),
        "-n",
        str(ranks),
        sys.executable,
        str(Path(script).resolve()),
        "--worker",
        *worker_args,
    ]
    try:
        out = subprocess.run(
            cmd, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise JobFailed(
            f"{' '.join(worker_args)}: timed out after {timeout:.0f}s\n"
            f"{_text(e.stdout)[-3000:]}\n{_text(e.stderr)[-3000:]}"
        ) from None
    records = [
        json.loads(line[len(_RESULT) :])
        for line in out.stdout.splitlines()
        if line.startswith(_RESULT)
    ]
    if out.returncode or not records:
        raise JobFailed(
            f"{' '.join(worker_args)}: job failed (exit {out.returncode})\n"
            f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        )
    return records


def _text(data) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


# ------------------------------------------------------------------ worker side


def rank_and_size() -> tuple[int, int]:
    """This process's rank and the job size, from the launcher's environment."""
    for rank_var, size_var in (
        ("PMI_RANK", "PMI_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ):
        if rank_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def report(**fields) -> None:
    """Hand one record to the launcher (rank 0 only; the others stay quiet)."""
    if rank_and_size()[0] == 0:
        print(_RESULT + json.dumps(fields), flush=True)


def paired(turns: dict, mode: str, base: str) -> float:
    """Median over turns of *mode*'s / *base*'s step time, each pair from the same
    turn of one job (*turns* maps a mode to its turns' step times, in turn order)."""
    return statistics.median(a / b for a, b in zip(turns[mode], turns[base], strict=True))


def median_step(step: Callable[[], object], steps: int, block: int) -> float:
    """Median seconds per call of ``step`` over ``steps // block`` blocks of ``block`` calls."""
    times = []
    for _ in range(max(1, steps // block)):
        t0 = time.perf_counter()
        for _ in range(block):
            step()
        times.append((time.perf_counter() - t0) / block)
    return statistics.median(times)


class SharedCopies:
    """Each rank's published copy of its gradients, in one shared-memory window.

    A step's copies take the next *slot* of a rank's area: successive steps
    move through the first ``hvdlite.engine.transports.shm.ROTATION_BYTES`` of it, page-aligned,
    as hvdlite's own shared-memory allreduce places its chunks (writing memory
    the other core has just read is what is slow here, so a floor that reused
    one place would be slower than hvdlite and no floor).  :meth:`barrier`
    makes the copies visible (the MPI-3 ``Win_sync`` + barrier idiom).  With at
    least two slots a rank never overwrites a copy a peer may still read: it
    is at most one barrier ahead.  Every rank of the job must share one node
    and publish the same shapes.
    """

    def __init__(self, step_bytes: int, align: int = 64):
        import numpy as np
        from mpi4py import MPI

        from hvdlite.engine.transports.shm import ROTATION_BYTES

        self._comm = MPI.COMM_WORLD
        node = self._comm.Split_type(MPI.COMM_TYPE_SHARED)
        if node.Get_size() != self._comm.Get_size():
            raise RuntimeError("the exchange floor needs every rank on one node")
        self.align = align
        self.slot_bytes = -(-max(step_bytes, 1) // 4096) * 4096
        self.slots = max(2, ROTATION_BYTES // self.slot_bytes)
        self._win = MPI.Win.Allocate_shared(self.slots * self.slot_bytes, 1, comm=node)
        self._win.Lock_all(MPI.MODE_NOCHECK)
        self.rank = node.Get_rank()
        self.areas = [
            np.frombuffer(
                self._win.Shared_query(r)[0], dtype=np.uint8, count=self.slots * self.slot_bytes
            )
            for r in range(node.Get_size())
        ]
        self.peers = [r for r in range(node.Get_size()) if r != self.rank]
        self._next = 0

    def next_slot(self) -> int:
        """The byte offset of this step's slot (the same step order on every rank)."""
        slot, self._next = self._next, (self._next + 1) % self.slots
        return slot * self.slot_bytes

    def views(self, rank: int, offset: int, layout) -> list:
        """Arrays over *rank*'s area at *offset*: one per (dtype, shape) of *layout*."""
        import numpy as np

        out, at = [], offset
        for dtype, shape in layout:
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            out.append(self.areas[rank][at : at + n].view(dtype).reshape(shape))
            at += -(-n // self.align) * self.align
        return out

    @staticmethod
    def nbytes(layout, align: int = 64) -> int:
        import numpy as np

        return sum(
            -(-int(np.prod(s, dtype=np.int64)) * np.dtype(d).itemsize // align) * align
            for d, s in layout
        )

    def barrier(self) -> None:
        self._win.Sync()
        self._comm.Barrier()
        self._win.Sync()


def torch_floor(params, exchange: bool = False) -> Callable[[], None]:
    """The floor's per-step work for torch: barrier, then copy and add every ``.grad``
    (with *exchange*, copy into shared memory and add the peer's copy)."""
    import itertools

    import torch
    from mpi4py import MPI

    params = list(params)
    if not exchange:
        pairs = [(p, torch.empty_like(p)) for p in params]

        def lockstep_and_touch():
            MPI.COMM_WORLD.Barrier()
            for p, shadow in pairs:
                shadow.copy_(p.grad)
                p.grad.add_(shadow)

        return lockstep_and_touch

    layout = [(torch.empty((), dtype=p.dtype).numpy().dtype, tuple(p.shape)) for p in params]
    shared = SharedCopies(SharedCopies.nbytes(layout))
    slots = []  # per slot: this rank's copies, and each peer's
    for _ in range(shared.slots):
        offset = shared.next_slot()
        slots.append(
            (
                [torch.from_numpy(v) for v in shared.views(shared.rank, offset, layout)],
                [
                    [torch.from_numpy(v) for v in shared.views(r, offset, layout)]
                    for r in shared.peers
                ],
            )
        )
    turns = itertools.cycle(slots)

    def exchange_and_add():
        mine, theirs = next(turns)
        for p, copy in zip(params, mine, strict=True):
            copy.copy_(p.grad)
        shared.barrier()
        for peer in theirs:
            for p, copy in zip(params, peer, strict=True):
                p.grad.add_(copy)

    return exchange_and_add


def tf_floor(tf, exchange: bool = False) -> Callable[[list], list]:
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
    as it is.  With *exchange*, every array is copied into shared memory and
    the result is the sum with the peer's copy (integers: the peer's copy);
    the shared window is made at the first run, collectively, sized for
    that run's arrays."""
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

    shared: list = []  # the SharedCopies, once the first run made it
    slots: dict = {}  # (layout, slot offset) -> this rank's copies, each peer's

    def exchange_arrays(*arrays):
        layout = tuple((a.dtype, a.shape) for a in arrays)
        if not shared:
            shared.append(SharedCopies(SharedCopies.nbytes(layout)))
        copies = shared[0]
        offset = copies.next_slot()
        slot = slots.get((layout, offset))
        if slot is None:
            if SharedCopies.nbytes(layout) > copies.slot_bytes:
                raise RuntimeError("the exchange floor's arrays grew after its first run")
            slot = slots[layout, offset] = (
                copies.views(copies.rank, offset, layout),
                [copies.views(r, offset, layout) for r in copies.peers],
            )
        mine, theirs = slot
        for a, copy in zip(arrays, mine, strict=True):
            np.copyto(copy, a)
        copies.barrier()
        out = [None] * len(arrays)
        for peer in theirs:
            for i, (a, copy) in enumerate(zip(arrays, peer, strict=True)):
                if a.dtype.kind != "f":
                    out[i] = np.array(copy)
                elif out[i] is None:
                    out[i] = np.add(a, copy)
                else:
                    np.add(out[i], copy, out=out[i])
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
        body = exchange_arrays if exchange else touch_arrays
        outs = tf.numpy_function(body, packed, [g.dtype for g in packed], stateful=True)
        for o, g in zip(outs, packed, strict=True):
            o.set_shape(g.shape)
        n = len(outs) - 2 * len(sparse)
        dense_out = iter(packing.unpack(outs[:n]))
        result = [None if isinstance(g, tf.IndexedSlices) else next(dense_out) for g in grads]
        for j, i in enumerate(sparse):
            result[i] = tf.IndexedSlices(outs[n + 2 * j], outs[n + 2 * j + 1], grads[i].dense_shape)
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
