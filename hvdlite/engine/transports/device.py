"""Device buffers as peers: NCCL, CUDA-aware MPI and staging through host memory.

A set's lineup starts with its device peers (:func:`device_peers`, one per
transport its :class:`~hvdlite.device.selection.DeviceRoutes` name); the one
that takes a batch (``Params.device`` other than ``"cpu"``; fusion never mixes
devices, so a batch is all one device) runs it through
:meth:`DeviceExecutor.run_batch` over its transport's link.  For a batch:

1. the backend's stream waits for the producers' ready marks (after any
   result arrays are allocated on the producers' streams);
2. allreduce: tensors of one wire dtype are packed into the device fusion
   buffer (prescaled), reduced by one collective of the set's link, unpacked
   (postscaled; Average's division is folded into the postscale); a lone
   tensor of the wire dtype is reduced where it is; allgather and
   reducescatter pad every rank's block to the largest so that every link
   (NCCL included) moves equal blocks; broadcast packs several tensors into
   one buffer; alltoall moves bytes with the counts exchanged over MPI;
3. the producers' streams wait for the engine stream, then the handles finish.

Which link a set uses is its :class:`~hvdlite.device.selection.DeviceRoutes`
(per collective); links are made on first use, collectively (every member of
the set runs the same batches in the same order).

Cross-rank contract: every member of the set runs the same batches in the same
order (the engine guarantees it); a joined rank (no local entry) contributes
zeros to allreduces, the only kind that runs while a rank has joined, as on
the host path.
"""

from __future__ import annotations

import collections
import math

import numpy as np

