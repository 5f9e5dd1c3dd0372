"""Shared memory as a peer: the allreduces, allgathers and reduce-scatters of a set on one node.

The set's window (:class:`~hvdlite.engine.transports.shm.SharedMemoryAllreduce`)
is made the first time the peer is asked about one of its collectives
(collective: every member asks about the same first batch); where it could not
be made, the peer declines every batch and every member goes on to the next
peer alike.  An allreduce or reduce-scatter smaller than
:data:`~hvdlite.engine.transports.routes.SHM_MIN_BYTES` is declined too (one
MPI call is faster there); an allgather whose rows do not fit a rank's
area falls back to host MPI inside the same batch, on every member alike.
"""

from __future__ import annotations

import math

from ...timeline.schema import COPY_IN
from ...util.paths import Transport
from ..messages import Kind
from .host import MpiPeer, gathered, outputs_for, per_wire_dtype, scattered
from .peer import Context, Peer
from .routes import SHM_MIN_BYTES
from .shm import SharedMemoryAllreduce

__all__ = ["SharedMemoryPeer"]


class SharedMemoryPeer(Peer):
    """The collectives of *kinds* (allreduce, allgather, reducescatter) through the
    set's window."""

    transport = Transport.SHARED_MEMORY
    reduces = True

    def __init__(self, ctx: Context, windows: dict, limit, kinds: frozenset, mpi: MpiPeer):
        self.ctx = ctx
        self._windows = windows  # set id -> SharedMemoryAllreduce or None (shared)
        self._limit = limit  # a WaitLimit for the window's barriers, or None
        self.kinds = kinds
        self._mpi = mpi  # where an allgather that does not fit goes

    def window(self, set_id: int, comm):
        """The set's window, made on first use (collective); None where it could not be."""
        try:
            return self._windows[set_id]
        except KeyError:
            shm = self._windows[set_id] = SharedMemoryAllreduce.create(comm, self._limit)
            return shm

    def accepts(self, p, comm, nbytes: int) -> bool:
        if p.kind not in self.kinds or self.window(p.set_id, comm) is None:
            return False
        return p.kind == Kind.ALLGATHER or nbytes >= SHM_MIN_BYTES

    def reduce(self, p0, tensors, dtypes, wire, comm, layout_key) -> None:
        tl = self.ctx.timeline
        if tl is not None:
            tl.via(self.transport)
        self._windows[p0.set_id].allreduce(tensors, wire, p0.op, layout_key=layout_key)

    def run(self, batch, comm) -> None:
        if batch[0].params.kind == Kind.REDUCESCATTER:
            self._reducescatter(batch, comm)
        else:
            self._allgather(batch, comm)

    def _reducescatter(self, batch, comm) -> None:
        p0 = batch[0].params
        if self.ctx.timeline is not None:
            self.ctx.timeline.via(self.transport)
        window = self._windows[p0.set_id]
        tensors = scattered(self.ctx, batch, comm.Get_size())
        outputs = per_wire_dtype(
            tensors, lambda part, wire: window.reducescatter(part, wire, p0.op)
        )
        self.ctx.finish_per_entry([t.entry for t in tensors], outputs)

    def _allgather(self, batch, comm) -> None:
        tl = self.ctx.timeline
        tensors = gathered(self.ctx, batch)
        row_bytes = [math.prod(t.trailing) * t.dtype.itemsize for t in tensors]
        if tl is not None:
            tl.via(self.transport)
            tl.phase(COPY_IN)
        dims, outputs = self._windows[batch[0].params.set_id].allgather(
            [t.input for t in tensors],
            row_bytes,
            lambda dims: outputs_for(tensors, dims),
            None if tl is None else tl.phase,
        )
        if outputs is not None:
            self.ctx.finish_per_entry([t.entry for t in tensors], outputs)
            return
        self._mpi.allgather(tensors, comm, dims)  # a rank's rows did not fit its area
