"""Host MPI and the two-level path as peers: every collective on numpy buffers.

:class:`MpiPeer` takes every host batch the peers before it in a set's lineup
left (it is last): single tensors move without a copy (MPI reads the caller's
array and writes the output array); fused batches are copied into a persistent
buffer, moved by one collective and copied out, with the pre/post scale factors
applied during the copies.  :class:`HierarchicalPeer` runs the allreduces and
allgathers the routes send to the two-level helper
(:mod:`~hvdlite.engine.transports.hierarchical`) the same way.

Cross-rank contract: every member of the set runs the same batches in the same
order; a joined rank (no local entry) contributes zeros to allreduces, the only
kind that runs while a rank of the set has joined; every other kind's batch
has this rank's entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from ...device.buffers import BufferPool, Reduction
from ...device.packing import (
    NUMPY,
    Gathered,
    Scattered,
    flat_bytes,
    pack,
    pack_bytes,
    pack_rank_major,
    pack_rank_pieces,
    rank_counts,
    reduce_alone,
    scattered_of,
    unpack,
    unpack_bytes,
    unpack_rank_major,
    unpack_shards,
)
from ...ops import ReduceOp
from ...timeline.schema import COLLECTIVE, COPY_IN, COPY_OUT
from .links import MPI_OPS
from ...util.dtypes import key_of, reduce_dtype
from ...util.paths import Transport
from ...util.splits import offsets
from ..messages import Kind
from .peer import Context, Peer

__all__ = ["MpiPeer", "HierarchicalPeer", "MPI_OPS", "mpi_allreduce", "scattered", "per_wire_dtype"]

#: Tensors at least this large are reduced in place instead of through the fusion
#: buffer: for them the two copies cost more than the extra collective call.
_ZERO_COPY_BYTES = 1 << 20


def mpi_allreduce(comm, op) -> Callable:
    """``allreduce(buf, src=None)``: reduce *src* (default: *buf* itself) into *buf*
    across *comm* with MPI op *op*, as the hierarchical helper's ``allreduce`` does."""

    def allreduce(buf: np.ndarray, src: np.ndarray | None = None) -> None:
        comm.Allreduce(MPI.IN_PLACE if src is None or src is buf else src, buf, op)

    return allreduce