from .adasum import adasum_allreduce
from ...device.buffers import Reduction
from ..messages import Kind
from ...device.packing import (
    scattered_of,
    Gathered,
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
from ...ops import ReduceOp
from .routes import Transport
from ...device.arrays import CUDA
from .links import HierarchicalLink, MpiLink, StagedLink
from ...device.registry import backend as backend_of
from ...device.selection import OPERATIONS, DeviceRoutes
from .peer import Peer

__all__ = ["DeviceExecutor", "DevicePeer", "STAGED_ROUTES", "device_peers"]

#: The routes of a set the router made without device knowledge.
STAGED_ROUTES = DeviceRoutes(*([Transport.STAGED] * 6))


class DeviceExecutor:
    """Executes batches of OK device responses; knows nothing about negotiation."""

    def __init__(self, lookup, finish, finish_keys, sets, routes_of, hierarchical=None):
        self._lookup = lookup  # key -> local Entry or None (joined)
        self._finish = finish  # (entry, value) -> None
        self._finish_keys = finish_keys  # keys -> None (finish with their outputs)
        self._sets = sets
        self._routes_of = routes_of  # set id -> Routes
        self._hierarchical = hierarchical  # the engine's two-level helper (comms), or None
        self._links: dict = {}
        #: link name -> batches it ran (diagnostics and tests)
        self.used: collections.Counter = collections.Counter()

    # ------------------------------------------------------------------ dispatch
    def run_batch(self, batch, comm, transport: Transport) -> None:
        """Run *batch* over *transport*'s link (the set's routes name it for the
        batch's collective; NCCL may still fall back to the routes' MPI path)."""
        p0 = batch[0].params
        backend = backend_of(p0.device)
        entries = [self._lookup(response.key) for response in batch]
        present = [e for e in entries if e is not None]
        routes = self._routes_of(p0.set_id).device or STAGED_ROUTES
        with backend.activate(next((e.inputs for e in present if e.inputs), ())):
            results = self._run(p0, batch, entries, comm, backend, routes, transport)
            backend.publish([e.ready for e in present])
        if results is None:
            self._finish_keys([response.key for response in batch])
        else:
            for entry, value in results:
                self._finish(entry, value)

    def _run(self, p0, batch, entries, comm, backend, routes, transport):
        kind = p0.kind
        if kind == Kind.ALLREDUCE:
            if p0.op == ReduceOp.ADASUM:
                return self._adasum(batch, entries, comm, backend)
            return self._allreduce(batch, entries, comm, backend, routes, transport)
        if kind == Kind.ALLGATHER:
            return self._allgather(
                batch,
                entries,
                comm,
                backend,
                self._link(p0.set_id, comm, backend, routes, transport, "allgather"),
            )
        if kind == Kind.BROADCAST:
            root = self._sets.ranks[p0.set_id].index(p0.root)
            return self._broadcast(
                entries,
                comm,
                backend,
                self._link(p0.set_id, comm, backend, routes, transport, "broadcast"),
                root,
            )
        if kind == Kind.ALLTOALL:
            return self._alltoall(
                entries[0],
                comm,
                backend,
                self._link(p0.set_id, comm, backend, routes, transport, "alltoall"),
            )
        if kind == Kind.REDUCESCATTER:
            return self._reducescatter(
                batch,
                entries,
                comm,
                backend,
                self._link(p0.set_id, comm, backend, routes, transport, "reducescatter"),
            )
        raise RuntimeError(f"the device executor cannot run {Kind(kind).name}")

    # --------------------------------------------------------------------- links
    def _link(self, set_id: int, comm, backend, routes: DeviceRoutes, transport, op: str):
        helper = self._hierarchical
        two_level = (
            op == "allreduce"
            and routes.hierarchical
            and helper is not None
            and helper.homogeneous
            and set_id == 0
        )
        key = (set_id, backend.device, transport, two_level)
        link = self._links.get(key)
        if link is None:
            flat = self._make(("set", set_id), comm, backend, transport, routes.fallback)
            link = flat
            if two_level:
                local = self._make(("local",), helper.local, backend, transport, routes.fallback)
                cross = self._make(
                    ("cross",), helper.cross, backend, routes.fallback, routes.fallback
                )
                link = HierarchicalLink(local, cross, flat, backend)
            self._links[key] = link
        self.used[link.name] += 1
        return link

    def _make(self, scope: tuple, comm, backend, transport: Transport, fallback: Transport):
        """The link of *transport* over *comm* (collective over it on first use)."""
        key = scope + (backend.device, transport)
        link = self._links.get(key)
        if link is not None:
            return link
        if transport is Transport.NCCL:
            if backend.device == CUDA:
                from .nccl_link import NcclLink

                link = NcclLink.create(comm)
            if link is None:
                # Host memory needs no NCCL: MPI takes it as it is.  On CUDA, NCCL could
                # not serve this set (a shared GPU): every member falls back alike.
                transport = fallback if backend.device == CUDA else Transport.CUDA_AWARE_MPI
        if link is None:
            link = (
                MpiLink(comm, backend, device_memory=True)
                if transport is Transport.CUDA_AWARE_MPI
                else StagedLink(comm, backend)
            )
        self._links[key] = link
        return link

    def forget_set(self, set_id: int) -> None:
        """Drop the links made for a removed set (its NCCL communicator with them)."""
        for key in [k for k in self._links if k[:2] == ("set", set_id) or k[0] == set_id]:
            del self._links[key]

    # ----------------------------------------------------------------- allreduce
    def _allreduce(self, batch, entries, comm, backend, routes, transport) -> None:
        p0 = batch[0].params
        size = comm.Get_size()
        tensors, dtypes = Reduction(), []
        for response, entry in zip(batch, entries):
            p = response.params
            post = p.postscale / size if p.op == ReduceOp.AVERAGE else p.postscale
            for i, shape in enumerate(p.shapes):
                if entry is None:
                    tensors.add(None, None, None, math.prod(shape), p.prescale, post)
                else:
                    tensors.add(
                        entry, entry.inputs[i], entry.outputs[i], math.prod(shape), p.prescale, post
                    )
                dtypes.append(p.dtypes[i])
        link = self._link(p0.set_id, comm, backend, routes, transport, "allreduce")
        backend.wait_ready([e.ready for e in entries if e is not None])
        wires = [link.wire(d) for d in dtypes]
        for wire in dict.fromkeys(wires):
            index = [i for i, w in enumerate(wires) if w == wire]
            part = tensors if len(index) == len(tensors) else tensors.subset(index)
            if len(part) == 1 and part.inputs[0] is not None and np.dtype(dtypes[index[0]]) == wire:
                reduce_alone(
                    backend,
                    part.inputs[0],
                    part.outputs[0],
                    part.prescales[0],
                    part.postscales[0],
                    _in_place(backend, link, p0.op),
                )
                continue
            buf = backend.buffer(wire, part.total())
            pack(backend, part, buf)
            link.allreduce(buf, p0.op)
            unpack(backend, part, buf)
        return None

    def _adasum(self, batch, entries, comm, backend) -> None:
        """Adasum runs on the host (float64): staged down and back per tensor."""
        backend.wait_ready([e.ready for e in entries if e is not None])
        for response, entry in zip(batch, entries):
            p = response.params
            for i, shape in enumerate(p.shapes):
                count = math.prod(shape)
                if entry is None:
                    data = np.zeros(count, dtype=np.float64)
                else:
                    host = backend.staging(p.dtypes[i], count, slot=2)
                    backend.to_host(entry.inputs[i].reshape(-1), host)
                    data = host.astype(np.float64) * p.prescale
                result = adasum_allreduce(comm, data)
                if entry is not None:
                    out = entry.outputs[i]
                    host_out = backend.staging(out.dtype, count, slot=3)
                    np.multiply(result, p.postscale, out=host_out, casting="unsafe")
                    backend.from_host(host_out, out.reshape(-1))
                    backend.synchronize()  # host_out is reused by the next tensor
        return None

    # ----------------------------------------------------------------- allgather
    def _allgather(self, batch, entries, comm, backend, link):
        size = comm.Get_size()
        tensors: list[Gathered] = []
        for response, entry in zip(batch, entries):
            p = response.params
            for i, (dt, trailing) in enumerate(zip(p.dtypes, p.shapes)):
                tensors.append(Gathered(entry, entry.inputs[i], tuple(trailing), np.dtype(dt)))
        local = np.array([t.input.shape[0] for t in tensors], dtype=np.int64)
        dims = np.empty((size, len(tensors)), dtype=np.int64)
        comm.Allgather(local, dims)
        row_bytes = [math.prod(t.trailing) * t.dtype.itemsize for t in tensors]
        per_rank = [
            int(sum(int(dims[r, j]) * row_bytes[j] for j in range(len(tensors))))
            for r in range(size)
        ]
        block = max(per_rank)  # every rank's region padded to one size: NCCL moves equal blocks
        outputs = [
            backend.empty((int(dims[:, j].sum()),) + t.trailing, t.dtype, t.entry.ready)
            for j, t in enumerate(tensors)
        ]
        backend.wait_ready(dict.fromkeys(e.ready for e in entries if e is not None))
        if block and len(tensors) == 1 and len(set(per_rank)) == 1:
            link.allgather(flat_bytes(tensors[0].input), flat_bytes(outputs[0]))
        elif block:
            send = backend.buffer(np.uint8, block, slot=0)
            pack_bytes(backend, [t.input for t in tensors], send)
            recv = backend.buffer(np.uint8, block * size, slot=1)
            link.allgather(send, recv)
            unpack_rank_major(
                backend, recv, [r * block for r in range(size)], dims, row_bytes, outputs
            )
        return _per_entry([t.entry for t in tensors], outputs)

    # ----------------------------------------------------------------- broadcast
    def _broadcast(self, entries, comm, backend, link, root: int):
        pairs = [pair for e in entries for pair in zip(e.inputs, e.outputs)]
        is_root = comm.Get_rank() == root
        backend.wait_ready([e.ready for e in entries])
        if len(pairs) == 1:
            inp, out = pairs[0]
            if is_root and inp is not out:
                backend.copy(out, inp)
            link.broadcast(flat_bytes(out), root)
            return None
        buf = backend.buffer(np.uint8, sum(out.nbytes for _, out in pairs))
        if is_root:
            pack_bytes(backend, [inp for inp, _ in pairs], buf)
        link.broadcast(buf, root)
        skip = {i for i, (inp, out) in enumerate(pairs) if is_root and inp is out}
        unpack_bytes(backend, buf, [out for _, out in pairs], skip)
        return None

    # ------------------------------------------------------------------ alltoall
    def _alltoall(self, entry, comm, backend, link):
        inp = entry.inputs[0]
        trailing = tuple(inp.shape[1:])
        row_bytes = math.prod(trailing) * inp.dtype.itemsize
        splits = np.ascontiguousarray(entry.splits, dtype=np.int64)
        received = np.empty(comm.Get_size(), dtype=np.int64)
        comm.Alltoall(splits, received)
        out = backend.empty((int(received.sum()),) + trailing, inp.dtype, entry.ready)
        backend.wait_ready([entry.ready])
        link.alltoallv(
            flat_bytes(inp),
            [int(s) * row_bytes for s in splits],
            flat_bytes(out),
            [int(s) * row_bytes for s in received],
        )
        return [(entry, (out, received))]

    # ------------------------------------------------------------- reducescatter
    def _reducescatter(self, batch, entries, comm, backend, link):
        size, me = comm.Get_size(), comm.Get_rank()
        op = batch[0].params.op
        tensors = scattered_of(batch, entries, size)
        outputs = [
            backend.empty((t.rows[me],) + t.shape[1:], t.dtype, t.entry.ready) for t in tensors
        ]
        backend.wait_ready(dict.fromkeys(e.ready for e in entries if e is not None))
        wires = [link.wire(t.dtype.str) for t in tensors]
        for wire in dict.fromkeys(wires):
            index = [j for j, w in enumerate(wires) if w == wire]
            part = [tensors[j] for j in index]
            block = max(rank_counts(part, size))  # padded: every link moves equal blocks
            send = backend.buffer(wire, block * size, slot=0)
            pack_rank_major(backend, part, send, [r * block for r in range(size)])
            recv = backend.buffer(wire, block, slot=1)
            link.reduce_scatter(send, recv, op)
            unpack_shards(backend, part, recv, me, [outputs[j] for j in index])
        return _per_entry([t.entry for t in tensors], outputs)


def _in_place(backend, link, op):
    """``allreduce(buf, src)`` for :func:`~hvdlite.device.packing.reduce_alone` over a
    device link, which reduces in place."""

    def allreduce(buf, src) -> None:
        if src is not buf:
            backend.copy(buf, src)
        link.allreduce(buf.reshape(-1), op)

    return allreduce


def _per_entry(entries, outputs) -> list:
    """(entry, [its outputs]) for each local entry, in first-appearance order."""
    results: dict[int, tuple] = {}
    for entry, out in zip(entries, outputs):
        if entry is not None:
            results.setdefault(id(entry), (entry, []))[1].append(out)
    return list(results.values())


#: The name each device collective has in the knobs and in DeviceRoutes.
_OPERATION_OF = {
    Kind.ALLREDUCE: "allreduce",
    Kind.ALLGATHER: "allgather",
    Kind.BROADCAST: "broadcast",
    Kind.ALLTOALL: "alltoall",
    Kind.REDUCESCATTER: "reducescatter",
}


class DevicePeer(Peer):
    """Device batches of the collectives in *operations* (every device batch when
    None) over *transport*'s link: NCCL, CUDA-aware MPI or staging through host
    memory.  *executor* makes (once) and returns the :class:`DeviceExecutor`, so
    that nothing device-side is made before the first device batch."""

    def __init__(self, transport: Transport, operations: frozenset | None, executor):
        self.transport = transport
        self.operations = operations
        self._executor = executor

    def accepts(self, p, comm, nbytes: int) -> bool:
        if p.device == "cpu":
            return False
        return self.operations is None or _OPERATION_OF.get(p.kind) in self.operations

    def run(self, batch, comm) -> None:
        self._executor().run_batch(batch, comm, self.transport)


def device_peers(routes: DeviceRoutes | None, executor) -> list[DevicePeer]:
    """A set's device peers, from its device *routes* (None: the router had no device
    knowledge, every collective staged): one per transport the routes name, for the
    collectives they send there, then one that takes any other device batch (and
    raises, as no device collective is left)."""
    routes = routes or STAGED_ROUTES
    chosen: dict[Transport, set] = {}
    for op in OPERATIONS:
        chosen.setdefault(getattr(routes, op), set()).add(op)
    peers = [
        DevicePeer(transport, frozenset(chosen[transport]), executor)
        for transport in Transport
        if transport in chosen
    ]
    peers.append(DevicePeer(Transport.STAGED, None, executor))
    return peers
