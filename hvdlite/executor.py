"""Running agreed responses over MPI on host (numpy) buffers.

Every rank calls :meth:`MPIExecutor.run_batch` with the same batches in the
same order (the engine guarantees it); ranks outside a batch's process set skip
it.  Single tensors move without a copy (MPI reads the caller's array and
writes the output array); fused batches are copied into a persistent buffer,
moved by one collective and copied out, with the pre/post scale factors applied
during the copies.  Allreduces of a process set that fits in one node go
through :mod:`hvdlite.shm` instead, unless the whole batch is smaller than
:data:`~hvdlite.shm.SHM_MIN_BYTES` (there MPI's latency is lower).  A
joined rank (no local entry) contributes zeros to reductions and no rows to
allgathers.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .dtypes import reduce_dtype
from .fusion import BufferPool
from .messages import Kind, Response
from .ops import ReduceOp
from .shm import SHM_MIN_BYTES, SharedMemoryAllreduce

__all__ = ["MPIExecutor", "split_rows"]

#: Tensors at least this large are reduced in place instead of through the fusion
#: buffer: for them the two copies cost more than the extra collective call.
_ZERO_COPY_BYTES = 1 << 20

_MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


def _shm_takes(shm, items, wire: np.dtype) -> bool:
    """Whether the set's shared-memory reducer (None: there is none) takes these items.
    Their sizes are agreed, so every rank answers alike."""
    return shm is not None and sum(item[3] for item in items) * wire.itemsize >= SHM_MIN_BYTES


def split_rows(rows: int, parts: int) -> list[int]:
    """Reducescatter's dim-0 split: as even as possible, the first ranks get the remainder."""
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _flat_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def _displacements(counts) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


