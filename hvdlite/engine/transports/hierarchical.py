"""Hierarchical allreduce and allgather: inside each node first, then across nodes.

The topology comes from ``basics``: ``local_comm`` holds the ranks of this
rank's node, ``cross_comm`` the ranks that have the same local rank on every
node (so the cross communicator of local rank 0 links the node leaders).
``HVDLITE_TEST_NODE_SIZE=k`` makes both describe simulated nodes of k
consecutive ranks, which is how the tests and the benchmark exercise this on
one machine.

Allreduce, when every node has the same number of ranks L: reduce-scatter the
buffer inside the node (local rank j owns shard j; shards differ by at most one
element), allreduce each shard across nodes over the cross communicator of its
owner's local rank, then allgather the shards inside the node.  Every node cuts
the buffer at the same offsets, so shard j means the same elements everywhere.
When node sizes differ (say 2 + 1 ranks), the cross communicators no longer line
up with shards, so the buffer is reduced to local rank 0, allreduced among the
node leaders and broadcast inside the node.  The cross-node stage sums shards of
1 MB or more around a ring of the nodes (:mod:`~hvdlite.engine.transports.ring`;
``HVDLITE_RING_ALLREDUCE_DISABLE=1`` leaves it to MPI); a sum whose shards are
twice :data:`PIECE_MIN_BYTES` or more is cut into pieces (up to
:data:`PIPELINE_PIECES`, each shard at least :data:`PIECE_MIN_BYTES`) whose in-node
stages run, non-blocking, while the piece before or after crosses the nodes.

Reduce-scatter (nodes of one size): each rank's block of the result is summed in
the node by the rank of its local index, then across the nodes among the ranks of
that index, so values cross between hosts as in the allreduce's first half
(:meth:`Hierarchical.reduce_scatter`; other node layouts stay flat).  Large ones
are cut into pieces (each local rank's share at least
:data:`SCATTER_PIECE_MIN_BYTES`) whose in-node stage runs, non-blocking, while the
piece before crosses the nodes.

Allgather (any node sizes): gather every rank's bytes to its node leader,
directly at their final offsets (through a node-major staging buffer when the
requested layout does not keep a node's ranks together); leaders exchange whole
node blocks; leaders broadcast the complete result inside their node.

With a single node, or one rank per node, both run as one flat collective.

Cross-rank contract: every rank of the job's communicator calls
:meth:`Hierarchical.create` (during ``init``) and then the same sequence of
``allreduce``/``allgatherv`` calls with matching sizes (the engine's ordered
response list guarantees it).  Results equal the flat collective's: exactly for
integers, up to summation order for floats.  Only the engine thread uses the
topology communicators after ``create``.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from ...device.buffers import BufferPool
from ...util.splits import even_split, offsets
from .ring import RING_KINDS, RING_MIN_BYTES, Ring

__all__ = ["Hierarchical", "ScatterPieces"]

log = logging.getLogger("hvdlite")

#: Most pieces a large sum is cut into on the two levels, so that the in-node stages
#: of one piece run while another crosses the nodes (``_pipelined``).
PIPELINE_PIECES = 32
#: The least a rank's shard of a piece holds.  ``bench_multihost_tc``'s float32 MLP
#: step (16 MB, 3 hosts x 2 ranks, 1 Gbit/s) ran faster with every halving from
#: 1 MB to 256 KB: the stages before the first piece's crossing and after the
#: last one's shrink with the piece.
PIECE_MIN_BYTES = 256 << 10
#: The least a local rank's share of a reduce-scatter's piece holds
#: (:meth:`Hierarchical.scatter_piece_count`).  On ``bench_multihost_tc``'s hosts a
#: float32 reduce-scatter of 32 MB ran fastest in 8 to 16 pieces (shares of 2 and
#: 1 MB), slower in 32; float16's 16 MB in 8 pieces beat one piece in every job,
#: where 16 and 32 pieces won in some jobs and lost in others.
SCATTER_PIECE_MIN_BYTES = 1 << 20


class ScatterPieces(NamedTuple):
    """A reduce-scatter's layout in pieces (:meth:`Hierarchical.scatter_pieces`)."""

    cuts: list  # cuts[r][i]: the elements of rank r's block in piece i
    places: list  # places[i][r]: where piece i of rank r's block starts
    piece_at: list  # where each piece starts
    layouts: list  # each piece's (in-node counts, this rank's cross peers' counts)


