"""Allreduce through one node's shared memory, for process sets that fit in a node.

When every rank of a process set runs on the same node, the ranks can read each
other's data directly.  Each rank exposes two *slots* in an MPI shared-memory
window (``MPI.Win.Allocate_shared``) and a batch is reduced chunk by chunk:

1. every rank copies its part of the chunk (prescaled, cast to the wire dtype)
   into its slot;
2. ``MPI_Win_sync`` + barrier + ``MPI_Win_sync`` (the MPI-3 idiom that makes
   the stores of step 1 visible to the other ranks);
3. every rank reduces all slots, in rank order, straight into its own outputs
   (postscaled).

So a rank touches its data twice (one copy in, one N-way reduction out), where
MPI's allreduce through a fusion buffer copies in, moves the data through MPI's
own shared-memory cells and copies out again.  Every rank computes the same
reduction in the same order, so the results are bitwise identical everywhere.

The two slots alternate between chunks: a rank may fill chunk k+1 while a peer
still reads chunk k, and it can only start chunk k+2 after the barrier of chunk
k+1, which that peer reaches only once it has finished reading chunk k.

Each rank reads all N slots, so the memory traffic grows with N; the path is
used for 2 to :data:`MAX_RANKS` ranks, beyond that MPI's algorithms move less.
The executor decides which tensors of a batch come here (see its docstring).

Cross-rank contract: every rank of the set calls :meth:`SharedMemoryAllreduce.create`
and then :meth:`~SharedMemoryAllreduce.allreduce` with the same item counts,
wire dtype and op, in the same order (the engine's response list guarantees
it), and :meth:`~SharedMemoryAllreduce.free` together.  A joined rank passes
items without arrays and contributes zeros.
"""

from __future__ import annotations

import logging
import os

import numpy as np
from mpi4py import MPI

from .ops import ReduceOp

__all__ = ["SharedMemoryAllreduce", "MAX_RANKS", "SLOT_BYTES"]

log = logging.getLogger("hvdlite")

#: Largest process set reduced through shared memory.
MAX_RANKS = 4
#: Bytes of one slot: a batch is reduced in chunks of at most this size.
SLOT_BYTES = 16 << 20

_UFUNCS = {
    ReduceOp.AVERAGE: np.add,
    ReduceOp.SUM: np.add,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
    ReduceOp.PRODUCT: np.multiply,
}


class SharedMemoryAllreduce:
    """Two slots per rank in one shared window, over the set's node communicator."""

    def __init__(self, comm, window, slots: list[np.ndarray]):
        self._comm = comm
        self._win = window
        self._slots = slots  # every rank's slot pair as bytes, indexed by rank
        self._rank = comm.Get_rank()
        self._chunks = 0  # chunks run so far: picks the slot of the next one
        self._scratch = np.empty(0, dtype=np.uint8)

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
        slots = []
        for r in range(size):
            buf, _ = window.Shared_query(r)
            slots.append(np.frombuffer(buf, dtype=np.uint8, count=2 * SLOT_BYTES))
        return cls(node, window, slots)

    def free(self) -> None:
        """Collective: release the window and the node communicator."""
        self._slots = []
        self._win.Unlock_all()
        self._win.Free()
        self._comm.Free()

    # ----------------------------------------------------------------- allreduce
    def allreduce(self, items, wire: np.dtype, op: ReduceOp) -> None:
        """Reduce *items* (``(entry, input, output, count, prescale, postscale)``,
        input/output None on a joined rank) element-wise across the set."""
        ufunc = _UFUNCS[op]
        if wire.kind == "f" and ufunc is np.add:
            # Scale on the way in instead of on the way out (sum(x * pre * post) instead
            # of sum(x * pre) * post, equal up to rounding): the copy into the slot
            # costs the same with a factor, and the reduction then writes the final
            # values, where a postscale would take another pass over the output.
            items = [(e, i, o, c, pre * post, 1.0) for e, i, o, c, pre, post in items]
        capacity = SLOT_BYTES // wire.itemsize
        chunk = []  # (item, offset in the item, offset in the slot, count)
        fill = 0
        for item in items:
            count = item[3]
            done = 0
            while done < count:
                n = min(count - done, capacity - fill)
                chunk.append((item, done, fill, n))
                fill += n
                done += n
                if fill == capacity:
                    self._run_chunk(chunk, fill, wire, ufunc)
                    chunk, fill = [], 0
        if chunk:
            self._run_chunk(chunk, fill, wire, ufunc)

    def _run_chunk(self, chunk, fill: int, wire: np.dtype, ufunc) -> None:
        start = (self._chunks & 1) * SLOT_BYTES
        self._chunks += 1
        slots = [s[start:start + fill * wire.itemsize].view(wire) for s in self._slots]
        _copy_in(chunk, slots[self._rank], wire)
        self._win.Sync()
        self._comm.Barrier()
        self._win.Sync()
        for item, offset, at, n in chunk:
            out, post = item[2], item[5]
            if out is None:
                continue
            dst = out.reshape(-1)[offset:offset + n]
            parts = [s[at:at + n] for s in slots]
            if dst.dtype == wire and post == 1.0:
                _reduce(ufunc, parts, dst)
                continue
            acc = self._scratch_of(wire, n)
            _reduce(ufunc, parts, acc)
            if post != 1.0:
                np.multiply(acc, post, out=dst, casting="unsafe")
            else:
                np.copyto(dst, acc, casting="unsafe")

    def _scratch_of(self, wire: np.dtype, n: int) -> np.ndarray:
        nbytes = n * wire.itemsize
        if self._scratch.size < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        return self._scratch[:nbytes].view(wire)


def _free_shm_bytes(path: str = "/dev/shm") -> int:
    """Bytes free in the shared-memory file system (unlimited where there is none)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 1 << 62
    return st.f_bavail * st.f_frsize


def _copy_in(chunk, slot: np.ndarray, wire: np.dtype) -> None:
    """This rank's part of *chunk* into *slot*: prescaled, cast, zeros when joined."""
    if all(item[1] is not None and item[4] == 1.0 and item[1].dtype == wire
           for item, _, _, _ in chunk):
        # The common case: one C call packs every piece.
        np.concatenate([item[1].reshape(-1)[offset:offset + n]
                        for item, offset, _, n in chunk], out=slot)
        return
    for item, offset, at, n in chunk:
        inp, pre = item[1], item[4]
        dst = slot[at:at + n]
        if inp is None:
            dst.fill(0)
            continue
        src = inp.reshape(-1)[offset:offset + n]
        if pre != 1.0:
            np.multiply(src, pre, out=dst, casting="unsafe")
        else:
            np.copyto(dst, src, casting="unsafe")


def _reduce(ufunc, parts: list[np.ndarray], out: np.ndarray) -> None:
    """out = parts[0] (op) parts[1] (op) ... in rank order."""
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)