class MpiPeer(Peer):
    """Every host collective through plain MPI on the set's communicator."""

    transport = Transport.MPI
    reduces = True

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def accepts(self, p, comm, nbytes: int) -> bool:
        return True

    def allreduce_of(self, comm, op) -> Callable:
        return mpi_allreduce(comm, op)

    def allgatherv(self, comm, send, recv, counts) -> None:
        """Byte Allgatherv of *counts* bytes per rank."""
        comm.Allgatherv([send, MPI.BYTE], [recv, (counts, offsets(counts)), MPI.BYTE])

    def run(self, batch, comm) -> None:
        kind = batch[0].params.kind
        if kind == Kind.ALLGATHER:
            tensors = gathered(self.ctx, batch)
            self.allgather(tensors, comm, None)
        elif kind == Kind.BROADCAST:
            pairs = []  # (input, output)
            for response in batch:
                entry = self.ctx.lookup(response.key)
                pairs.extend(zip(entry.inputs, entry.outputs))
            p = batch[0].params
            root = self.ctx.sets.ranks[p.set_id].index(p.root)
            _broadcast_pairs(self.ctx.pool, pairs, comm, root)
            self.ctx.finish_batch(batch)
        elif kind == Kind.ALLTOALL:
            self._alltoall(batch[0], comm)
        elif kind == Kind.REDUCESCATTER:
            self._reducescatter(batch, comm)
        elif kind == Kind.BARRIER:
            entry = self.ctx.lookup(batch[0].key)
            if entry is not None:
                self.ctx.finish(entry, None)
        else:  # pragma: no cover - the engine handles control kinds itself
            raise RuntimeError(f"the MPI transport cannot run {Kind(kind).name}")

    # ----------------------------------------------------------------- allreduce
    def reduce(self, p0, tensors: Reduction, dtypes, wire, comm, layout_key) -> None:
        """Reduce *tensors* (of *dtypes*, all reduced in *wire*): those of the wire
        dtype that are alone or large where they are (no copy through the fusion
        buffer), the rest fused.  The split depends only on the agreed shapes and
        dtypes, so it is the same everywhere."""
        tl = self.ctx.timeline
        if tl is not None:
            tl.via(self.transport)
        allreduce = self.allreduce_of(comm, MPI_OPS[p0.op])  # ReduceOp is an IntEnum
        alone = len(tensors) == 1
        fused = []
        for i, dtype in enumerate(dtypes):
            nbytes = tensors.counts[i] * wire.itemsize
            if dtype == wire.str and (alone or nbytes >= _ZERO_COPY_BYTES):
                if tl is not None:
                    tl.phase(COLLECTIVE)
                self._reduce_in_place(tensors, i, wire, allreduce)
            else:
                fused.append(i)
        if fused:
            part = tensors if len(fused) == len(tensors) else tensors.subset(fused)
            if tl is not None:
                tl.phase(COPY_IN)
            buf = self.ctx.pool.get(wire, part.total())
            pack(NUMPY, part, buf)
            if tl is not None:
                tl.phase(COLLECTIVE)
            allreduce(buf)
            if tl is not None:
                tl.phase(COPY_OUT)
            unpack(NUMPY, part, buf)

    def _reduce_in_place(self, tensors: Reduction, i: int, wire, allreduce) -> None:
        """Reduce tensor *i* straight into its output, without the fusion buffer."""
        inp, out = tensors.inputs[i], tensors.outputs[i]
        if inp is None:  # a joined rank contributes zeros
            zeros = self.ctx.pool.get(wire, tensors.counts[i], slot=2)
            zeros.fill(0)
            allreduce(zeros)
            return
        reduce_alone(NUMPY, inp, out, tensors.prescales[i], tensors.postscales[i], allreduce)

    # ----------------------------------------------------------------- allgather
    def allgather(self, tensors: list[Gathered], comm, dims) -> None:
        """Allgather *tensors*; *dims* (rows per rank and tensor) where already known."""
        ctx, tl = self.ctx, self.ctx.timeline
        size = comm.Get_size()
        if tl is not None:
            tl.via(self.transport)
        if dims is None:
            local = np.array([t.input.shape[0] for t in tensors], dtype=np.int64)
            dims = np.empty((size, len(tensors)), dtype=np.int64)
            comm.Allgather(local, dims)
        row_bytes = [math.prod(t.trailing) * t.dtype.itemsize for t in tensors]
        outputs = outputs_for(tensors, dims)
        if len(tensors) == 1:
            send = flat_bytes(tensors[0].input)
            counts = [int(d) * row_bytes[0] for d in dims[:, 0]]
            self.allgatherv(comm, send, flat_bytes(outputs[0]), counts)
        else:
            if tl is not None:
                tl.phase(COPY_IN)
            per_rank = [
                int(sum(int(dims[r, j]) * row_bytes[j] for j in range(len(tensors))))
                for r in range(size)
            ]
            send = ctx.pool.get(np.uint8, per_rank[comm.Get_rank()], slot=0)
            pack_bytes(NUMPY, [t.input for t in tensors], send)
            recv = ctx.pool.get(np.uint8, sum(per_rank), slot=1)
            if tl is not None:
                tl.phase(COLLECTIVE)
            self.allgatherv(comm, send, recv, per_rank)
            if tl is not None:
                tl.phase(COPY_OUT)
            unpack_rank_major(NUMPY, recv, offsets(per_rank), dims, row_bytes, outputs)
        ctx.finish_per_entry([t.entry for t in tensors], outputs)

    # ------------------------------------------------------------------ alltoall
    def _alltoall(self, response, comm) -> None:
        entry = self.ctx.lookup(response.key)
        inp = entry.inputs[0]
        trailing = inp.shape[1:]
        row_bytes = math.prod(trailing) * inp.itemsize
        splits = np.ascontiguousarray(entry.splits, dtype=np.int64)
        received = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Alltoall(splits, received)
        out = np.empty((int(received.sum()),) + trailing, dtype=inp.dtype)
        sc = [int(s) * row_bytes for s in splits]
        rc = [int(s) * row_bytes for s in received]
        comm.Alltoallv(
            [flat_bytes(inp), (sc, offsets(sc)), MPI.BYTE],
            [flat_bytes(out), (rc, offsets(rc)), MPI.BYTE],
        )
        self.ctx.finish(entry, (out, received))

    # ------------------------------------------------------------- reducescatter
    def _reducescatter(self, batch, comm) -> None:
        op = MPI_OPS[ReduceOp(batch[0].params.op)]
        tensors = scattered(self.ctx, batch, comm.Get_size())
        outputs = per_wire_dtype(
            tensors, lambda part, wire: _reduce_scatter_rows(self.ctx.pool, part, wire, op, comm)
        )
        self.ctx.finish_per_entry([t.entry for t in tensors], outputs)