class MPIExecutor:
    """Executes batches of OK responses; knows nothing about negotiation."""

    def __init__(self, lookup: Callable, finish: Callable, comm_of: Callable,
                 world_rank: int, finish_keys: Callable):
        self._lookup = lookup  # key -> local Entry or None (joined / not a member)
        self._finish = finish  # (entry, value) -> None
        # keys -> None: finish the local entries of these keys with their outputs
        self._finish_keys = finish_keys
        self._comm_of = comm_of  # set_id -> (comm, ranks) or (None, ranks)
        self.world_rank = world_rank
        self.pool = BufferPool()
        self.hierarchical = None  # set by the engine when hierarchical allreduce is on
        self.shared_memory = True  # reduce through shared memory where a set fits a node
        self._shm: dict[int, object] = {}  # set id -> SharedMemoryAllreduce or None

    # ------------------------------------------------------------------ dispatch
    def run_batch(self, batch: list[Response]) -> None:
        params = batch[0].params
        comm, ranks = self._comm_of(params.set_id)
        if comm is None:
            return
        kind = params.kind
        if kind == Kind.ALLREDUCE:
            if params.op == ReduceOp.ADASUM:
                from .adasum import adasum_allreduce

                self._allreduce_adasum(batch, comm, adasum_allreduce)
            else:
                self._allreduce(batch, comm)
        elif kind == Kind.ALLGATHER:
            self._allgather(batch, comm)
        elif kind == Kind.BROADCAST:
            self._broadcast(batch, comm, ranks.index(params.root))
        elif kind == Kind.ALLTOALL:
            self._alltoall(batch[0], comm)
        elif kind == Kind.REDUCESCATTER:
            self._reducescatter(batch, comm)
        elif kind == Kind.BARRIER:
            entry = self._lookup(batch[0].key)
            if entry is not None:
                self._finish(entry, None)
        else:  # pragma: no cover - the engine handles control kinds itself
            raise RuntimeError(f"executor cannot run {Kind(kind).name}")

    # ----------------------------------------------------------------- allreduce
    def _reduction_items(self, batch, set_size):
        """(entry, input, output, count, prescale, postscale) for every tensor of the batch."""
        items = []
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)
            post = p.postscale / set_size if p.op == ReduceOp.AVERAGE else p.postscale
            for i, shape in enumerate(p.shapes):
                if entry is None:
                    items.append((None, None, None, math.prod(shape), p.prescale, post))
                else:
                    items.append((entry, entry.inputs[i], entry.outputs[i], math.prod(shape),
                                  p.prescale, post))
        return items

    def _allreduce(self, batch, comm) -> None:
        p0 = batch[0].params
        wire = reduce_dtype(p0.dtypes[0])
        op = _MPI_OPS[p0.op]  # ReduceOp is an IntEnum: the int finds it
        if len(p0.dtypes) > 1 and any(reduce_dtype(d) != wire for d in p0.dtypes):
            self._allreduce_mixed(batch, comm, op)
            return
        items = self._reduction_items(batch, comm.Get_size())
        hierarchical = self.hierarchical is not None and self.hierarchical.applies(comm)
        shm = None if hierarchical else self._shm_of(p0.set_id, comm)
        if _shm_takes(shm, items, wire):
            # The batch list stands for its layout: the engine reuses it while the
            # response cache is unchanged, so the cut is computed once.
            shm.allreduce(items, wire, p0.op, layout_key=batch)
            self._finish_batch(batch)
            return
        if hierarchical:
            reduce = lambda buf: self.hierarchical.allreduce(buf, op)  # noqa: E731
        else:
            reduce = lambda buf: comm.Allreduce(MPI.IN_PLACE, buf, op)  # noqa: E731
        # Tensors of the wire dtype that are alone or large are reduced where they
        # are (no copy through the fusion buffer); the rest is fused.  The split
        # depends only on the agreed shapes and dtypes, so it is the same everywhere.
        dtypes = [d for response in batch for d in response.params.dtypes]
        alone = len(items) == 1
        fused = []
        for item, dtype in zip(items, dtypes):
            nbytes = item[3] * wire.itemsize
            if dtype == wire.str and (alone or nbytes >= _ZERO_COPY_BYTES):
                self._reduce_in_place(item, wire, op, comm, reduce, hierarchical)
            else:
                fused.append(item)
        if fused:
            buf = self.pool.get(wire, sum(item[3] for item in fused))
            self._copy_in(fused, buf)
            reduce(buf)
            self._copy_out(fused, buf)
        self._finish_batch(batch)

    def _reduce_in_place(self, item, wire, op, comm, reduce, hierarchical) -> None:
        """Reduce one tensor straight into its output, without the fusion buffer."""
        _, inp, out, count, pre, post = item
        if inp is None:  # a joined rank contributes zeros
            zeros = self.pool.get(wire, count, slot=2)
            zeros.fill(0)
            reduce(zeros)
            return
        if pre != 1.0:
            np.multiply(inp, pre, out=out, casting="unsafe")
            reduce(out)
        elif inp is out:
            reduce(out)
        elif hierarchical:
            self.hierarchical.allreduce(out, op, inp)
        else:
            comm.Allreduce(inp, out, op)
        if post != 1.0:
            np.multiply(out, post, out=out, casting="unsafe")

    def _allreduce_mixed(self, batch, comm, op) -> None:
        """A group of tensors with different wire dtypes (never fused with other
        responses): one reduction per wire dtype, in order of first appearance."""
        items = self._reduction_items(batch, comm.Get_size())
        wires = [reduce_dtype(d) for r in batch for d in r.params.dtypes]
        hierarchical = self.hierarchical is not None and self.hierarchical.applies(comm)
        shm = None if hierarchical else self._shm_of(batch[0].params.set_id, comm)
        for wire in dict.fromkeys(wires):
            subset = [item for item, w in zip(items, wires, strict=True) if w == wire]
            if _shm_takes(shm, subset, wire):
                shm.allreduce(subset, wire, ReduceOp(batch[0].params.op))
                continue
            buf = self.pool.get(wire, sum(item[3] for item in subset))
            self._copy_in(subset, buf)
            if hierarchical:
                self.hierarchical.allreduce(buf, op)
            else:
                comm.Allreduce(MPI.IN_PLACE, buf, op)
            self._copy_out(subset, buf)
        self._finish_batch(batch)

    def _shm_of(self, set_id: int, comm):
        """The shared-memory reducer of a set, made on first use (collective: every
        member runs the same first allreduce of the set); None where it does not apply."""
        try:
            return self._shm[set_id]
        except KeyError:
            pass
        shm = None
        if self.shared_memory:
            shm = SharedMemoryAllreduce.create(comm)
        self._shm[set_id] = shm
        return shm

    def forget_set(self, set_id: int) -> None:
        """Collective over the set's members: release what was made for it."""
        shm = self._shm.pop(set_id, None)
        if shm is not None:
            shm.free()

    def close(self) -> None:
        """Collective (orderly shutdown on every rank): release every shared window."""
        for set_id in list(self._shm):
            self.forget_set(set_id)

    @staticmethod
    def _copy_in(items, buf) -> None:
        if all(inp is not None and pre == 1.0 and inp.dtype == buf.dtype
               for _, inp, _, _, pre, _ in items):
            # The common case (no scaling, one dtype): one C call packs every tensor.
            np.concatenate([inp.reshape(-1) for _, inp, _, _, _, _ in items], out=buf)
            return
        offset = 0
        for _, inp, _, count, pre, _ in items:
            view = buf[offset:offset + count]
            offset += count
            if inp is None:
                view.fill(0)
            elif pre != 1.0:
                np.multiply(inp.reshape(-1), pre, out=view, casting="unsafe")
            else:
                np.copyto(view, inp.reshape(-1), casting="unsafe")

    @staticmethod
    def _copy_out(items, buf) -> None:
        offset = 0
        for _, _, out, count, _, post in items:
            view = buf[offset:offset + count]
            offset += count
            if out is None:
                continue
            if post != 1.0:
                np.multiply(view, post, out=out.reshape(-1), casting="unsafe")
            else:
                np.copyto(out.reshape(-1), view, casting="unsafe")

    def _finish_batch(self, batch) -> None:
        self._finish_keys([response.key for response in batch])

    def _allreduce_adasum(self, batch, comm, adasum_allreduce) -> None:
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)
            for i, shape in enumerate(p.shapes):
                if entry is None:
                    data = np.zeros(math.prod(shape), dtype=reduce_dtype(p.dtypes[i]))
                else:
                    data = entry.inputs[i].reshape(-1).astype(np.float64) * p.prescale
                result = adasum_allreduce(comm, data)
                if entry is not None:
                    np.multiply(result, p.postscale, out=entry.outputs[i].reshape(-1),
                                casting="unsafe")
            if entry is not None:
                self._finish(entry, None)

    # ----------------------------------------------------------------- allgather
    def _allgather(self, batch, comm) -> None:
        size = comm.Get_size()
        tensors = []  # (entry, input or None, trailing shape, dtype)
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)
            for i, (dt, trailing) in enumerate(zip(p.dtypes, p.shapes)):
                tensors.append((entry, entry.inputs[i] if entry else None, trailing,
                                np.dtype(dt)))
        local = np.array([t[1].shape[0] if t[1] is not None else 0 for t in tensors],
                         dtype=np.int64)
        dims = np.empty((size, len(tensors)), dtype=np.int64)
        comm.Allgather(local, dims)
        row_bytes = [math.prod(t[2]) * t[3].itemsize for t in tensors]
        outputs = [np.empty((int(dims[:, j].sum()),) + tuple(t[2]), dtype=t[3])
                   for j, t in enumerate(tensors)]
        if len(tensors) == 1:
            inp = tensors[0][1]
            send = _flat_bytes(inp) if inp is not None else np.empty(0, np.uint8)
            counts = [int(d) * row_bytes[0] for d in dims[:, 0]]
            self._allgatherv(comm, send, _flat_bytes(outputs[0]), counts,
                             _displacements(counts))
        else:
            per_rank = [int(sum(int(dims[r, j]) * row_bytes[j] for j in range(len(tensors))))
                        for r in range(size)]
            me = comm.Get_rank()
            send = self.pool.get(np.uint8, per_rank[me], slot=0)
            offset = 0
            for t in tensors:
                if t[1] is not None and t[1].size:
                    nb = t[1].nbytes
                    send[offset:offset + nb] = _flat_bytes(t[1])
                    offset += nb
            recv = self.pool.get(np.uint8, sum(per_rank), slot=1)
            displs = _displacements(per_rank)
            self._allgatherv(comm, send, recv, per_rank, displs)
            row_offsets = [0] * len(tensors)
            for r in range(size):
                offset = displs[r]
                for j in range(len(tensors)):
                    nb = int(dims[r, j]) * row_bytes[j]
                    if nb:
                        out = _flat_bytes(outputs[j])
                        start = row_offsets[j]
                        out[start:start + nb] = recv[offset:offset + nb]
                        row_offsets[j] = start + nb
                        offset += nb
        self._finish_per_entry(tensors, outputs)

    def _allgatherv(self, comm, send, recv, counts, displs) -> None:
        """Byte Allgatherv, two-level when hierarchical allgather applies to *comm*."""
        if self.hierarchical is not None and self.hierarchical.applies(comm, "allgather"):
            self.hierarchical.allgatherv(send, recv, counts, displs)
        else:
            comm.Allgatherv([send, MPI.BYTE], [recv, (counts, displs), MPI.BYTE])

    def _finish_per_entry(self, tensors, outputs) -> None:
        results: dict[int, tuple] = {}
        for (entry, *_), out in zip(tensors, outputs):
            if entry is not None:
                results.setdefault(id(entry), (entry, []))[1].append(out)
        for entry, outs in results.values():
            self._finish(entry, outs)

    # ----------------------------------------------------------------- broadcast
    def _broadcast(self, batch, comm, root: int) -> None:
        is_root = comm.Get_rank() == root
        pairs = []  # (input, output)
        for response in batch:
            entry = self._lookup(response.key)
            for inp, out in zip(entry.inputs, entry.outputs):
                pairs.append((inp, out))
        if len(pairs) == 1:
            inp, out = pairs[0]
            if is_root and inp is not out:
                np.copyto(out, inp)
            comm.Bcast([_flat_bytes(out), MPI.BYTE], root=root)
        else:
            total = sum(out.nbytes for _, out in pairs)
            buf = self.pool.get(np.uint8, total)
            if is_root:
                offset = 0
                for inp, _ in pairs:
                    buf[offset:offset + inp.nbytes] = _flat_bytes(inp)
                    offset += inp.nbytes
            comm.Bcast([buf, MPI.BYTE], root=root)
            offset = 0
            for inp, out in pairs:
                if not (is_root and inp is out):
                    _flat_bytes(out)[...] = buf[offset:offset + out.nbytes]
                offset += out.nbytes
        self._finish_batch(batch)

    # ------------------------------------------------------------------ alltoall
    def _alltoall(self, response, comm) -> None:
        entry = self._lookup(response.key)
        inp = entry.inputs[0]
        trailing = inp.shape[1:]
        row_bytes = math.prod(trailing) * inp.itemsize
        splits = np.ascontiguousarray(entry.splits, dtype=np.int64)
        received = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Alltoall(splits, received)
        out = np.empty((int(received.sum()),) + trailing, dtype=inp.dtype)
        sc = [int(s) * row_bytes for s in splits]
        rc = [int(s) * row_bytes for s in received]
        comm.Alltoallv([_flat_bytes(inp), (sc, _displacements(sc)), MPI.BYTE],
                       [_flat_bytes(out), (rc, _displacements(rc)), MPI.BYTE])
        self._finish(entry, (out, received))

    # ------------------------------------------------------------- reducescatter
    def _reducescatter(self, batch, comm) -> None:
        size = comm.Get_size()
        op = _MPI_OPS[ReduceOp(batch[0].params.op)]
        tensors = []  # (entry, input, shape, dtype, prescale, postscale, rows per rank)
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)
            post = p.postscale / size if p.op == ReduceOp.AVERAGE else p.postscale
            for i, (dt, shape) in enumerate(zip(p.dtypes, p.shapes)):
                tensors.append((entry, entry.inputs[i] if entry else None, shape, np.dtype(dt),
                                p.prescale, post, split_rows(shape[0], size)))
        # One Reduce_scatter per wire dtype (a grouped call may mix dtypes), in order of
        # first appearance, which is the same on every rank.
        wires = [reduce_dtype(t[3].str) for t in tensors]
        outputs: list = [None] * len(tensors)
        for wire in dict.fromkeys(wires):
            index = [j for j, w in enumerate(wires) if w == wire]
            shards = self._reduce_scatter_rows([tensors[j] for j in index], wire, op, comm)
            for j, out in zip(index, shards, strict=True):
                outputs[j] = out
        self._finish_per_entry(tensors, outputs)

    def _reduce_scatter_rows(self, tensors, wire, op, comm) -> list:
        """Reduce *tensors* (all of one wire dtype) and return this rank's dim-0 shards."""
        size, me = comm.Get_size(), comm.Get_rank()
        row_elems = [math.prod(t[2][1:]) for t in tensors]
        counts = [sum(t[6][r] * row_elems[j] for j, t in enumerate(tensors))
                  for r in range(size)]
        send = self.pool.get(wire, sum(counts), slot=0)
        # Rank-major layout: every tensor's rows for rank 0, then for rank 1, ...
        offset = 0
        starts = [0] * len(tensors)
        for r in range(size):
            for j, t in enumerate(tensors):
                n = t[6][r] * row_elems[j]
                view = send[offset:offset + n]
                if t[1] is None:
                    view.fill(0)
                else:
                    src = t[1].reshape(-1)[starts[j]:starts[j] + n]
                    if t[4] != 1.0:
                        np.multiply(src, t[4], out=view, casting="unsafe")
                    else:
                        np.copyto(view, src, casting="unsafe")
                starts[j] += n
                offset += n
        recv = self.pool.get(wire, counts[me], slot=1)
        comm.Reduce_scatter(send, recv, counts, op)
        outputs = []
        offset = 0
        for j, t in enumerate(tensors):
            rows = t[6][me]
            out = np.empty((rows,) + tuple(t[2][1:]), dtype=t[3])
            n = rows * row_elems[j]
            view = recv[offset:offset + n]
            offset += n
            if t[5] != 1.0:
                np.multiply(view, t[5], out=out.reshape(-1), casting="unsafe")
            else:
                np.copyto(out.reshape(-1), view, casting="unsafe")
            outputs.append(out)
        return outputs
