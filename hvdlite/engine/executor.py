"""Running agreed responses over MPI on host (numpy) buffers.

Every rank calls :meth:`MPIExecutor.run_batch` with the same batches in the
same order (the engine guarantees it); ranks outside a batch's process set skip
it.  Single tensors move without a copy (MPI reads the caller's array and
writes the output array); fused batches are copied into a persistent buffer,
moved by one collective and copied out, with the pre/post scale factors applied
during the copies.  Which path an allreduce takes (:mod:`hvdlite.engine.transports.shm`,
:mod:`hvdlite.engine.transports.hierarchical` or MPI) is the set's
:class:`~hvdlite.engine.transports.routes.Routes`.  A joined rank (no local entry)
contributes zeros to allreduces, the only kind that runs while a rank of the
set has joined (``messages.JOINABLE``); every other kind's batch has this
rank's entry.  Batches of device
buffers (``Params.device`` other than ``"cpu"``) go to the device path
(:class:`hvdlite.engine.transports.device.DeviceExecutor`), made on the first one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

from .transports.adasum import adasum_allreduce
from ..util.dtypes import reduce_dtype
from ..device.buffers import BufferPool, Reduction
from .messages import Kind, Response
from ..device.packing import (
    NUMPY,
    Gathered,
    Scattered,
    flat_bytes,
    pack,
    pack_bytes,
    pack_rank_major,
    rank_counts,
    reduce_alone,
    unpack,
    unpack_bytes,
    unpack_rank_major,
    unpack_shards,
)
from ..ops import ReduceOp
from .transports.shm import SLOT_BYTES, SharedMemoryAllreduce
from ..util.splits import even_split, offsets
from .transports.staging import Stager
from ..timeline.schema import COLLECTIVE, COPY_IN, COPY_OUT
from .transports.routes import Transport

__all__ = ["MPIExecutor"]

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


def _mpi_allreduce(comm, op) -> Callable:
    """``allreduce(buf, src=None)``: reduce *src* (default: *buf* itself) into *buf*
    across *comm* with MPI op *op*, as the hierarchical helper's ``allreduce`` does."""

    def allreduce(buf: np.ndarray, src: np.ndarray | None = None) -> None:
        comm.Allreduce(MPI.IN_PLACE if src is None or src is buf else src, buf, op)

    return allreduce


