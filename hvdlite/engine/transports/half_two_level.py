"""float16 and bfloat16 allreduces in two levels: summed inside each node, then
16 bits per value across nodes.

Where hierarchical allreduce is on (``HVDLITE_HIERARCHICAL_ALLREDUCE=1``, or
autotune's setting) and the job's nodes hold more than one rank, this peer takes
the Sum and Average batches the flat 16-bit wire
(:mod:`~hvdlite.engine.transports.half_wire`) would take.  The flat wire sends
every rank's values across the links, so a host of L ranks sends L times what
one rank does; here each host's values cross once, as one 16-bit partial sum
per node.  The exchanges are the flat wire's own (:func:`sum_in_float32`,
:func:`allgather_halves`), run on the two-level helper's communicators
(:mod:`~hvdlite.engine.transports.hierarchical`):

1. in the node: the batch is cut into one shard per local rank (where node sizes
   differ, the node leader takes it all); each rank sends each local rank its
   shard as 16 bits, and the owner widens the node's contributions to float32,
   multiplies each by its tensor's prescale, adds them in local-rank order and
   rounds the node's partial sum to 16 bits;
2. across nodes, among the owners of the same shard (the cross communicator):
   the flat wire's rounded-once sum of the node partials, whose 16-bit values
   cross between hosts: widened, added in float32 in node order (nodes ordered
   by their lowest rank), multiplied by the postscale and rounded to 16 bits;
   then the 16-bit shards go round the nodes (the helper's ring of nodes, or
   MPI's ``Allgatherv`` where the ring is off);
3. in the node: one ``Allgatherv`` of the 16-bit shards.

On nodes of one size, a batch whose shards hold at least twice
:data:`PIECE_MIN_BYTES` is cut into pieces (at most
:data:`~hvdlite.engine.transports.hierarchical.PIPELINE_PIECES`) that go
through the three stages in turn, the in-node exchanges of the pieces before
and after one (``Ialltoallv``, ``Iallgatherv``) moving while it crosses the
nodes, as the 32-bit two-level path does.  Each value meets the same sums in
the same order: the bits do not depend on the cut.

Reduce-scatters (Sum or Average, nodes of one size: the helper's
``scatters_in_two_levels``) take stages 1 and 2 alone, packed in the helper's
layout (:meth:`~hvdlite.engine.transports.hierarchical.Hierarchical.scatter_starts`):
in the node, local rank l sums the rows of the ranks of local index l on every
node, rounded to 16 bits; across nodes, those ranks sum the node partials and
round again.  Each host's values cross once, as 16 bits, where MPI's two-level
reduce-scatter of a float32 copy carries 4 bytes per value; on nodes of
different sizes the flat wire takes them.  Large ones go in pieces, as the
helper cuts its own reduce-scatters
(:meth:`~hvdlite.engine.transports.hierarchical.Hierarchical.scatter_pieces`):
piece i+1's in-node ``Ialltoallv`` moves while piece i crosses the nodes, with
the bits of one piece.

The rounding rule, then: a value is rounded twice, once as part of its node's
partial sum and once as the total.  In numpy, for nodes ``k`` of ranks
``r0 < r1 < ...``::

    node[k] = (x[r0].astype(f32) * pre + x[r1].astype(f32) * pre + ...).astype(half)
    result  = ((node[0].astype(f32) + node[1].astype(f32) + ...) * post).astype(half)

(each sum left to right, narrowing to nearest even; Average's division is in
``post``).  With one rank per node the node partial would be one more rounding
for nothing, so this peer steps aside there and the flat wire's rounded-once
rule holds.  ``HVDLITE_HALF_SUMS_PER_HOP`` concerns the flat wire's ring only.

Cross-rank contract: every rank of the job runs the same batches in the same
order (the engine's response list ensures it); the route sends only the whole
job's set here, whose topology the helper describes.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ...device.buffers import Reduction
from ...device.packing import rank_counts
from ...timeline.schema import COLLECTIVE, COPY_IN, COPY_OUT
from ...util.paths import Transport
from ...util.splits import even_split, offsets
from ..messages import Kind
from .half_wire import (
    HalfWirePeer,
    add_in_float32,
    allgather_halves,
    exchange_halves,
    pack_halves,
    packed_row_pieces,
    part_postscaler,
    postscaler,
    prescaler,
    sum_in_float32,
    unpack_halves,
)
from .hierarchical import PIPELINE_PIECES
from .peer import Context

__all__ = ["HalfTwoLevelPeer", "PIECE_MIN_BYTES"]

#: The least a local rank's shard of a piece holds where a batch is cut into
#: pieces (:meth:`HalfTwoLevelPeer.pieces`): half the 32-bit ring's threshold,
#: which ``bench_multihost_tc``'s fp16 MLP step measured faster than whole
#: megabytes (with 16 bits a piece carries twice the values).
PIECE_MIN_BYTES = 512 << 10


class HalfTwoLevelPeer(HalfWirePeer):
    """float16 and bfloat16 Sum and Average allreduces of the whole job's host
    arrays: in the node in float32, across nodes as 16 bits (module docstring)."""

    transport = Transport.HALF_TWO_LEVEL

    def __init__(self, ctx: Context, helper):
        super().__init__(ctx)
        self.helper = helper  # the two-level helper: node and cross communicators
        nodes = helper.nodes
        #: two levels are worth it: several nodes, and a node with more than one rank
        self.useful = len(nodes) > 1 and max(len(n) for n in nodes) > 1
        #: values and bytes this rank received over the cross communicator (from
        #: other nodes), for tests and diagnostics
        self.received_across = {"values": 0, "bytes": 0}

    def accepts(self, p, comm, nbytes: int) -> bool:
        if p.kind == Kind.REDUCESCATTER and not self.helper.scatters_in_two_levels:
            return False  # nodes of different sizes: the flat wire takes it
        return self.useful and super().accepts(p, comm, nbytes)

    def _scattered_part(self, comm, tensors, half) -> np.ndarray:
        """This rank's part of a reduce-scatter batch over the job, in two levels:
        each node's partial sums rounded, then the total (module docstring).  Large
        batches go in pieces (the helper's ``scatter_piece_count``): piece i+1's
        in-node ``Ialltoallv`` moves through shared memory while piece i crosses
        the nodes, as in :meth:`_in_pieces`; each value meets the same sums in the
        same order as in one piece: the same bits."""
        pool, helper = self.ctx.pool, self.helper
        me, local_rank = helper.world.Get_rank(), helper.local_rank
        cross = helper.cross
        nodes, at = cross.Get_size(), cross.Get_rank()
        counts = rank_counts(tensors, helper.world.Get_size())
        pieces = helper.scatter_piece_count(sum(counts) * half.itemsize)
        plan = helper.scatter_pieces(counts, pieces)
        cuts, layouts, piece_at = plan.cuts[me], plan.layouts, plan.piece_at
        send, pre = packed_row_pieces(pool, tensors, half, plan.cuts, plan.places)
        shards = pool.get(half, max(in_node[local_rank] for in_node, _ in layouts), slot=4)
        part = pool.get(half, counts[me], slot=7)
        part_at = offsets(cuts)

        def exchange(i: int):  # two receive buffers: piece i's is read while i+1's fills
            piece = send[piece_at[i] : piece_at[i] + sum(layouts[i][0])]
            slot = 1 if i % 2 else 8
            return exchange_halves(helper.local, pool, piece, layouts[i][0], slot, True)

        received, request = exchange(0)
        for i, (in_node, across) in enumerate(layouts):
            request.Wait()
            mine = received
            if i + 1 < len(layouts):
                received, request = exchange(i + 1)
            lo = piece_at[i] + offsets(in_node)[local_rank]
            shard = shards[: in_node[local_rank]]
            # the node's partial sums of this piece's rows of this local index, rounded
            add_in_float32(helper.local, pool, mine, in_node, pre, lo, shard)
            out = part[part_at[i] : part_at[i] + cuts[i]]
            post = part_postscaler(tensors, me, offsets(across)[at] - part_at[i])
            sum_in_float32(cross, pool, shard, across, None, out, post, slots=(6, 2, 3))
            self.received_across["values"] += (nodes - 1) * out.size
            self.received_across["bytes"] += (nodes - 1) * out.nbytes
        return part

    def node_counts(self, total: int) -> list[int]:
        """The shard of each local rank: even where every node has the same size,
        else the whole batch at the node leader."""
        helper = self.helper
        if helper.homogeneous:
            return even_split(total, helper.local_size)
        return [total] + [0] * (helper.local_size - 1)

    def pieces(self, total: int, half) -> int:
        """How many pieces a batch of *total* values is cut into (1: none): as many
        as keep each local rank's shard of a piece at least :data:`PIECE_MIN_BYTES`,
        at most :data:`PIPELINE_PIECES`, on nodes of one size (agreed sizes only:
        every rank cuts alike)."""
        helper = self.helper
        if not helper.homogeneous:
            return 1
        shard_bytes = total * np.dtype(half).itemsize // helper.local_size
        return max(1, min(PIPELINE_PIECES, shard_bytes // PIECE_MIN_BYTES))

    def reduce(self, p0, tensors: Reduction, dtypes, wire, comm, layout_key) -> None:
        tl, pool, helper = self.ctx.timeline, self.ctx.pool, self.helper
        if tl is not None:
            tl.via(self.transport)
            tl.phase(COPY_IN)
        half = np.dtype(dtypes[0])  # float16 or bfloat16, the same for the batch
        total = tensors.total()
        alone = len(tensors) == 1 and tensors.inputs[0] is not None
        if alone:
            send = tensors.inputs[0].reshape(-1)
        else:
            send = pool.get(half, total, slot=0)
            pack_halves(tensors, send)
        out = tensors.outputs[0]
        direct = alone and out is not None and out.flags.c_contiguous
        result = out.reshape(-1) if direct else pool.get(half, total, slot=5)
        pieces = self.pieces(total, half)
        if pieces > 1:
            self._in_pieces(tensors, send, result, half, pieces)
        else:
            counts = self.node_counts(total)
            starts = offsets(counts)
            lo = starts[helper.local_rank]
            shard = pool.get(half, counts[helper.local_rank], slot=4)
            # the node's partial sum, rounded once
            sum_in_float32(helper.local, pool, send, counts, prescaler(tensors), shard, timeline=tl)
            if shard.size:  # where node sizes differ, the leader's alone
                self._across_nodes(tensors, shard, lo, half)
            allgather_halves(helper.local, shard, result, counts, starts)
        if tl is not None:
            tl.phase(COPY_OUT)
        if not direct:
            unpack_halves(tensors, result)

    def _in_pieces(self, tensors: Reduction, send, result, half, pieces: int) -> None:
        """The three stages on *pieces* consecutive pieces of the batch, the in-node
        exchanges non-blocking: piece i+1's ``Ialltoallv`` and piece i-1's
        ``Iallgatherv`` move through shared memory while piece i crosses the nodes
        (the MPI calls there also progress them).  Every value is summed as in one
        piece: the same bits."""
        pool, helper, tl = self.ctx.pool, self.helper, self.ctx.timeline
        local, me = helper.local, helper.local_rank
        lengths = even_split(send.size, pieces)
        piece_at = offsets(lengths)
        splits = [even_split(n, helper.local_size) for n in lengths]
        shard_at = offsets([counts[me] for counts in splits])
        shards_buf = pool.get(half, shard_at[-1] + splits[-1][me], slot=4)
        shards = [shards_buf[at : at + c[me]] for at, c in zip(shard_at, splits, strict=True)]
        pre = prescaler(tensors)

        def exchange(i: int):  # two receive buffers: piece i's is read while i+1's fills
            piece = send[piece_at[i] : piece_at[i] + lengths[i]]
            return exchange_halves(local, pool, piece, splits[i], 1 if i % 2 else 8, True)

        def scale_from(base: int):
            return None if pre is None else (lambda values, lo: pre(values, base + lo))

        if tl is not None:
            tl.phase(COLLECTIVE)
        gathers = []
        received, request = exchange(0)
        for i in range(pieces):
            request.Wait()
            mine = received
            if i + 1 < pieces:
                received, request = exchange(i + 1)
            starts = offsets(splits[i])
            # the node's partial sum, rounded once
            add_in_float32(
                local, pool, mine, splits[i], scale_from(piece_at[i]), starts[me], shards[i]
            )
            self._across_nodes(tensors, shards[i], piece_at[i] + starts[me], half)
            piece = result[piece_at[i] : piece_at[i] + lengths[i]].view(np.uint16)
            layout = (splits[i], starts)
            gathers.append(local.Iallgatherv(shards[i].view(np.uint16), [piece, layout]))
        MPI.Request.Waitall(gathers)

    def _across_nodes(self, tensors: Reduction, shard: np.ndarray, lo: int, half) -> None:
        """*shard* (the node partials of values lo.. of the batch) summed over the
        cross communicator in place: 16 bits per value between nodes, added in
        float32 in node order, post-scaled, rounded once."""
        pool, cross = self.ctx.pool, self.helper.cross
        nodes, me = cross.Get_size(), cross.Get_rank()
        counts = even_split(shard.size, nodes)
        starts = offsets(counts)
        mine = counts[me]
        part = pool.get(half, mine, slot=7)
        post = postscaler(tensors)
        after = None if post is None else (lambda values, at: post(values, lo + at))
        sum_in_float32(cross, pool, shard, counts, None, part, after, slots=(6, 2, 3))
        allgather_halves(cross, part, shard, counts, starts, self.helper.cross_ring)
        # from other nodes: their values of this part, then the other parts whole
        self.received_across["values"] += (nodes - 1) * mine + (shard.size - mine)
        self.received_across["bytes"] += (nodes - 1) * part.nbytes + shard.nbytes - part.nbytes
