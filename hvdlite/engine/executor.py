"""The dispatcher: each agreed batch to the first transport of its set that takes it.

Every rank calls :meth:`MPIExecutor.run_batch` with the same batches in the same
order (the engine guarantees it); ranks outside a batch's process set skip it.
A set's transports are peers (:mod:`hvdlite.engine.transports.peer`) in one
ordered list, its lineup, built from the set's
:class:`~hvdlite.engine.transports.routes.Routes`: the device peers, Adasum, the
16-bit wire for float16 and bfloat16 across nodes (in two levels where the
routes send allreduces through the two levels), the two-level and shared-memory peers where
the routes send collectives there, the ring for large allreduces across nodes,
and host MPI last.  The knobs decide the
routes at ``init``; autotune replaces the router (:meth:`MPIExecutor.use_router`);
nothing else orders the peers.  An
allreduce group that mixes wire dtypes is reduced one wire dtype at a time, each
part on the first peer that takes its size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from ..device.packing import NUMPY, reduce_alone
from ..ops import ReduceOp
from ..util.dtypes import reduce_dtype
from .messages import Kind, Response
from .transports.adasum import AdasumPeer
from .transports.device import device_peers
from .transports.half_two_level import HalfTwoLevelPeer
from .transports.half_wire import HalfWirePeer
from .transports.host import MPI_OPS, HierarchicalPeer, MpiPeer, mpi_allreduce
from .transports.peer import Context, counts_of, lineup
from .transports.ring import RingPeer
from .transports.shared_memory import SharedMemoryPeer
from .transports.shm import SLOT_BYTES
from .transports.staging import Stager

__all__ = ["MPIExecutor"]


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
        self.ctx = Context(lookup, finish, finish_keys, sets)
        self._sets = sets  # the ProcessSetTable: communicators and members
        self._router = router  # decides each set's routes, hence its lineup
        self.hierarchical = hierarchical  # the two-level helper, where enabled
        self._limit = limit  # a WaitLimit for the shared-memory barrier, or None
        self.pool = self.ctx.pool
        self._shm: dict[int, object] = {}  # set id -> SharedMemoryAllreduce or None
        self._lineups: dict[int, tuple] = {}  # set id -> its ordered peers
        self._mpi = MpiPeer(self.ctx)
        self._adasum = AdasumPeer(self.ctx)
        self._half_two_level_peer = None  # made for the first lineup that has one
        self.device = None  # the DeviceExecutor, made by the first device batch

    @property
    def timeline(self):
        """The engine's Timeline while one is on (set before each batch), else None."""
        return self.ctx.timeline

    @timeline.setter
    def timeline(self, value) -> None:
        self.ctx.timeline = value

    # ------------------------------------------------------------------ dispatch
    def run_batch(self, batch: list[Response]) -> None:
        p = batch[0].params
        comm = self._sets.comm_of(p.set_id)
        if comm is None:
            return
        peers = self._lineup_of(p.set_id)
        if p.kind == Kind.REDUCESCATTER:
            _choose(peers, p, comm, _reducescatter_bytes(batch)).run(batch, comm)
            return
        if p.kind != Kind.ALLREDUCE:
            _choose(peers, p, comm, 0).run(batch, comm)
            return
        wire = reduce_dtype(p.dtypes[0])
        nbytes = sum(sum(counts_of(r.params.shapes)) for r in batch) * wire.itemsize
        peer = _choose(peers, p, comm, nbytes)
        if not peer.reduces:
            peer.run(batch, comm)  # Adasum, or a device peer: the whole batch
            return
        tensors = self.ctx.reduction(batch, comm.Get_size())
        if len(p.dtypes) > 1 and _mixed_wire(p.dtypes):
            # A group of tensors with different wire dtypes (never fused with other
            # responses): one reduction per wire dtype, in order of first appearance,
            # each on the first peer that takes its size.
            dtypes = list(p.dtypes)
            wires = [reduce_dtype(d) for d in dtypes]
            for wire in dict.fromkeys(wires):
                index = [i for i, w in enumerate(wires) if w == wire]
                part = tensors.subset(index)
                peer = _choose(peers, p, comm, part.total() * wire.itemsize)
                peer.reduce(p, part, [dtypes[i] for i in index], wire, comm, None)
        else:
            # The batch list stands for its layout: the engine reuses it while the
            # response cache is unchanged, so the shared-memory cut is computed once.
            dtypes = [d for response in batch for d in response.params.dtypes]
            peer.reduce(p, tensors, dtypes, wire, comm, batch)
        self.ctx.finish_batch(batch)

    def runners(self, batches: list[list[Response]]) -> list[Callable[[], None]]:
        """One function per batch that runs it as :meth:`run_batch` would, for a plan
        the engine runs again and again (its cached responses).

        A batch of one request that takes the single-tensor fast path (its
        ``Params.single_host``, decided where the request was made: read here, not
        decided again) and that host MPI reduces (a synchronous call's, typically)
        gets a function with every decision taken here, once; any other batch gets
        :meth:`run_batch` itself.  Collective: every rank builds the same plan's
        runners in the same cycle, because choosing the peer may make the set's
        shared-memory window (as the set's first allreduce does in
        :meth:`run_batch`), and a rank that runs the plan through :meth:`run_batch`
        (a timeline is on) must have made it too.
        """
        return [
            self._single_allreduce(batch) or functools.partial(self.run_batch, batch)
            for batch in batches
        ]

    def _single_allreduce(self, batch) -> Callable[[], None] | None:
        if len(batch) != 1 or not batch[0].params.single_host:
            return None
        p = batch[0].params
        comm = self._sets.comm_of(p.set_id)
        if comm is None:  # not a member: run_batch skips it
            return None
        nbytes = math.prod(p.shapes[0]) * reduce_dtype(p.dtypes[0]).itemsize
        if _choose(self._lineup_of(p.set_id), p, comm, nbytes) is not self._mpi:
            return None
        allreduce = mpi_allreduce(comm, MPI_OPS[p.op])
        pre = p.prescale
        post = p.postscale / comm.Get_size() if p.op == ReduceOp.AVERAGE else p.postscale
        key = batch[0].key
        keys = (key,)
        lookup, finish_keys, run_batch = self.ctx.lookup, self.ctx.finish_keys, self.run_batch

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
        :class:`~hvdlite.engine.transports.staging.Stager` when the plan's first
        batch is an allreduce that this rank's set reduces through shared memory in
        one chunk, which can then run staged, else None.  Collective as
        :meth:`runners` is (it may make the set's window), and every member
        answers alike."""
        if not batches:
            return None
        batch = batches[0]
        p = batch[0].params
        if p.kind != Kind.ALLREDUCE or p.device != "cpu":
            return None
        if len(p.dtypes) > 1 and _mixed_wire(p.dtypes):
            return None
        comm = self._sets.comm_of(p.set_id)
        if comm is None:
            return None
        wire = reduce_dtype(p.dtypes[0])
        nbytes = sum(sum(counts_of(r.params.shapes)) for r in batch) * wire.itemsize
        if nbytes > SLOT_BYTES:
            return None
        if not isinstance(_choose(self._lineup_of(p.set_id), p, comm, nbytes), SharedMemoryPeer):
            return None
        return Stager(self.ctx, batch, comm.Get_size(), wire, self._shm[p.set_id])

    def use_router(self, router) -> None:
        """Take routes from *router* from the next batch on (autotune: every rank
        switches in the same cycle, so every member of a set picks the same peer)."""
        self._router = router
        self._lineups.clear()

    def _lineup_of(self, set_id: int) -> tuple:
        peers = self._lineups.get(set_id)
        if peers is None:
            routes = self._router.routes(self._sets.ranks[set_id])
            peers = self._lineups[set_id] = lineup(
                routes,
                self._mpi,
                self._adasum,
                lambda kinds: HierarchicalPeer(self.ctx, self.hierarchical, kinds),
                lambda kinds: SharedMemoryPeer(self.ctx, self._shm, self._limit, kinds, self._mpi),
                lambda device_routes: device_peers(device_routes, self._device_executor),
                lambda order, per_hop: HalfWirePeer(self.ctx, order, per_hop),
                lambda order: RingPeer(self.ctx, order),
                self._half_two_level if self.hierarchical is not None else None,
            )
        return peers

    def _half_two_level(self) -> HalfTwoLevelPeer:
        """The one 16-bit two-level peer (its counters outlive a change of routes)."""
        if self._half_two_level_peer is None:
            self._half_two_level_peer = HalfTwoLevelPeer(self.ctx, self.hierarchical)
        return self._half_two_level_peer

    def _device_executor(self):
        if self.device is None:
            from .transports.device import DeviceExecutor

            self.device = DeviceExecutor(
                self.ctx.lookup,
                self.ctx.finish,
                self.ctx.finish_keys,
                self._sets,
                lambda set_id: self._router.routes(self._sets.ranks[set_id]),
                self.hierarchical,
            )
        return self.device

    def forget_set(self, set_id: int) -> None:
        """Collective over the set's members: release what was made for it."""
        self._lineups.pop(set_id, None)
        if self.device is not None:
            self.device.forget_set(set_id)
        shm = self._shm.pop(set_id, None)
        if shm is not None:
            shm.free()

    def close(self) -> None:
        """Collective (orderly shutdown on every rank): release every shared window."""
        for set_id in list(self._shm):
            self.forget_set(set_id)


def _choose(peers: tuple, p, comm, nbytes: int):
    """The first of *peers* that takes a batch of *p* of *nbytes* on *comm*."""
    for peer in peers:
        if peer.accepts(p, comm, nbytes):
            return peer
    raise RuntimeError(f"no transport takes {Kind(p.kind).name}")  # MPI takes every host batch


def _reducescatter_bytes(batch) -> int:
    """The agreed size of a reducescatter batch in its wire dtypes."""
    return sum(
        count * reduce_dtype(dtype).itemsize
        for response in batch
        for count, dtype in zip(counts_of(response.params.shapes), response.params.dtypes)
    )


@functools.lru_cache(maxsize=1024)
def _mixed_wire(dtypes: tuple) -> bool:
    """Whether a grouped entry's dtypes reduce in more than one wire dtype."""
    return len({reduce_dtype(d) for d in dtypes}) > 1
