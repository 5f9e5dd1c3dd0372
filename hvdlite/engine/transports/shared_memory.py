"""Shared memory as a peer: the allreduces and allgathers of a set on one node.

The set's window (:class:`~hvdlite.engine.transports.shm.SharedMemoryAllreduce`)
is made the first time the peer is asked about one of its collectives
(collective: every member asks about the same first batch); where it could not
be made, the peer declines every batch and every member goes on to the next
peer alike.  An allreduce smaller than
:data:`~hvdlite.engine.transports.routes.SHM_MIN_BYTES` is declined too (one
MPI allreduce is faster there); an allgather whose rows do not fit a rank's
area falls back to host MPI inside the same batch, on every member alike.
"""

from __future__ import annotations

import math

from ...timeline.schema import COPY_IN
from ...util.paths import Transport
from ..messages import Kind
from .host import MpiPeer, gathered, outputs_for
from .peer import Context, Peer
from .routes import SHM_MIN_BYTES
from .shm import SharedMemoryAllreduce

__all__ = ["SharedMemoryPeer"]


class SharedMemoryPeer(Peer):
    """The collectives of *kinds* (allreduce, allgather) through the set's window."""

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
        return p.kind != Kind.ALLREDUCE or nbytes >= SHM_MIN_BYTES

    def reduce(self, p0, tensors, dtypes, wire, comm, layout_key) -> None:
        tl = self.ctx.timeline
        if tl is not None:
            tl.via(self.transport)
        self._windows[p0.set_id].allreduce(tensors, wire, p0.op, layout_key=layout_key)

    def run(self, batch, comm) -> None:  # an allgather
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
