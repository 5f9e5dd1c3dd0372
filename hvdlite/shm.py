"""Allreduce through one node's shared memory, for process sets that fit in a node.

When every rank of a process set runs on the same node, the ranks can read each
other's data directly.  Each rank owns two areas of an MPI shared-memory window
(``MPI.Win.Allocate_shared``): a *contribution* area and a *result* area.  A
batch is reduced chunk by chunk (a chunk fills at most one area), and each
chunk is cut into one *portion* per rank, reduced by that rank alone:

1. every rank copies its data for the other ranks' portions (prescaled, cast to
   the wire dtype) into its contribution area;
2. ``MPI_Win_sync`` + barrier + ``MPI_Win_sync`` (the MPI-3 idiom that makes
   the stores before it visible to the other ranks);
3. every rank reduces its own portion, in rank order, reading its own data
   where it is and the peers' from their contribution areas, into its result
   area, a cache-sized block at a time, handing each block on to its outputs
   (postscaled) while it is still in cache;
4. sync + barrier + sync again;
5. every rank copies the peers' portions from their result areas to its outputs.

So a rank copies (N-1)/N of its data in, reduces 1/N of the data and copies
(N-1)/N of the results out: less memory traffic than MPI's allreduce through a
fusion buffer (copy in, MPI's own shared-memory cells, copy out) and, for two
ranks, half the reduction work of letting every rank reduce everything.  Each
element is reduced by exactly one rank, so every rank gets bitwise the same
result.

The areas are reused by every chunk, which keeps them warm in cache.  That is
safe: a rank writes its contribution area for chunk k+1 only after the second
barrier of chunk k, when every peer has finished reading it, and its result
area only after the first barrier of chunk k+1, which a peer reaches only once
it has copied out chunk k.

The path is used for 2 to :data:`MAX_RANKS` ranks on one node; the executor
decides which tensors of a batch come here (see its docstring).

Cross-rank contract: every rank of the set calls :meth:`SharedMemoryAllreduce.create`
and then :meth:`~SharedMemoryAllreduce.allreduce` with the same item counts,
wire dtype and op, in the same order (the engine's response list guarantees
it), and :meth:`~SharedMemoryAllreduce.free` together.  A joined rank passes
items without arrays: it contributes zeros and still reduces its portion.
"""

from __future__ import annotations

import logging
import os

import numpy as np
from mpi4py import MPI

from .ops import ReduceOp

__all__ = ["SharedMemoryAllreduce", "MAX_RANKS", "SHM_MIN_BYTES", "SLOT_BYTES"]

log = logging.getLogger("hvdlite")

#: Largest process set reduced through shared memory.
MAX_RANKS = 4
#: Smallest batch (in wire bytes) worth this path: below it, one MPI allreduce's
#: latency beats the two barriers here (measured with 2 ranks: a 4 KB tensor took
#: 83 us here and 60 us through MPI; at 256 KB this path was ahead).
SHM_MIN_BYTES = 64 << 10
#: A rank reduces its portion in blocks of this size and hands each block to its
#: outputs at once, while the block is still in the core's cache.
BLOCK_BYTES = 256 << 10
#: Bytes of one area (each rank has a contribution and a result area): a batch is
#: reduced in chunks of at most this size.
SLOT_BYTES = 16 << 20

_UFUNCS = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