def _even_split(count: int, parts: int) -> tuple[list[int], list[int]]:
    """Counts and offsets cutting *count* elements into *parts* near-equal shards."""
    counts = even_split(count, parts)
    return counts, offsets(counts)


class Hierarchical:
    """Two-level collectives over a job's node topology (see the module docstring)."""

    def __init__(
        self,
        world,
        local,
        cross,
        nodes: list[tuple[int, ...]],
        *,
        allreduce: bool = True,
        allgather: bool = False,
        ring: bool = False,
    ):
        self.world = world
        self.local = local
        self.cross = cross
        self.nodes = nodes  # world ranks of every node, nodes in leader order
        self.allreduce_enabled = allreduce
        self.allgather_enabled = allgather
        self.local_rank = local.Get_rank()
        self.local_size = local.Get_size()
        self.is_leader = self.local_rank == 0
        sizes = {len(n) for n in nodes}
        self.homogeneous = len(sizes) == 1
        self.calls = {"allreduce": 0, "allgather": 0, "reducescatter": 0}  # tests, diagnostics
        self._pool = BufferPool()
        me = world.Get_rank()
        self.node = next(n for n in nodes if me in n)
        # the cross-node stage of large sums: around a ring of the nodes
        self._cross_ring = Ring(cross) if ring and len(nodes) > 1 else None
        self._grid: list[list[int]] | None = None  # reduce_scatter's layout

    @property
    def cross_ring(self) -> Ring | None:
        """The ring of nodes over the cross communicator (None: ring off, or one node)."""
        return self._cross_ring

    # ---------------------------------------------------------------- creation
    @classmethod
    def create(cls, state) -> Hierarchical:
        """Build the helper from an ``init`` state (collective over ``state.world``)."""
        world, local, cross = state.world, state.local_comm, state.cross_comm
        members = tuple(local.allgather(world.Get_rank()))
        layout = world.allgather((local.Get_rank(), members))
        nodes = sorted((m for lr, m in layout if lr == 0), key=lambda m: m[0])
        cfg = state.config
        helper = cls(
            world,
            local,
            cross,
            nodes,
            allreduce=bool(getattr(cfg, "hierarchical_allreduce", True)),
            allgather=bool(getattr(cfg, "hierarchical_allgather", False)),
            ring=not getattr(cfg, "ring_allreduce_disable", False),
        )
        if world.Get_rank() == 0:
            helper._describe()
        return helper

    def _describe(self) -> None:
        sizes = [len(n) for n in self.nodes]
        if len(self.nodes) == 1:
            log.info(
                "hierarchical collectives: one node of %d ranks, so they run as flat "
                "collectives inside the node",
                sizes[0],
            )
        elif max(sizes) == 1:
            log.info(
                "hierarchical collectives: every node has one rank, so they run as flat "
                "collectives across nodes"
            )
        elif not self.homogeneous and self.allreduce_enabled:
            log.info(
                "hierarchical allreduce: node sizes differ (%s), so each node reduces to "
                "its local rank 0, leaders allreduce, and leaders broadcast in the node "
                "(no intra-node reduce-scatter)",
                sizes,
            )
        else:
            log.info("hierarchical collectives: %d nodes of %d ranks", len(self.nodes), sizes[0])

    # --------------------------------------------------------------- allreduce
    def allreduce(self, buf: np.ndarray, op, src: np.ndarray | None = None) -> None:
        """Reduce across the job with MPI op *op* into the contiguous array *buf*.

        The input is *buf* itself (in place) or, when given, *src*: a contiguous
        array of the same size and dtype, which is left unchanged.
        """
        if not buf.flags.c_contiguous or (src is not None and not src.flags.c_contiguous):
            raise ValueError("hierarchical allreduce needs C-contiguous buffers")
        flat = buf.reshape(-1)
        send = MPI.IN_PLACE if src is None or src is buf else src.reshape(-1)
        self.calls["allreduce"] += 1
        if flat.size == 0:
            return
        if len(self.nodes) == 1:
            self.local.Allreduce(send, flat, op)
        elif self.local_size == 1 and self.homogeneous:
            if send is not MPI.IN_PLACE:
                np.copyto(flat, send)
            self._cross_allreduce(flat, op)
        elif self.homogeneous:
            self._reduce_scatter_scheme(flat if send is MPI.IN_PLACE else send, flat, op)
        else:
            self._leader_scheme(send, flat, op)

    def _reduce_scatter_scheme(self, send: np.ndarray, flat: np.ndarray, op) -> None:
        pieces = self._pieces(flat) if self._sums_around_ring(flat, op) else 1
        if pieces > 1:
            self._pipelined(send, flat, op, pieces)
            return
        counts, offsets = _even_split(flat.size, self.local_size)
        shard = self._pool.get(flat.dtype, counts[self.local_rank])
        even = counts[0] == counts[-1]
        # The block variants are measurably faster in MPICH than the vector ones.
        if even:
            self.local.Reduce_scatter_block(send, shard, op)
        else:
            self.local.Reduce_scatter(send, shard, counts, op)
        self._cross_allreduce(shard, op)
        if even:
            self.local.Allgather(shard, flat)
        else:
            self.local.Allgatherv(shard, [flat, (counts, offsets)])

    def _pieces(self, flat: np.ndarray) -> int:
        """How many pieces to cut a sum of *flat* into whose shards cross the nodes
        around the ring (1 or less: none): as many as keep each piece's shard at least
        :data:`PIECE_MIN_BYTES`, at most :data:`PIPELINE_PIECES` (agreed sizes only:
        every rank cuts alike)."""
        return min(PIPELINE_PIECES, flat.nbytes // (self.local_size * PIECE_MIN_BYTES))

    def _pipelined(self, send: np.ndarray, flat: np.ndarray, op, pieces: int) -> None:
        """The reduce-scatter scheme on *pieces* consecutive pieces of the buffer, the
        in-node stages non-blocking: piece i+1's reduce-scatter and piece i-1's
        allgather move through shared memory while piece i's shard crosses the nodes
        around the ring (each MPI call there also progresses them).  Each element is
        summed in its node, then around the ring of nodes, the same on every rank."""
        local, me = self.local, self.local_rank
        lengths, starts = _even_split(flat.size, pieces)
        splits = [_even_split(n, self.local_size) for n in lengths]
        shard_at = offsets([counts[me] for counts, _ in splits])
        shards_buf = self._pool.get(flat.dtype, shard_at[-1] + splits[-1][0][me])
        shards = [shards_buf[at : at + counts[me]] for at, (counts, _) in zip(shard_at, splits)]

        def reduce_scatter(i: int):
            lo, (counts, _) = starts[i], splits[i]
            piece = send[lo : lo + lengths[i]]
            if counts[0] == counts[-1]:
                return local.Ireduce_scatter_block(piece, shards[i], op)
            return local.Ireduce_scatter(piece, shards[i], counts, op)

        def allgather(i: int):
            lo, (counts, displs) = starts[i], splits[i]
            piece = flat[lo : lo + lengths[i]]
            if counts[0] == counts[-1]:
                return local.Iallgather(shards[i], piece)
            return local.Iallgatherv(shards[i], [piece, (counts, displs)])

        gathers = []
        scatter = reduce_scatter(0)
        for i in range(pieces):
            scatter.Wait()
            if i + 1 < pieces:
                scatter = reduce_scatter(i + 1)
            self._cross_ring.allreduce(shards[i])
            gathers.append(allgather(i))
        MPI.Request.Waitall(gathers)

    def _leader_scheme(self, send, flat: np.ndarray, op) -> None:
        if self.is_leader:
            if self.local_size > 1:
                self.local.Reduce(send, flat, op, root=0)
            elif send is not MPI.IN_PLACE:
                np.copyto(flat, send)
            self._cross_allreduce(flat, op)
        else:
            self.local.Reduce(flat if send is MPI.IN_PLACE else send, None, op, root=0)
        if self.local_size > 1:
            self.local.Bcast(flat, root=0)

    def _cross_allreduce(self, flat: np.ndarray, op) -> None:
        """*flat* reduced in place over the cross communicator: large sums around
        the ring of nodes, the rest by MPI."""
        if self._sums_around_ring(flat, op):
            self._cross_ring.allreduce(flat)
        else:
            self.cross.Allreduce(MPI.IN_PLACE, flat, op)

    def _sums_around_ring(self, flat: np.ndarray, op) -> bool:
        """Whether a sum of *flat* (or of its shards) crosses the nodes around the ring
        of nodes rather than through MPI's allreduce."""
        return (
            self._cross_ring is not None
            and op == MPI.SUM
            and flat.nbytes >= RING_MIN_BYTES
            and flat.dtype.kind in RING_KINDS
        )

    # ----------------------------------------------------------- reduce-scatter
    @property
    def scatters_in_two_levels(self) -> bool:
        """Whether :meth:`reduce_scatter` runs: nodes of one size, several of them,
        more than one rank each."""
        return self.homogeneous and len(self.nodes) > 1 and self.local_size > 1

    def _scatter_grid(self) -> list[list[int]]:
        """Row l: the world ranks of local rank l on every node, in cross-rank order
        (collective the first time: every rank's place in both communicators)."""
        if self._grid is None:
            places = self.world.allgather((self.local_rank, self.cross.Get_rank()))
            grid = [[0] * len(self.nodes) for _ in range(self.local_size)]
            for rank, (local_rank, cross_rank) in enumerate(places):
                grid[local_rank][cross_rank] = rank
            self._grid = grid
        return self._grid

    def scatter_starts(self, counts) -> list[int]:
        """Where each world rank's block (*counts*[r] elements) starts in the layout
        :meth:`reduce_scatter` takes: the blocks of local rank 0 of every node first
        (in cross-rank order), then local rank 1's, and so on."""
        starts, at = [0] * len(counts), 0
        for row in self._scatter_grid():
            for rank in row:
                starts[rank] = at
                at += counts[rank]
        return starts

    def scatter_counts(self, counts) -> tuple[list[int], list[int]]:
        """For world ranks' blocks of *counts* elements in the :meth:`scatter_starts`
        layout: the elements each local rank sums in the node (the blocks of its
        local index on every node), and the elements of each of this rank's cross
        peers' blocks, in cross-rank order."""
        grid = self._scatter_grid()
        in_node = [sum(counts[r] for r in row) for row in grid]
        return in_node, [counts[r] for r in grid[self.local_rank]]

    def scatter_piece_count(self, nbytes: int) -> int:
        """How many pieces a reduce-scatter batch of *nbytes* is cut into
        (:meth:`scatter_pieces`): as many as keep each local rank's share of a piece
        at least :data:`SCATTER_PIECE_MIN_BYTES`, at most :data:`PIPELINE_PIECES`,
        1 at least (agreed sizes only: every rank cuts alike)."""
        share = self.local_size * SCATTER_PIECE_MIN_BYTES
        return max(1, min(PIPELINE_PIECES, nbytes // share))

    def scatter_pieces(self, counts, pieces: int) -> ScatterPieces:
        """The layout :meth:`reduce_scatter` takes for world ranks' blocks of
        *counts* elements cut into *pieces*: each block cut evenly, the pieces one
        after another, each in the :meth:`scatter_starts` layout of its cuts."""
        cuts = [even_split(count, pieces) for count in counts]
        piece_counts = [[rank_cuts[i] for rank_cuts in cuts] for i in range(pieces)]
        piece_at = offsets([sum(c) for c in piece_counts])
        places = [
            [piece_at[i] + start for start in self.scatter_starts(c)]
            for i, c in enumerate(piece_counts)
        ]
        layouts = [self.scatter_counts(c) for c in piece_counts]
        return ScatterPieces(cuts, places, piece_at, layouts)

    def reduce_scatter(self, buf: np.ndarray, plan: ScatterPieces, op) -> np.ndarray:
        """Collective over the job (:attr:`scatters_in_two_levels` only): *buf* holds
        every world rank's block in the layout of *plan* (:meth:`scatter_pieces`);
        returns this rank's block reduced with MPI op *op* over every rank (a
        buffer of the helper's, valid until its next collective).

        In the node, local rank l receives the node's sums of the blocks of the
        ranks of local index l on every node (one reduce-scatter); across nodes,
        those ranks reduce-scatter them (around the ring of nodes for large sums),
        so each value crosses between hosts once per node, as in the two-level
        allreduce's first half.  In pieces, piece i+1's in-node reduce-scatter
        moves (non-blocking) while piece i crosses the nodes.  Every element is
        reduced in its node, then across the nodes, the same on every rank; where
        the order of a float sum across nodes depends on the cut (the ring's blocks,
        or MPI's choice of algorithm by size), so may its last bits."""
        self.calls["reducescatter"] += 1
        if len(plan.layouts) > 1:
            return self._reduce_scatter_in_pieces(buf, plan, op)
        in_node, across = plan.layouts[0]
        shard = self._pool.get(buf.dtype, in_node[self.local_rank], slot=2)
        if len(set(in_node)) == 1:
            self.local.Reduce_scatter_block(buf, shard, op)
        else:
            self.local.Reduce_scatter(buf, shard, in_node, op)
        return self._cross_scatter(shard, across, op)

    def _reduce_scatter_in_pieces(self, buf: np.ndarray, plan: ScatterPieces, op) -> np.ndarray:
        """:meth:`reduce_scatter` piece by piece: piece i+1's in-node
        ``Ireduce_scatter`` moves through shared memory while piece i's shard crosses
        the nodes (each MPI call there also progresses it)."""
        cuts = plan.cuts[self.world.Get_rank()]
        part_at = offsets(cuts)
        part = self._pool.get(buf.dtype, sum(cuts), slot=3)

        def scatter(i: int):  # two shard buffers: piece i's crosses while i+1's fills
            in_node = plan.layouts[i][0]
            piece = buf[plan.piece_at[i] : plan.piece_at[i] + sum(in_node)]
            shard = self._pool.get(buf.dtype, in_node[self.local_rank], slot=4 if i % 2 else 2)
            if len(set(in_node)) == 1:
                return shard, self.local.Ireduce_scatter_block(piece, shard, op)
            return shard, self.local.Ireduce_scatter(piece, shard, in_node, op)

        shard, request = scatter(0)
        for i in range(len(cuts)):
            request.Wait()
            mine = shard
            if i + 1 < len(cuts):
                shard, request = scatter(i + 1)
            out = part[part_at[i] : part_at[i] + cuts[i]]
            self._cross_scatter(mine, plan.layouts[i][1], op, out)
        return part

    def _cross_scatter(self, shard: np.ndarray, across, op, out=None) -> np.ndarray:
        """This rank's share (*across*[cross rank] elements) of *shard* reduced over
        the cross communicator, around the ring of nodes for large sums: into *out*
        where given, else a buffer of the helper's."""
        me = self.cross.Get_rank()
        if self._sums_around_ring(shard, op):
            self._cross_ring.reduce_scatter(shard, across)
            lo = offsets(across)[me]
            if out is None:
                return shard[lo : lo + across[me]]
            out[...] = shard[lo : lo + across[me]]
            return out
        if out is None:
            out = self._pool.get(shard.dtype, across[me], slot=3)
        self.cross.Reduce_scatter(shard, out, across, op)
        return out

    # --------------------------------------------------------------- allgather
    def allgatherv(self, send: np.ndarray, recv: np.ndarray, counts, displs) -> None:
        """Same result as ``world.Allgatherv([send, BYTE], [recv, (counts, displs), BYTE])``.

        *send*/*recv* are uint8 arrays; *counts*/*displs* are bytes per job rank.
        """
        counts = [int(c) for c in counts]
        displs = [int(d) for d in displs]
        self.calls["allgather"] += 1
        if len(self.nodes) == 1:
            self.local.Allgatherv([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE])
            return
        if max(len(n) for n in self.nodes) == 1:
            self.cross.Allgatherv([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE])
            return
        direct = all(
            displs[a] + counts[a] == displs[b]
            for node in self.nodes
            for a, b in zip(node, node[1:], strict=False)
        )
        if direct:
            target, tdispls = recv, displs
        else:
            # Node-major staging layout, so every node's bytes form one block.
            order = [r for node in self.nodes for r in node]
            tdispls = [0] * len(counts)
            acc = 0
            for r in order:
                tdispls[r] = acc
                acc += counts[r]
            target = self._pool.get(np.uint8, acc, slot=1)
        mine = [counts[r] for r in self.node]
        if self.is_leader:
            self.local.Gatherv(
                [send, MPI.BYTE],
                [target, (mine, [tdispls[r] for r in self.node]), MPI.BYTE],
                root=0,
            )
            blocks = [sum(counts[r] for r in node) for node in self.nodes]
            starts = [tdispls[node[0]] for node in self.nodes]
            self.cross.Allgatherv(MPI.IN_PLACE, [target, (blocks, starts), MPI.BYTE])
            if not direct:
                for r, c in enumerate(counts):
                    recv[displs[r] : displs[r] + c] = target[tdispls[r] : tdispls[r] + c]
        else:
            self.local.Gatherv([send, MPI.BYTE], None, root=0)
        if self.local_size > 1:
            self.local.Bcast([recv, MPI.BYTE], root=0)
