"""What every transport is to the dispatcher: a peer that may take a batch and runs it.

A process set's transports stand in one ordered list, its *lineup*
(:func:`lineup`), built from the set's
:class:`~hvdlite.engine.transports.routes.Routes`, which the knobs decide at
``init`` and autotune replaces; nothing else orders the peers.  For each batch
(for an allreduce: each part of one wire dtype) the dispatcher asks the peers in
order and the first that :meth:`Peer.accepts` it runs it.  A peer answers from
agreed facts only (the batch's parameters, its agreed size, the set), so every
member of the set picks the same peer; making a set's shared window the first
time it is asked is collective, like the batch itself.

:class:`Context` is what the peers share with the dispatcher: the engine's
callbacks that find a key's local entry and finish it, the process set table,
the host fusion buffers, and the timeline while one records.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

from ...device.buffers import BufferPool, Reduction
from ...ops import ReduceOp
from ...util.paths import Transport
from ..messages import Kind, Params

__all__ = ["Context", "Peer", "lineup", "counts_of"]


class Context:
    """The engine's side of a batch, shared by the dispatcher and every peer."""

    def __init__(self, lookup: Callable, finish: Callable, finish_keys: Callable, sets):
        self.sets = sets  # the ProcessSetTable: communicators and members
        self.lookup = lookup  # key -> local Entry or None (joined / not a member)
        self.finish = finish  # (entry, value) -> None
        self.finish_keys = finish_keys  # keys -> None: finish with their outputs
        self.pool = BufferPool()
        self.timeline = None  # the engine's Timeline while one records, else None

    def reduction(self, batch, set_size: int) -> Reduction:
        """Every tensor of the batch, with Average's division folded into the postscale."""
        tensors = Reduction()
        for response in batch:
            p = response.params
            entry = self.lookup(response.key)
            post = p.postscale / set_size if p.op == ReduceOp.AVERAGE else p.postscale
            if entry is None:
                tensors.extend(None, None, None, counts_of(p.shapes), p.prescale, post)
            else:
                tensors.extend(
                    entry, entry.inputs, entry.outputs, counts_of(p.shapes), p.prescale, post
                )
        return tensors

    def finish_batch(self, batch) -> None:
        self.finish_keys([response.key for response in batch])

    def finish_per_entry(self, entries, outputs) -> None:
        """Finish each local entry with the list of its tensors' outputs."""
        results: dict[int, tuple] = {}
        for entry, out in zip(entries, outputs):
            if entry is not None:
                results.setdefault(id(entry), (entry, []))[1].append(out)
        for entry, outs in results.values():
            self.finish(entry, outs)


class Peer:
    """One transport.  :attr:`transport` names it; :meth:`accepts` says whether it
    takes a batch of these agreed *params* and *nbytes* on *comm* (collective only
    where it makes the set's shared window); :meth:`run` moves a batch;
    :meth:`reduce` moves one wire dtype's part of an allreduce batch."""

    transport: Transport
    #: True for a peer that reduces an allreduce part by part (:meth:`reduce`);
    #: False for one that takes a whole allreduce batch (:meth:`run`).
    reduces = False

    def accepts(self, p: Params, comm, nbytes: int) -> bool:
        raise NotImplementedError

    def run(self, batch, comm) -> None:
        raise NotImplementedError

    def reduce(self, p0: Params, tensors: Reduction, dtypes, wire, comm, layout_key) -> None:
        raise NotImplementedError


def lineup(
    routes,
    mpi: Peer,
    adasum: Peer,
    hierarchical,
    shared_memory,
    device,
    half_wire,
    ring=None,
    half_two_level=None,
) -> tuple:
    """The ordered peers of a set with these *routes*: the device peers (their
    own order, :func:`~hvdlite.engine.transports.device.device_peers`), Adasum,
    the 16-bit wire for float16 allreduces where the routes say so, the
    two-level and shared-memory peers for the collectives the routes send
    there, the ring for large allreduces where the routes give one, and host
    MPI last, which takes every host batch.  *hierarchical* and *shared_memory*
    make those peers for a set of collective kinds; *ring* makes its peer for the
    set's ring order (``routes.ring``, None where it has none), and *half_wire*
    for that order and ``routes.half_per_hop``.  Where the routes send allreduces
    through the two levels, *half_two_level* (None: no such peer) makes the
    16-bit peer that keeps both: it stands before the flat 16-bit wire, which
    takes what it leaves (nodes of one rank each)."""
    peers = list(device(routes.device))
    peers.append(adasum)
    if routes.half_allreduce is Transport.HALF_WIRE:
        # before the 32-bit two-level path: across nodes 16 bits per value on a
        # flat exchange beat 32 through the two levels (bench_multihost_tc)
        if routes.allreduce is Transport.HIERARCHICAL and half_two_level is not None:
            peers.append(half_two_level())
        peers.append(half_wire(routes.ring, routes.half_per_hop))
    for transport, make in (
        (Transport.HIERARCHICAL, hierarchical),
        (Transport.SHARED_MEMORY, shared_memory),
    ):
        kinds = frozenset(
            kind
            for kind, path in (
                (Kind.ALLREDUCE, routes.allreduce),
                (Kind.ALLGATHER, routes.allgather),
                (Kind.REDUCESCATTER, routes.reducescatter),
            )
            if path is transport
        )
        if kinds:
            peers.append(make(kinds))
    if routes.ring is not None and ring is not None:
        peers.append(ring(routes.ring))
    peers.append(mpi)
    return tuple(peers)


@functools.lru_cache(maxsize=1024)
def counts_of(shapes: tuple) -> tuple[int, ...]:
    """The element count of each shape (an entry's shapes repeat step after step)."""
    return tuple(math.prod(shape) for shape in shapes)