class HierarchicalPeer(MpiPeer):
    """The allreduces, allgathers and reduce-scatters of *kinds* through the
    two-level helper (in the node, across nodes, in the node), fused and copied as
    on plain MPI; reduce-scatters only where the helper runs them in two levels
    (nodes of one size), others go on to the next peer."""

    transport = Transport.HIERARCHICAL

    def __init__(self, ctx: Context, helper, kinds: frozenset):
        super().__init__(ctx)
        self.helper = helper
        self.kinds = kinds

    def accepts(self, p, comm, nbytes: int) -> bool:
        if p.kind == Kind.REDUCESCATTER:
            return p.kind in self.kinds and self.helper.scatters_in_two_levels
        return p.kind in self.kinds

    def _reducescatter(self, batch, comm) -> None:
        """Each rank's rows of every tensor packed in the helper's layout, reduced in
        two levels; this rank's block then holds its shards."""
        helper, pool, me = self.helper, self.ctx.pool, comm.Get_rank()
        op = MPI_OPS[ReduceOp(batch[0].params.op)]

        def scatter(tensors, wire) -> list:
            counts = rank_counts(tensors, comm.Get_size())
            buf = pool.get(wire, sum(counts), slot=0)
            pieces = helper.scatter_piece_count(buf.nbytes)
            plan = helper.scatter_pieces(counts, pieces)
            pack_rank_pieces(NUMPY, tensors, buf, plan.cuts, plan.places)
            mine = helper.reduce_scatter(buf, plan, op)
            outputs = [np.empty((t.rows[me],) + tuple(t.shape[1:]), t.dtype) for t in tensors]
            unpack_shards(NUMPY, tensors, mine, me, outputs)
            return outputs

        tensors = scattered(self.ctx, batch, comm.Get_size())
        outputs = per_wire_dtype(tensors, scatter)
        self.ctx.finish_per_entry([t.entry for t in tensors], outputs)

    def allreduce_of(self, comm, op) -> Callable:
        helper = self.helper

        def allreduce(buf, src=None):
            helper.allreduce(buf, op, src)

        return allreduce

    def allgatherv(self, comm, send, recv, counts) -> None:
        self.helper.allgatherv(send, recv, counts, offsets(counts))


def gathered(ctx: Context, batch) -> list[Gathered]:
    """The tensors of an allgather batch (only allreduce runs past a join: every
    entry is here)."""
    tensors = []
    for response in batch:
        p = response.params
        entry = ctx.lookup(response.key)
        for i, (dt, trailing) in enumerate(zip(p.dtypes, p.shapes)):
            tensors.append(Gathered(entry, entry.inputs[i], trailing, np.dtype(dt)))
    return tensors


def scattered(ctx: Context, batch, size: int) -> list[Scattered]:
    """The tensors of a reducescatter batch over a set of *size* (only allreduce runs
    past a join: every entry is here)."""
    return scattered_of(batch, [ctx.lookup(response.key) for response in batch], size)


def per_wire_dtype(tensors: list[Scattered], reduce_part: Callable) -> list:
    """Each tensor's shard, from ``reduce_part(tensors, wire)`` called once per wire
    dtype (a grouped call may mix dtypes), in order of first appearance: the same
    on every rank."""
    wires = [reduce_dtype(key_of(t.dtype)) for t in tensors]
    outputs: list = [None] * len(tensors)
    for wire in dict.fromkeys(wires):
        index = [j for j, w in enumerate(wires) if w == wire]
        shards = reduce_part([tensors[j] for j in index], wire)
        for j, out in zip(index, shards, strict=True):
            outputs[j] = out
    return outputs


def outputs_for(tensors: list[Gathered], dims) -> list[np.ndarray]:
    """The result arrays of an allgather with *dims* rows per rank and tensor."""
    return [
        np.empty((int(dims[:, j].sum()),) + tuple(t.trailing), dtype=t.dtype)
        for j, t in enumerate(tensors)
    ]


def _reduce_scatter_rows(pool: BufferPool, tensors: list[Scattered], wire, op, comm) -> list:
    """Reduce *tensors* (all of one wire dtype) and return this rank's dim-0 shards."""
    size, me = comm.Get_size(), comm.Get_rank()
    counts = rank_counts(tensors, size)
    if len(tensors) == 1 and tensors[0].dtype == wire and tensors[0].prescale == 1.0:
        # One tensor of the wire dtype: its rows are already rank-major, so MPI reads
        # it and writes this rank's shard where it belongs (no pack, no fusion buffer).
        t = tensors[0]
        out = np.empty((t.rows[me],) + tuple(t.shape[1:]), dtype=t.dtype)
        comm.Reduce_scatter(t.input.reshape(-1), out.reshape(-1), counts, op)
        if t.postscale != 1.0:
            np.multiply(out, t.postscale, out=out, casting="unsafe")
        return [out]
    send = pool.get(wire, sum(counts), slot=0)
    pack_rank_major(NUMPY, tensors, send, offsets(counts))
    recv = pool.get(wire, counts[me], slot=1)
    comm.Reduce_scatter(send, recv, counts, op)
    outputs = [np.empty((t.rows[me],) + tuple(t.shape[1:]), dtype=t.dtype) for t in tensors]
    unpack_shards(NUMPY, tensors, recv, me, outputs)
    return outputs


def _broadcast_pairs(pool: BufferPool, pairs, comm, root: int) -> None:
    """Broadcast each (input, output) pair from *root*: one alone in place, several
    packed into one byte buffer."""
    is_root = comm.Get_rank() == root
    if len(pairs) == 1:
        inp, out = pairs[0]
        if is_root and inp is not out:
            np.copyto(out, inp)
        comm.Bcast([flat_bytes(out), MPI.BYTE], root=root)
        return
    buf = pool.get(np.uint8, sum(out.nbytes for _, out in pairs))
    if is_root:
        pack_bytes(NUMPY, [inp for inp, _ in pairs], buf)
    comm.Bcast([buf, MPI.BYTE], root=root)
    skip = {i for i, (inp, out) in enumerate(pairs) if is_root and inp is out}
    unpack_bytes(NUMPY, buf, [out for _, out in pairs], skip)
