"""Allreduce and allgather through one node's shared memory, for process sets that fit in a node.

When every rank of a process set runs on the same node, the ranks can read each
other's data directly.  Each rank owns two areas of an MPI shared-memory window
(``MPI.Win.Allocate_shared``): a *contribution* area and a *result* area.  A
batch is reduced chunk by chunk (a chunk fills at most one area), and each
chunk is cut into one *portion* per rank, reduced by that rank alone:

1. every rank copies its data for the other ranks' portions (prescaled, cast to
   the wire dtype) into its contribution area;
2. ``MPI_Win_sync`` + barrier + ``MPI_Win_sync`` (the MPI-3 idiom that makes
   the stores before it visible to the other ranks);
3. every rank reduces its own portion, reading its own data where it is and
   the peers' from their contribution areas.  A piece up to a cache-sized block
   that needs no scale or cast is reduced straight into its output and copied
   to the rank's result area a block of pieces at a time; anything else is
   reduced into the result area a block at a time and handed on to its outputs
   (postscaled, cast) while it is still in cache;
4. sync + barrier + sync again;
5. every rank copies the peers' portions from their result areas to its outputs.

So a rank copies (N-1)/N of its data in, reduces 1/N of the data and copies
(N-1)/N of the results out: less memory traffic than MPI's allreduce through a
fusion buffer (copy in, MPI's own shared-memory cells, copy out) and, for two
ranks, half the reduction work of letting every rank reduce everything.  Each
element is reduced by exactly one rank, so every rank gets bitwise the same
result.

Successive chunks move through the first :data:`ROTATION_BYTES` of each area
rather than all starting at its beginning: a store to memory that another
core has just read costs a coherence round trip to that core per cache line,
which where the two cores share no cache makes writing memory the peer read
in the last step several times slower than writing memory it read a few
chunks ago.  Every rank places each chunk alike (the same chunks in the same
order).  Reusing the areas is safe: a rank writes its contribution area for
chunk k+1 only after the second
barrier of chunk k, when every peer has finished reading it, and its result
area only after the first barrier of chunk k+1, which a peer reaches only once
it has copied out chunk k.

An allgather uses the contribution areas only: each rank writes a header (its
row counts) and its rows, a barrier, each rank copies every rank's rows out,
a second barrier.  One exchange replaces MPI's two (the row counts, then the
rows); a rank whose rows do not fit its area says so in its header, and every
rank then gathers through MPI.  A reduce-scatter uses both areas of every rank
(:mod:`~hvdlite.engine.transports.shm_scatter`).  Every collective begins after
the others' last barrier, so they share the areas safely.

A *staged* allreduce saves the first barrier where the engine can tell ahead
of its cycle what will run (a training loop's cached plan, see
:meth:`~SharedMemoryAllreduce.stage`): a rank ready for that batch does step 1
before the engine's status exchange, while it would otherwise wait for its
peers there, and the exchange then stands in for the barrier of step 2: no
rank completes it before every peer has entered it, so every peer's copy is
complete and visible.  Steps 3-5 follow as above, so the work and the result
are those of an unstaged chunk.  The early copy is safe for the same reason:
a peer completes the exchange only after it has finished every collective
before it, and after a collective's last barrier nobody reads a contribution
area.

The path is used for 2 to :data:`MAX_RANKS` ranks on one node; the executor
decides which tensors of a batch come here (see its docstring).

Cross-rank contract: every rank of the set calls :meth:`SharedMemoryAllreduce.create`
and then :meth:`~SharedMemoryAllreduce.allreduce` (the same item counts, wire
dtype and op) and :meth:`~SharedMemoryAllreduce.allgather` (the same tensors
and row sizes) in the same order (the engine's response list guarantees it),
and :meth:`~SharedMemoryAllreduce.free` together.  A joined rank passes
items without arrays: it contributes zeros and still reduces its portion.
:meth:`~SharedMemoryAllreduce.run_staged` is collective in the same way, and
only for a batch that every rank of the set staged just before an exchange
that all of them have completed.
"""

from __future__ import annotations

import logging
import os

import numpy as np
from mpi4py import MPI

from ...util import half_casts
from ...util.backoff import Backoff
from ...ops import ReduceOp
from ...timeline.schema import COLLECTIVE, COPY_OUT
from .routes import SHM_MAX_RANKS, SHM_MIN_BYTES
from .shm_scatter import reduce_in_rank_order, reduce_scatter