class MPIExecutor:
    """Executes batches of OK responses; knows nothing about negotiation."""

    def __init__(
        self,
        lookup: Callable,
        finish: Callable,
        sets,
        router,
        finish_keys: Callable,
        hierarchical=None,
        limit=None,
    ):
        self._lookup = lookup  # key -> local Entry or None (joined / not a member)
        self._finish = finish  # (entry, value) -> None
        # keys -> None: finish the local entries of these keys with their outputs
        self._finish_keys = finish_keys
        self._sets = sets  # the ProcessSetTable: communicators and members
        self._router = router  # the set's Routes: which path each batch takes
        self.hierarchical = hierarchical  # the two-level helper, where enabled
        self._limit = limit  # a WaitLimit for the shared-memory barrier, or None
        self.pool = BufferPool()
        self._shm: dict[int, object] = {}  # set id -> SharedMemoryAllreduce or None
        self._routes: dict[int, object] = {}  # set id -> its Routes
        # The engine's Timeline while one is on (set before each batch), else None.
        self.timeline = None
        self.device = None  # the DeviceExecutor, made by the first device batch

    # ------------------------------------------------------------------ dispatch
    def run_batch(self, batch: list[Response]) -> None:
        params = batch[0].params
        set_id = params.set_id
        comm = self._sets.comm_of(set_id)
        if comm is None:
            return
        if params.device != "cpu":
            self._device_executor().run_batch(batch, comm)
            return
        kind = params.kind
        if kind == Kind.ALLREDUCE:
            if params.op == ReduceOp.ADASUM:
                self._allreduce_adasum(batch, comm)
            else:
                self._allreduce(batch, comm)
        elif kind == Kind.ALLGATHER:
            self._allgather(batch, comm, self._routes_of(set_id).allgather)
        elif kind == Kind.BROADCAST:
            self._broadcast(batch, comm, self._sets.ranks[set_id].index(params.root))
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

    def runners(self, batches: list[list[Response]]) -> list[Callable[[], None]]:
        """One function per batch that runs it as :meth:`run_batch` would, for a plan
        the engine runs again and again (its cached responses).

        A batch of one CPU tensor that is allreduced through MPI in its own dtype
        (a synchronous call's, typically) gets a function with every decision taken
        here, once; any other batch gets :meth:`run_batch` itself.  Collective:
        every rank builds the same plan's runners in the same cycle, because
        deciding the path may make the set's shared-memory window (as the set's
        first allreduce does in :meth:`run_batch`), and a rank that runs the plan
        through :meth:`run_batch` (a timeline is on) must have made it too.
        """
        return [
            self._single_allreduce(batch) or functools.partial(self.run_batch, batch)
            for batch in batches
        ]

    def _single_allreduce(self, batch) -> Callable[[], None] | None:
        if len(batch) != 1:
            return None
        p = batch[0].params
        if (
            p.kind != Kind.ALLREDUCE
            or p.device != "cpu"
            or len(p.dtypes) != 1
            or p.op == ReduceOp.ADASUM
        ):
            return None
        comm = self._sets.comm_of(p.set_id)
        if comm is None:  # not a member: run_batch skips it
            return None
        wire = reduce_dtype(p.dtypes[0])
        count = math.prod(p.shapes[0])
        if (
            wire.str != p.dtypes[0]
            or self._path(p.set_id, comm, count * wire.itemsize) is not Transport.MPI
        ):
            return None
        allreduce = _mpi_allreduce(comm, _MPI_OPS[p.op])
        pre = p.prescale
        post = p.postscale / comm.Get_size() if p.op == ReduceOp.AVERAGE else p.postscale
        key = batch[0].key
        keys = (key,)
        lookup, finish_keys, run_batch = self._lookup, self._finish_keys, self.run_batch

        def run() -> None:
            entry = lookup(key)
            if entry is None:  # a joined rank: the general path contributes its zeros
                run_batch(batch)
                return
            reduce_alone(NUMPY, entry.inputs[0], entry.outputs[0], pre, post, allreduce)
            finish_keys(keys)

        return run

    def stager(self, batches: list[list[Response]]) -> Stager | None:
        """For a plan the engine runs again and again: a
        :class:`~hvdlite.engine.transports.staging.Stager` when the plan's first batch is an
        allreduce that this rank's set reduces through shared memory in one
        chunk, which can then run staged
        (:meth:`SharedMemoryAllreduce.stage`), else None.  Collective as
        :meth:`runners` is (it may make the set's window), and every member
        answers alike."""
        if not batches:
            return None
        batch = batches[0]
        p = batch[0].params
        if (
            p.kind != Kind.ALLREDUCE
            or p.device != "cpu"
            or p.op == ReduceOp.ADASUM
            or (len(p.dtypes) > 1 and _mixed_wire(p.dtypes))
        ):
            return None
        comm = self._sets.comm_of(p.set_id)
        if comm is None:
            return None
        wire = reduce_dtype(p.dtypes[0])
        nbytes = sum(sum(_counts(r.params.shapes)) for r in batch) * wire.itemsize
        if nbytes > SLOT_BYTES or self._path(p.set_id, comm, nbytes) is not Transport.SHARED_MEMORY:
            return None
        return Stager(self, batch, comm.Get_size(), wire, self._shm[p.set_id])

    def use_router(self, router) -> None:
        """Take paths from *router* from the next batch on (autotune: every rank
        switches in the same cycle, so every member of a set picks the same path)."""
        self._router = router
        self._routes.clear()

    def _device_executor(self):
        if self.device is None:
            from .transports.device import DeviceExecutor

            self.device = DeviceExecutor(
                self._lookup,
                self._finish,
                self._finish_keys,
                self._sets,
                self._routes_of,
                self.hierarchical,
            )
        return self.device

    def _routes_of(self, set_id: int):
        try:
            return self._routes[set_id]
        except KeyError:
            routes = self._routes[set_id] = self._router.routes(self._sets.ranks[set_id])
            return routes

    # ----------------------------------------------------------------- allreduce
    def reduction(self, batch, set_size) -> Reduction:
        """Every tensor of the batch, with Average's division folded into the postscale."""
        tensors = Reduction()
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)
            post = p.postscale / set_size if p.op == ReduceOp.AVERAGE else p.postscale
            if entry is None:
                tensors.extend(None, None, None, _counts(p.shapes), p.prescale, post)
            else:
                tensors.extend(
                    entry, entry.inputs, entry.outputs, _counts(p.shapes), p.prescale, post
                )
        return tensors

    def _path(self, set_id: int, comm, nbytes: int) -> Transport:
        """The set's planned allreduce path for *nbytes*.  Where the routes name shared
        memory, the set's first allreduce makes the window (collective); where it
        could not be made, every member falls back to MPI alike."""
        routes = self._routes_of(set_id)
        if routes.allreduce is Transport.SHARED_MEMORY and self._shm_of(set_id, comm) is None:
            return Transport.MPI
        return routes.allreduce_path(nbytes)

    def _allreduce(self, batch, comm) -> None:
        p0 = batch[0].params
        tensors = self.reduction(batch, comm.Get_size())
        if len(p0.dtypes) > 1 and _mixed_wire(p0.dtypes):
            # A group of tensors with different wire dtypes (never fused with other
            # responses): one reduction per wire dtype, in order of first appearance.
            dtypes = list(p0.dtypes)
            wires = [reduce_dtype(d) for d in dtypes]
            for wire in dict.fromkeys(wires):
                index = [i for i, w in enumerate(wires) if w == wire]
                self._allreduce_wire(
                    p0, tensors.subset(index), [dtypes[i] for i in index], wire, comm, None
                )
        else:
            dtypes = [d for response in batch for d in response.params.dtypes]
            # The batch list stands for its layout: the engine reuses it while the
            # response cache is unchanged, so the shared-memory cut is computed once.
            self._allreduce_wire(p0, tensors, dtypes, reduce_dtype(p0.dtypes[0]), comm, batch)
        self.finish_batch(batch)

    def _allreduce_wire(self, p0, tensors: Reduction, dtypes, wire, comm, layout_key) -> None:
        """Reduce *tensors* (of *dtypes*, all reduced in *wire*) on the set's path for
        their size: shared memory, or an MPI / two-level allreduce."""
        path = self._path(p0.set_id, comm, tensors.total() * wire.itemsize)
        tl = self.timeline
        if tl is not None:
            tl.via(path)
        if path is Transport.SHARED_MEMORY:
            self._shm[p0.set_id].allreduce(tensors, wire, p0.op, layout_key=layout_key)
            return
        op = _MPI_OPS[p0.op]  # ReduceOp is an IntEnum: the int finds it
        if path is Transport.HIERARCHICAL:

            def allreduce(buf, src=None):
                self.hierarchical.allreduce(buf, op, src)
        else:
            allreduce = _mpi_allreduce(comm, op)
        # Tensors of the wire dtype that are alone or large are reduced where they
        # are (no copy through the fusion buffer); the rest is fused.  The split
        # depends only on the agreed shapes and dtypes, so it is the same everywhere.
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
            buf = self.pool.get(wire, part.total())
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
            zeros = self.pool.get(wire, tensors.counts[i], slot=2)
            zeros.fill(0)
            allreduce(zeros)
            return
        reduce_alone(NUMPY, inp, out, tensors.prescales[i], tensors.postscales[i], allreduce)

    def _shm_of(self, set_id: int, comm):
        """The shared-memory window of a set, made on first use (collective: every
        member runs the same first allreduce or allgather of the set); None where it
        could not be."""
        try:
            return self._shm[set_id]
        except KeyError:
            shm = self._shm[set_id] = SharedMemoryAllreduce.create(comm, self._limit)
            return shm

    def forget_set(self, set_id: int) -> None:
        """Collective over the set's members: release what was made for it."""
        self._routes.pop(set_id, None)
        if self.device is not None:
            self.device.forget_set(set_id)
        shm = self._shm.pop(set_id, None)
        if shm is not None:
            shm.free()

    def close(self) -> None:
        """Collective (orderly shutdown on every rank): release every shared window."""
        for set_id in list(self._shm):
            self.forget_set(set_id)

    def finish_batch(self, batch) -> None:
        self._finish_keys([response.key for response in batch])

    def _allreduce_adasum(self, batch, comm) -> None:
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
                    np.multiply(
                        result, p.postscale, out=entry.outputs[i].reshape(-1), casting="unsafe"
                    )
            if entry is not None:
                self._finish(entry, None)

    # ----------------------------------------------------------------- allgather
    def _allgather(self, batch, comm, path: Transport) -> None:
        tl = self.timeline
        size = comm.Get_size()
        tensors: list[Gathered] = []
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)  # here: only allreduce runs past a join
            for i, (dt, trailing) in enumerate(zip(p.dtypes, p.shapes)):
                tensors.append(Gathered(entry, entry.inputs[i], trailing, np.dtype(dt)))
        row_bytes = [math.prod(t.trailing) * t.dtype.itemsize for t in tensors]

        def outputs_for(dims):
            return [
                np.empty((int(dims[:, j].sum()),) + tuple(t.trailing), dtype=t.dtype)
                for j, t in enumerate(tensors)
            ]

        dims = None
        shm = (
            self._shm_of(batch[0].params.set_id, comm) if path is Transport.SHARED_MEMORY else None
        )
        if shm is not None:
            if tl is not None:
                tl.via(path)
                tl.phase(COPY_IN)
            dims, outputs = shm.allgather(
                [t.input for t in tensors], row_bytes, outputs_for, None if tl is None else tl.phase
            )
            if outputs is not None:
                self._finish_per_entry([t.entry for t in tensors], outputs)
                return
        # Through MPI (also where a rank's rows did not fit its shared-memory area).
        if path is Transport.SHARED_MEMORY:
            path = Transport.MPI
        if tl is not None:
            tl.via(path)
        if dims is None:
            local = np.array([t.input.shape[0] for t in tensors], dtype=np.int64)
            dims = np.empty((size, len(tensors)), dtype=np.int64)
            comm.Allgather(local, dims)
        outputs = outputs_for(dims)
        if len(tensors) == 1:
            send = flat_bytes(tensors[0].input)
            counts = [int(d) * row_bytes[0] for d in dims[:, 0]]
            self._allgatherv(comm, path, send, flat_bytes(outputs[0]), counts)
        else:
            if tl is not None:
                tl.phase(COPY_IN)
            per_rank = [
                int(sum(int(dims[r, j]) * row_bytes[j] for j in range(len(tensors))))
                for r in range(size)
            ]
            me = comm.Get_rank()
            send = self.pool.get(np.uint8, per_rank[me], slot=0)
            pack_bytes(NUMPY, [t.input for t in tensors], send)
            recv = self.pool.get(np.uint8, sum(per_rank), slot=1)
            if tl is not None:
                tl.phase(COLLECTIVE)
            self._allgatherv(comm, path, send, recv, per_rank)
            if tl is not None:
                tl.phase(COPY_OUT)
            unpack_rank_major(NUMPY, recv, offsets(per_rank), dims, row_bytes, outputs)
        self._finish_per_entry([t.entry for t in tensors], outputs)

    def _allgatherv(self, comm, path: Transport, send, recv, counts) -> None:
        """Byte Allgatherv of *counts* bytes per rank, two-level on the hierarchical path."""
        if path is Transport.HIERARCHICAL:
            self.hierarchical.allgatherv(send, recv, counts, offsets(counts))
        else:
            comm.Allgatherv([send, MPI.BYTE], [recv, (counts, offsets(counts)), MPI.BYTE])

    def _finish_per_entry(self, entries, outputs) -> None:
        """Finish each local entry with the list of its tensors' outputs."""
        results: dict[int, tuple] = {}
        for entry, out in zip(entries, outputs):
            if entry is not None:
                results.setdefault(id(entry), (entry, []))[1].append(out)
        for entry, outs in results.values():
            self._finish(entry, outs)

    # ----------------------------------------------------------------- broadcast
    def _broadcast(self, batch, comm, root: int) -> None:
        pairs = []  # (input, output)
        for response in batch:
            entry = self._lookup(response.key)
            pairs.extend(zip(entry.inputs, entry.outputs))
        _broadcast_pairs(self.pool, pairs, comm, root)
        self.finish_batch(batch)

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
        comm.Alltoallv(
            [flat_bytes(inp), (sc, offsets(sc)), MPI.BYTE],
            [flat_bytes(out), (rc, offsets(rc)), MPI.BYTE],
        )
        self._finish(entry, (out, received))

    # ------------------------------------------------------------- reducescatter
    def _reducescatter(self, batch, comm) -> None:
        size = comm.Get_size()
        op = _MPI_OPS[ReduceOp(batch[0].params.op)]
        tensors: list[Scattered] = []
        for response in batch:
            p = response.params
            entry = self._lookup(response.key)  # here: only allreduce runs past a join
            post = p.postscale / size if p.op == ReduceOp.AVERAGE else p.postscale
            for i, (dt, shape) in enumerate(zip(p.dtypes, p.shapes)):
                tensors.append(
                    Scattered(
                        entry,
                        entry.inputs[i],
                        shape,
                        np.dtype(dt),
                        p.prescale,
                        post,
                        even_split(shape[0], size),
                    )
                )
        # One Reduce_scatter per wire dtype (a grouped call may mix dtypes), in order of
        # first appearance, which is the same on every rank.
        wires = [reduce_dtype(t.dtype.str) for t in tensors]
        outputs: list = [None] * len(tensors)
        for wire in dict.fromkeys(wires):
            index = [j for j, w in enumerate(wires) if w == wire]
            shards = _reduce_scatter_rows(self.pool, [tensors[j] for j in index], wire, op, comm)
            for j, out in zip(index, shards, strict=True):
                outputs[j] = out
        self._finish_per_entry([t.entry for t in tensors], outputs)


@functools.lru_cache(maxsize=1024)
def _counts(shapes: tuple) -> tuple[int, ...]:
    """The element count of each shape (an entry's shapes repeat step after step)."""
    return tuple(math.prod(shape) for shape in shapes)


@functools.lru_cache(maxsize=1024)
def _mixed_wire(dtypes: tuple) -> bool:
    """Whether a grouped entry's dtypes reduce in more than one wire dtype."""
    return len({reduce_dtype(d) for d in dtypes}) > 1


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
