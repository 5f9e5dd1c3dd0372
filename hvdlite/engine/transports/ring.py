"""Sum-allreduce and reduce-scatter around a ring of ranks over MPI point-to-point.

Across hosts the link into a host is what a step waits for.  MPICH's large
allreduce on six ranks of three hosts moved 32 MB into a host for a 16 MB buffer
and ran at about half the link's rate; a ring moves ``2 (N-1)/N`` of the buffer
into each host when every host's ranks sit next to each other on it, and keeps
every link busy at every step (``bench_multihost_tc``).

The ring is a list of the communicator's ranks, its *order*: position ``i`` sends
to position ``i+1`` and receives from ``i-1``.  The router's
:func:`~hvdlite.engine.transports.routes.ring_order` puts the ranks of each node
together, so each node's ring edges cross its link once in and once
out.  The buffer is cut into one block per rank (*counts*, by communicator
rank).  Reduce-scatter: in ``N-1`` steps each position passes on a partial sum,
adding what it receives into its copy of the next block, until the block of
the rank at each position is complete there.  Allgather: ``N-1`` more steps pass
the complete blocks on around the ring.  A reduce-scatter is the first half alone,
on a buffer packed rank-major.

Cross-rank contract: every member of the communicator calls the same function
with the same *order*, counts and dtype, in the same order of calls (the engine's
response list ensures it).  The sum of each element is taken in the order its
partial sum travels (starting after the position that owns its block), the
same on every run with the same ring; every rank ends with the owner's values,
so the ranks agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ...ops import ReduceOp
from ...util.dtypes import reduce_dtype
from ...util.paths import Transport
from ...util.splits import even_split, offsets
from ..messages import Kind
from ...device.packing import NUMPY, pack_rank_major, rank_counts, unpack_shards
from .host import MpiPeer, per_wire_dtype, scattered
from .peer import Context

__all__ = ["Ring", "RingPeer", "RING_MIN_BYTES", "RING_KINDS"]

#: Smallest allreduce (wire bytes) sent around the ring: below it the 2 (N-1)
#: steps' latency costs more than MPI's own algorithms lose on bandwidth.
RING_MIN_BYTES = 1 << 20
#: dtype kinds the ring sums with numpy as MPI would (floats and integers).
RING_KINDS = frozenset("fiu")
_TAG = 0x5249  # "RI": apart from the engine's other point-to-point tags
_SUMS = (ReduceOp.SUM, ReduceOp.AVERAGE)
_KINDS = (Kind.ALLREDUCE, Kind.REDUCESCATTER)


class Ring:
    """A ring over *comm* in *order* (communicator ranks; default: rank order)."""

    def __init__(self, comm, order=None):
        self.comm = comm
        size = comm.Get_size()
        self.order = tuple(order) if order is not None else tuple(range(size))
        if sorted(self.order) != list(range(size)):
            raise ValueError(f"a ring order must list each of the {size} ranks once")
        self.size = size
        self.position = self.order.index(comm.Get_rank())
        self.right = self.order[(self.position + 1) % size]
        self.left = self.order[(self.position - 1) % size]
        self._scratch = np.empty(0, np.uint8)

    @property
    def first_sent(self) -> int:
        """The rank whose block this position sends, unchanged, at the reduce-scatter's
        first step (its own contribution to that block starts the partial sum)."""
        return self.order[(self.position - 1) % self.size]

    def allreduce(self, buf: np.ndarray) -> None:
        """Sum the flat contiguous *buf* over the ring, in place."""
        counts = even_split(buf.size, self.size)
        self.reduce_scatter(buf, counts)
        self.allgather(buf, counts)

    def reduce_scatter(self, buf: np.ndarray, counts, combine: Callable | None = None) -> None:
        """Sum *buf* (rank r's block: *counts*[r] elements from their offset) so
        that this rank's block of *buf* holds the total; the rest of *buf* is left
        with partial sums.

        *combine*, where given, replaces the addition: ``combine(owner, into,
        received, last)`` folds the partial sum *received* for rank *owner*'s
        block into *into* (this rank's copy of that block, sent on at the next
        step), *last* at the final step, where *owner* is this rank."""
        n = self.size
        if n == 1:
            return
        blocks = _blocks(buf, counts)
        widest = max(counts) * buf.itemsize
        if self._scratch.size < widest:
            self._scratch = np.empty(widest, np.uint8)
        for step in range(n - 1):
            # this position sends the block of position p-1-step and adds into p-2-step;
            # after n-1 steps the block of position p itself is complete here
            send = blocks[self.order[(self.position - 1 - step) % n]]
            owner = self.order[(self.position - 2 - step) % n]
            into = blocks[owner]
            received = self._scratch[: into.nbytes].view(buf.dtype)
            self.comm.Sendrecv(send, self.right, _TAG, received, self.left, _TAG)
            if combine is None:
                np.add(into, received, out=into)
            else:
                combine(owner, into, received, step == n - 2)

    def allgather(self, buf: np.ndarray, counts) -> None:
        """Every rank's block of *buf* (its *counts* share) into every rank's *buf*."""
        n = self.size
        if n == 1:
            return
        blocks = _blocks(buf, counts)
        for step in range(n - 1):
            send = blocks[self.order[(self.position - step) % n]]
            into = blocks[self.order[(self.position - 1 - step) % n]]
            self.comm.Sendrecv(send, self.right, _TAG + 1, into, self.left, _TAG + 1)


def _blocks(buf: np.ndarray, counts) -> list[np.ndarray]:
    flat = buf.reshape(-1)
    return [flat[at : at + c] for at, c in zip(offsets(counts), counts)]


class RingPeer(MpiPeer):
    """Large Sum and Average allreduces and reduce-scatters of host arrays around
    the ring of a set whose ranks are on more than one node (its order:
    ``Routes.ring``), fused and copied as on plain MPI."""

    transport = Transport.RING

    def __init__(self, ctx: Context, order):
        super().__init__(ctx)
        self.order = tuple(order)
        self._ring = None

    def accepts(self, p, comm, nbytes: int) -> bool:
        return (
            p.kind in _KINDS
            and p.device == "cpu"
            and p.op in _SUMS
            and nbytes >= RING_MIN_BYTES
            and all(reduce_dtype(d).kind in RING_KINDS for d in p.dtypes)
        )

    def _ring_of(self, comm) -> Ring:
        if self._ring is None or self._ring.comm is not comm:
            self._ring = Ring(comm, self.order)
        return self._ring

    def allreduce_of(self, comm, op) -> Callable:
        ring = self._ring_of(comm)

        def allreduce(buf: np.ndarray, src: np.ndarray | None = None) -> None:
            if src is not None and src is not buf:
                np.copyto(buf, src)
            ring.allreduce(buf.reshape(-1))

        return allreduce

    def _reducescatter(self, batch, comm) -> None:
        ring, pool = self._ring_of(comm), self.ctx.pool
        size, me = comm.Get_size(), comm.Get_rank()

        def scatter(tensors, wire) -> list:
            # each rank's rows of every tensor packed rank-major, summed around the ring
            # in place; this rank's region of the buffer then holds its shards
            counts = rank_counts(tensors, size)
            starts = offsets(counts)
            buf = pool.get(wire, sum(counts), slot=0)
            pack_rank_major(NUMPY, tensors, buf, starts)
            ring.reduce_scatter(buf, counts)
            outputs = [np.empty((t.rows[me],) + tuple(t.shape[1:]), t.dtype) for t in tensors]
            unpack_shards(NUMPY, tensors, buf[starts[me] : starts[me] + counts[me]], me, outputs)
            return outputs

        tensors = scattered(self.ctx, batch, size)
        outputs = per_wire_dtype(tensors, scatter)
        self.ctx.finish_per_entry([t.entry for t in tensors], outputs)