__all__ = ["SharedMemoryAllreduce", "MAX_RANKS", "SHM_MIN_BYTES", "SLOT_BYTES"]

log = logging.getLogger("hvdlite")

# The size limits of this path live with the transport decision that applies them.
MAX_RANKS = SHM_MAX_RANKS
#: A rank reduces its portion in blocks of this size and hands each block to its
#: outputs at once, while the block is still in the core's cache.
BLOCK_BYTES = 256 << 10
#: Bytes of one area (each rank has a contribution and a result area): a batch is
#: reduced in chunks of at most this size.
SLOT_BYTES = 16 << 20
#: Chunks move through this many bytes at the start of each area, each starting
#: where the last one ended (on a page), back at the start once past it; a
#: chunk larger than it starts at the start.
ROTATION_BYTES = 8 << 20
_PAGE = 4096
#: The barrier under a wait limit: peers arrive within microseconds when in step.
_BARRIER_WAIT = Backoff(floor=0.00001, cap=0.001, ratio=0.5, spin=0.01)

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

    def __init__(self, comm, window, areas: list[np.ndarray], limit=None):
        self._comm = comm
        self._limit = limit  # a WaitLimit bounding the barrier, or None
        self._win = window
        self._size = comm.Get_size()
        self._rank = comm.Get_rank()
        # Every rank's areas as bytes, indexed by rank.
        self._contributions = [a[:SLOT_BYTES] for a in areas]
        self._results = [a[SLOT_BYTES:] for a in areas]
        self._layout_key = self._layout = None  # the last batch's layout, kept for reuse
        self._next_start = 0  # where in each area the next chunk begins (ROTATION_BYTES)
        self._staged: tuple | None = None  # (step, start, entries) copied in by stage()
        self.staged_runs = 0  # how many batches ran staged (for tests and benchmarks)

    @classmethod
    def create(cls, comm, limit=None) -> SharedMemoryAllreduce | None:
        """Collective over *comm*: the reducer, or None on every rank when the ranks
        do not all share one node (or are too few or too many for this path).
        *limit*: a :class:`~hvdlite.engine.wait_limit.WaitLimit` for the barrier, or None."""
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
            log.info(
                "hvdlite: /dev/shm is too small for the shared-memory allreduce "
                "(needs %d MiB free); reducing through MPI",
                4 * size * SLOT_BYTES >> 20,
            )
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
        return cls(node, window, areas, limit)

    def free(self) -> None:
        """Collective: release the window and the node communicator."""
        self._contributions = self._results = []
        self._staged = None
        self._win.Unlock_all()
        self._win.Free()
        self._comm.Free()

    # ----------------------------------------------------------------- allreduce
    def allreduce(self, tensors, wire: np.dtype, op: ReduceOp, layout_key=None) -> None:
        """Reduce *tensors* (a :class:`~hvdlite.device.buffers.Reduction`; inputs and outputs
        are None on a joined rank) element-wise across the set.

        *layout_key*: an object standing for the batch's agreed sizes, dtypes and
        scale factors (the engine passes its batch, which it reuses while the
        response cache is unchanged); the cut into chunks and portions is kept
        while the same key comes back.
        """
        step = _Step(tensors, self._layout_of(tensors, wire, layout_key), wire, _UFUNCS[op])
        self._staged = None  # its area is about to be overwritten
        for chunk in step.layout.chunks:
            self._run_chunk(step, chunk)

    def _layout_of(self, tensors, wire: np.dtype, layout_key) -> _Layout:
        layout = self._layout_key is layout_key and self._layout
        if not layout:
            layout = _Layout(tensors, wire, SLOT_BYTES // wire.itemsize, self._size)
            if layout_key is not None:
                self._layout_key, self._layout = layout_key, layout
        return layout

    def _sync(self) -> None:
        self._win.Sync()
        if self._limit is None:
            self._comm.Barrier()
        else:
            request = self._comm.Ibarrier()
            if not _BARRIER_WAIT.wait_for(request.Test, timeout=self._limit.seconds):
                raise self._limit.error("at the shared-memory allreduce's barrier")
        self._win.Sync()

    def _peek(self, nbytes: int) -> int:
        """Where in each area the next chunk of *nbytes* will begin (see ROTATION_BYTES)."""
        start = self._next_start
        return 0 if start + nbytes > ROTATION_BYTES else start

    def _place(self, nbytes: int) -> int:
        """Where the next chunk of *nbytes* begins; the one after it begins at its end."""
        start = self._peek(nbytes)
        self._next_start = start + -(-nbytes // _PAGE) * _PAGE
        return start

    def _run_chunk(self, step: _Step, chunk) -> None:
        start = self._place(chunk[0] * step.wire.itemsize)
        self._contribute(step, chunk, start)
        self._sync()
        self._reduce_and_collect(step, chunk, start)

    def _contribute(self, step: _Step, chunk, start: int) -> None:
        """Step 1 of a chunk: this rank's data for the peers' portions into its area."""
        fill, bounds, portions = chunk
        rank = self._rank
        mine = self._contributions[rank][start : start + fill * step.wire.itemsize].view(step.wire)
        for p, pieces in enumerate(portions):
            if p != rank:
                step.copy_in(pieces, mine, bounds[p], bounds[p + 1])
            else:  # this rank's own data is read where it is, unless it needs a cast
                step.copy_in([piece for piece in pieces if not step.direct[piece[0]]], mine)

    def _reduce_and_collect(self, step: _Step, chunk, start: int) -> None:
        """Steps 3-5 of a chunk, after its contributions are visible everywhere."""
        fill, bounds, portions = chunk
        rank, wire = self._rank, step.wire
        end = start + fill * wire.itemsize
        contributions = [a[start:end].view(wire) for a in self._contributions]
        step.reduce_own(
            portions[rank],
            contributions,
            rank,
            self._results[rank][start:end].view(wire),
            bounds[rank],
        )
        self._sync()
        for p, pieces in enumerate(portions):
            if p != rank:
                step.copy_out(pieces, self._results[p][start:end].view(wire), bounds[p])

    # ------------------------------------------------------------- reducescatter
    def reducescatter(self, tensors, wire: np.dtype, op: ReduceOp) -> list[np.ndarray]:
        """This rank's dim-0 shard of each reduced tensor (a list of
        :class:`~hvdlite.device.packing.Scattered`, all reduced in *wire*), through
        the window's areas (:mod:`~hvdlite.engine.transports.shm_scatter`)."""
        self._staged = None  # its area is about to be overwritten
        return reduce_scatter(self, tensors, wire, _UFUNCS[op])

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def areas(self) -> list[list[np.ndarray]]:
        """Every rank's two areas (bytes): ``[contribution areas, result areas]``."""
        return [self._contributions, self._results]

    def sync(self) -> None:
        """Collective: the stores before it are visible to every member after it."""
        self._sync()

    # ---------------------------------------------------------- staged allreduce
    def stage(self, tensors, wire: np.dtype, op: ReduceOp, layout_key) -> bool:
        """Step 1 of a batch of one chunk ahead of the engine's next status exchange
        (see the module docstring), for :meth:`run_staged` after it.  *tensors*,
        *wire*, *op* and *layout_key* are what :meth:`allreduce` would get.  Local:
        no rank waits.

        Returns False, having copied nothing, where the batch needs more than one
        chunk.  Staging the same entries again keeps the copy already made.
        """
        layout = self._layout_of(tensors, wire, layout_key)
        if len(layout.chunks) != 1:
            return False
        chunk = layout.chunks[0]
        start = self._peek(chunk[0] * wire.itemsize)
        entries = tensors.entries
        staged = self._staged
        if (
            staged is not None
            and staged[1] == start
            and len(staged[2]) == len(entries)
            and all(a is b for a, b in zip(staged[2], entries))
        ):
            return True
        step = _Step(tensors, layout, wire, _UFUNCS[op])
        self._contribute(step, chunk, start)
        self._win.Sync()
        self._staged = (step, start, entries)
        return True

    def run_staged(self) -> None:
        """Collective over the set, after a status exchange that every rank entered
        having staged the same batch (see :meth:`stage`): steps 3-5 of its chunk."""
        if self._staged is None:
            raise RuntimeError(
                "hvdlite internal error: a staged allreduce ran without its "
                "batch staged on this rank"
            )
        step, start, _ = self._staged
        self._staged = None
        chunk = step.layout.chunks[0]
        self._place(chunk[0] * step.wire.itemsize)  # == start: nothing ran since stage()
        self._win.Sync()
        self._reduce_and_collect(step, chunk, start)
        self.staged_runs += 1

    # ----------------------------------------------------------------- allgather
    def allgather(self, inputs, row_bytes: list[int], outputs_for, phase=None):
        """Gather every rank's rows of each tensor of a batch, in rank order.

        *inputs*: this rank's C-contiguous arrays (every member has them: no allgather runs
        while a rank has joined); *row_bytes*: the agreed bytes of one row of each. Each
        rank writes a header (its byte count and its row count per tensor) and its rows,
        packed, into its contribution area; after a barrier every rank reads every header,
        gets its outputs from ``outputs_for(dims)`` (*dims*: rows per rank and tensor,
        ``(size, tensors)``) and copies each rank's rows into them; a second barrier frees
        the areas for the next batch.
        Returns ``(dims, outputs)``, or ``(dims, None)`` on every rank alike when
        some rank's rows do not fit its area (then gather through MPI with
        *dims*).  *phase*: called with the timeline phase as it begins.
        """
        rank, n = self._rank, len(inputs)
        header = 8 * (1 + n)
        start = -(-header // 64) * 64  # the rows begin on a cache line
        rows = [x.shape[0] for x in inputs]
        nbytes = sum(r * b for r, b in zip(rows, row_bytes, strict=True))
        fits = start + nbytes <= SLOT_BYTES
        area = self._contributions[rank]
        head = area[:header].view(np.int64)
        head[0] = nbytes if fits else -1
        head[1:] = rows
        self._staged = None  # its area is about to be overwritten
        if fits and nbytes:
            np.concatenate(
                [x.reshape(-1).view(np.uint8) for x in inputs if x.size],
                out=area[start : start + nbytes],
            )
        if phase is not None:
            phase(COLLECTIVE)
        self._sync()
        heads = [a[:header].view(np.int64).tolist() for a in self._contributions]
        dims = np.array([h[1:] for h in heads], dtype=np.int64)
        if min(h[0] for h in heads) < 0:
            self._sync()
            return dims, None
        if phase is not None:
            phase(COPY_OUT)
        gathered = outputs_for(dims)
        outputs = [out.reshape(-1).view(np.uint8) for out in gathered]
        filled = [0] * n  # bytes of each output written so far
        for area, head in zip(self._contributions, heads, strict=True):
            at = start  # rank r's rows of each tensor follow each other in its area
            for j, out in enumerate(outputs):
                count = head[1 + j] * row_bytes[j]
                if count:
                    out[filled[j] : filled[j] + count] = area[at : at + count]
                    filled[j] += count
                    at += count
        self._sync()
        return dims, gathered


class _Layout:
    """What every rank derives alike from a batch's agreed facts: its chunks, each
    chunk's portion bounds and the pieces of tensors in each portion, plus per tensor
    its element count, scale factors, and whether its input is already in the wire
    dtype.  A piece is ``(tensor index, offset in the tensor, offset in the chunk, count)``."""

    __slots__ = ("chunks", "counts", "pre", "post", "wire_typed")

    def __init__(self, tensors, wire: np.dtype, capacity: int, size: int):
        self.counts = tensors.counts
        self.pre = tensors.prescales
        self.post = tensors.postscales
        # Unknown on a joined rank (no arrays): False only costs the general path.
        self.wire_typed = [x is not None and x.dtype == wire for x in tensors.inputs]
        self.chunks = []
        chunk, fill = [], 0
        for index, count in enumerate(self.counts):
            done = 0
            while done < count:
                n = min(count - done, capacity - fill)
                chunk.append((index, done, fill, n))
                fill += n
                done += n
                if fill == capacity:
                    self._add(chunk, fill, size)
                    chunk, fill = [], 0
        if chunk:
            self._add(chunk, fill, size)

    def _add(self, chunk, fill: int, size: int) -> None:
        bounds = [fill * p // size for p in range(size + 1)]
        self.chunks.append((fill, bounds, _cut(chunk, bounds)))


class _Step:
    """One allreduce's arrays over its layout: flat views of each item's input and
    output, and which items this rank may read in place (*direct*: no zeros for a
    joined rank, no prescale, no cast) or also reduce straight into their output
    (*plain*: direct and no postscale)."""

    __slots__ = ("ins", "outs", "direct", "plain", "layout", "wire", "ufunc", "block")

    def __init__(self, tensors, layout: _Layout, wire: np.dtype, ufunc):
        self.ins = [x if x is None or x.ndim == 1 else x.reshape(-1) for x in tensors.inputs]
        self.outs = [x if x is None or x.ndim == 1 else x.reshape(-1) for x in tensors.outputs]
        self.direct = [
            typed and pre == 1.0 and x is not None
            for typed, pre, x in zip(layout.wire_typed, layout.pre, self.ins)
        ]
        self.plain = [d and post == 1.0 for d, post in zip(self.direct, layout.post)]
        self.layout = layout
        self.wire = wire
        self.ufunc = ufunc
        self.block = BLOCK_BYTES // wire.itemsize

    def copy_in(
        self, pieces, area: np.ndarray, lo: int | None = None, hi: int | None = None
    ) -> None:
        """This rank's *pieces* into its contribution *area*: prescaled, cast, zeros when
        joined.  With *lo*/*hi*, the pieces cover ``area[lo:hi]`` exactly."""
        ins, direct, counts = self.ins, self.direct, self.layout.counts
        if lo is not None and pieces and all(direct[piece[0]] for piece in pieces):
            # The common case: one C call packs every piece.
            np.concatenate(
                [
                    ins[i] if n == counts[i] else ins[i][offset : offset + n]
                    for i, offset, _, n in pieces
                ],
                out=area[lo:hi],
            )
            return
        pre = self.layout.pre
        for i, offset, at, n in pieces:
            dst = area[at : at + n]
            if ins[i] is None:
                dst.fill(0)
            else:
                half_casts.copy(dst, ins[i][offset : offset + n], pre[i])

    def reduce_own(self, pieces, contributions, rank: int, result: np.ndarray, lo: int) -> None:
        """Reduce this rank's portion (*pieces*) into *result* (its result area, whose
        element 0 is chunk element *lo*) and into this rank's outputs."""
        ins, outs, plain, counts = self.ins, self.outs, self.plain, self.layout.counts
        ufunc, block = self.ufunc, self.block
        others = contributions[:rank] + contributions[rank + 1 :]
        group, group_at, group_n = [], 0, 0  # reduced outputs awaiting one copy to result
        for i, offset, at, n in pieces:
            if plain[i] and n <= block:
                # Reduce straight into the output (own data first, then the peers' in
                # rank order); the result area gets a copy, many pieces per call.
                inp, out = ins[i], outs[i]
                if n != counts[i]:
                    inp, out = inp[offset : offset + n], out[offset : offset + n]
                ufunc(inp, others[0][at : at + n], out=out)
                for other in others[1:]:
                    ufunc(out, other[at : at + n], out=out)
                if not group:
                    group_at = at
                group.append(out)
                group_n += n
                if group_n >= block:
                    np.concatenate(group, out=result[group_at - lo : group_at - lo + group_n])
                    group, group_n = [], 0
                continue
            if group:
                np.concatenate(group, out=result[group_at - lo : group_at - lo + group_n])
                group, group_n = [], 0
            # A block at a time into the result area, so the delivery reads the
            # reduced values from cache.
            for start in range(0, n, block):
                m = min(block, n - start)
                a, o = at + start, offset + start
                parts = [c[a : a + m] for c in contributions]
                if self.direct[i]:
                    parts[rank] = ins[i][o : o + m]
                dst = result[a - lo : a - lo + m]
                reduce_in_rank_order(ufunc, parts, dst)
                self._deliver(dst, i, o, m)
        if group:
            np.concatenate(group, out=result[group_at - lo : group_at - lo + group_n])

    def copy_out(self, pieces, peer_result: np.ndarray, start: int) -> None:
        """A peer's reduced portion (its result area, element 0 = chunk element *start*)
        into this rank's outputs."""
        outs, plain, counts = self.outs, self.plain, self.layout.counts
        for i, offset, at, n in pieces:
            src = peer_result[at - start : at - start + n]
            if plain[i]:
                np.copyto(outs[i] if n == counts[i] else outs[i][offset : offset + n], src)
            else:
                self._deliver(src, i, offset, n)

    def _deliver(self, reduced: np.ndarray, i: int, offset: int, n: int) -> None:
        """Reduced values into item *i*'s output (postscaled, cast); nothing when joined."""
        out = self.outs[i]
        if out is None:
            return
        dst = out[offset : offset + n]
        half_casts.copy(dst, reduced, self.layout.post[i])


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