class SharedMemoryAllreduce:
    """A contribution and a result area per rank in one shared window, over the
    set's node communicator."""

    def __init__(self, comm, window, areas: list[np.ndarray]):
        self._comm = comm
        self._win = window
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        # Every rank's areas as bytes, indexed by rank.
        self._contributions = [a[:SLOT_BYTES] for a in areas]
        self._results = [a[SLOT_BYTES:] for a in areas]

    @classmethod
    def create(cls, comm) -> SharedMemoryAllreduce | None:
        """Collective over *comm*: the reducer, or None on every rank when the ranks
        do not all share one node (or are too few or too many for this path)."""
        size = comm.Get_size()
        if not 2 <= size <= MAX_RANKS:
            return None
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        if node.Get_size() != size:
            node.Free()
            return None
        # The window lives in a shared-memory file system; one that is too small (a
        # container's 64 MB /dev/shm) would fail the job with SIGBUS on first touch.
        # Every rank must agree, or the collective allocation below would hang.
        room = _free_shm_bytes() >= 2 * size * 2 * SLOT_BYTES
        if not node.allreduce(room, op=MPI.LAND):
            log.info("hvdlite: /dev/shm is too small for the shared-memory allreduce "
                     "(needs %d MiB free); reducing through MPI", 4 * size * SLOT_BYTES >> 20)
            node.Free()
            return None
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        window = MPI.Win.Allocate_shared(2 * SLOT_BYTES, 1, info=info, comm=node)
        info.Free()
        window.Lock_all(MPI.MODE_NOCHECK)
        areas = []
        for r in range(size):
            buf, _ = window.Shared_query(r)
            areas.append(np.frombuffer(buf, dtype=np.uint8, count=2 * SLOT_BYTES))
        return cls(node, window, areas)

    def free(self) -> None:
        """Collective: release the window and the node communicator."""
        self._contributions = self._results = []
        self._win.Unlock_all()
        self._win.Free()
        self._comm.Free()

    # ----------------------------------------------------------------- allreduce
    def allreduce(self, items, wire: np.dtype, op: ReduceOp) -> None:
        """Reduce *items* (``(entry, input, output, count, prescale, postscale)``,
        input/output None on a joined rank) element-wise across the set."""
        ufunc = _UFUNCS[op]
        capacity = SLOT_BYTES // wire.itemsize
        chunk = []  # pieces: (_Tensor, offset in the tensor, offset in the chunk, count)
        fill = 0
        for item in items:
            tensor = _Tensor(item, wire)
            count = item[3]
            done = 0
            while done < count:
                n = min(count - done, capacity - fill)
                chunk.append((tensor, done, fill, n))
                fill += n
                done += n
                if fill == capacity:
                    self._run_chunk(chunk, fill, wire, ufunc)
                    chunk, fill = [], 0
        if chunk:
            self._run_chunk(chunk, fill, wire, ufunc)

    def _sync(self) -> None:
        self._win.Sync()
        self._comm.Barrier()
        self._win.Sync()

    def _run_chunk(self, chunk, fill: int, wire: np.dtype, ufunc) -> None:
        size, rank = self._size, self._rank
        nbytes = fill * wire.itemsize
        contributions = [a[:nbytes].view(wire) for a in self._contributions]
        bounds = [fill * p // size for p in range(size + 1)]
        portions = _cut(chunk, bounds)
        mine = contributions[rank]
        for p, pieces in enumerate(portions):
            if p != rank:
                _copy_in(pieces, mine, bounds[p], bounds[p + 1])
            else:  # this rank's own data is read where it is, unless it needs a cast
                _copy_in([piece for piece in pieces if not piece[0].direct], mine)
        self._sync()
        lo = bounds[rank]
        result = self._results[rank][:nbytes].view(wire)
        block = BLOCK_BYTES // wire.itemsize
        for tensor, offset, at, n in portions[rank]:
            # A block at a time, so the delivery reads the reduced values from cache.
            for start in range(0, n, block):
                m = min(block, n - start)
                a, o = at + start, offset + start
                parts = [c[a:a + m] for c in contributions]
                if tensor.direct:
                    parts[rank] = tensor.inp[o:o + m]
                dst = result[a - lo:a - lo + m]
                _reduce(ufunc, parts, dst)
                _deliver(dst, tensor, o, m)
        self._sync()
        for p, pieces in enumerate(portions):
            if p == rank:
                continue
            peer, start = self._results[p][:nbytes].view(wire), bounds[p]
            for tensor, offset, at, n in pieces:
                _deliver(peer[at - start:at - start + n], tensor, offset, n)


class _Tensor:
    """One item of a batch as this path uses it: flat views of its arrays, its scale
    factors, and whether this rank's reduction can read its input where it is (no
    zeros for a joined rank, no scale, no cast)."""

    __slots__ = ("inp", "out", "pre", "post", "direct")

    def __init__(self, item, wire: np.dtype):
        _, inp, out, _, self.pre, self.post = item
        self.inp = inp if inp is None or inp.ndim == 1 else inp.reshape(-1)
        self.out = out if out is None or out.ndim == 1 else out.reshape(-1)
        self.direct = inp is not None and self.pre == 1.0 and inp.dtype == wire


def _free_shm_bytes(path: str = "/dev/shm") -> int:
    """Bytes free in the shared-memory file system (unlimited where there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def _cut(chunk, bounds: list[int]) -> list[list]:
    """The pieces of *chunk* in each portion ``[bounds[p], bounds[p + 1])``."""
    portions = [[] for _ in range(len(bounds) - 1)]
    p = 0
    for tensor, offset, at, n in chunk:
        end = at + n
        while at < end:
            while bounds[p + 1] <= at:
                p += 1
            stop = min(end, bounds[p + 1])
            portions[p].append((tensor, offset, at, stop - at))
            offset += stop - at
            at = stop
    return portions


def _copy_in(pieces, area: np.ndarray, lo: int | None = None, hi: int | None = None) -> None:
    """This rank's *pieces* into its contribution *area*: prescaled, cast, zeros when
    joined.  With *lo*/*hi*, the pieces cover ``area[lo:hi]`` exactly."""
    if lo is not None and pieces and all(piece[0].direct for piece in pieces):
        # The common case: one C call packs every piece.
        np.concatenate([t.inp[offset:offset + n] for t, offset, _, n in pieces],
                       out=area[lo:hi])
        return
    for tensor, offset, at, n in pieces:
        dst = area[at:at + n]
        if tensor.inp is None:
            dst.fill(0)
        elif tensor.pre != 1.0:
            np.multiply(tensor.inp[offset:offset + n], tensor.pre, out=dst, casting="unsafe")
        else:
            np.copyto(dst, tensor.inp[offset:offset + n], casting="unsafe")


def _deliver(reduced: np.ndarray, tensor: _Tensor, offset: int, n: int) -> None:
    """Reduced values into this rank's output (postscaled, cast); nothing when joined."""
    if tensor.out is None:
        return
    dst = tensor.out[offset:offset + n]
    if tensor.post != 1.0:
        np.multiply(reduced, tensor.post, out=dst, casting="unsafe")
    else:
        np.copyto(dst, reduced, casting="unsafe")


def _reduce(ufunc, parts: list[np.ndarray], out: np.ndarray) -> None:
    """out = parts[0] (op) parts[1] (op) ... in rank order."""
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)
