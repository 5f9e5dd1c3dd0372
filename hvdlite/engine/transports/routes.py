"""Which path a process set's collectives take: shared memory, hierarchical, MPI.

One :class:`Router` per process (made at ``init``) decides the
:class:`Routes` of each process set from facts that every member of the set
shares: the knobs, the set's ranks, the job's size and which ranks share this
node.  So every member decides alike without communicating.  The executor
follows them; framework adapters ask it (:func:`hvdlite.engine.runtime.routes_of`) to shape their
submissions, instead of deciding again.  Device (GPU) buffers get their own
paths, decided at ``init`` by :mod:`hvdlite.device.selection` from the knobs and
from what every rank can do, and kept in :attr:`Routes.device`.

A route may still meet a fallback at first use (a /dev/shm too small for the
shared window makes every member reduce through MPI): that costs speed, never
correctness, and every member falls back together.
"""

from __future__ import annotations

from typing import NamedTuple

from ...util.paths import Transport

__all__ = ["Transport", "Routes", "Router", "SHM_MIN_BYTES", "SHM_MAX_RANKS", "ring_order"]

#: Smallest batch (in wire bytes) worth the shared-memory path: below it, one MPI
#: allreduce's latency beats that path's two barriers (``bench_core`` shows both).
SHM_MIN_BYTES = 64 << 10
#: The shared-memory paths (allreduce, allgather, reducescatter) serve sets of at
#: most this many ranks.
SHM_MAX_RANKS = 4


class Routes(NamedTuple):
    """The paths of one process set."""

    allreduce: Transport
    allgather: Transport
    device: object = None  # a hvdlite.device.selection.DeviceRoutes, or None (staged)
    reducescatter: Transport = Transport.MPI
    #: float16 and bfloat16 Sum/Average allreduces of host arrays: 16-bit on the
    #: wire across nodes (ahead of the 32-bit two-level path; where allreduces go
    #: through the two levels, as 16-bit node partial sums)
    half_allreduce: Transport = Transport.MPI
    #: where the set spans nodes and the ring is on: its ranks (communicator ranks)
    #: in ring order, each node's together; large flat Sum/Average allreduces and
    #: reduce-scatters of host arrays go around it (:mod:`hvdlite.engine.transports.ring`)
    ring: tuple | None = None
    #: float16 partial sums travel the ring rounded at every hop
    #: (``HVDLITE_HALF_SUMS_PER_HOP``; only where the set has a ring)
    half_per_hop: bool = False

    def allreduce_path(self, nbytes: int) -> Transport:
        """The path of an allreduce batch of *nbytes* (agreed sizes: every member
        answers alike)."""
        if self.allreduce is Transport.SHARED_MEMORY and nbytes < SHM_MIN_BYTES:
            return Transport.MPI
        return self.allreduce


class Router:
    """Decides routes from the knobs and the job's layout (no communication)."""

    def __init__(
        self,
        world_size: int,
        node_ranks,
        shared_memory: bool,
        hierarchical_allreduce: bool,
        hierarchical_allgather: bool,
        device=None,
        node_of=None,
        ring: bool = True,
        half_per_hop: bool = False,
    ):
        self.world_size = world_size
        self.node_ranks = frozenset(node_ranks)
        #: the node key of every world rank (its node's lowest rank), where known
        self.node_of = tuple(node_of) if node_of is not None else None
        self.ring = ring
        self.half_per_hop = half_per_hop
        self.shared_memory = shared_memory
        self.hierarchical_allreduce = hierarchical_allreduce
        self.hierarchical_allgather = hierarchical_allgather
        self.device = device  # a hvdlite.device.selection.DeviceChoice, or None
        self._routes: dict[tuple, Routes] = {}

    def routes(self, ranks) -> Routes:
        """The routes of the set with these global *ranks*."""
        ranks = tuple(sorted(ranks))
        routes = self._routes.get(ranks)
        if routes is None:
            routes = self._routes[ranks] = self._decide(ranks)
        return routes

    def variant(self, shared_memory: bool, hierarchical_allreduce: bool) -> Router:
        """A router for the same job with these two switches (autotune changes them
        for the executor, on every rank in the same cycle; adapters keep this one)."""
        return Router(
            self.world_size,
            self.node_ranks,
            shared_memory,
            hierarchical_allreduce,
            self.hierarchical_allgather,
            self.device,
            self.node_of,
            self.ring,
            self.half_per_hop,
        )

    def _decide(self, ranks: tuple) -> Routes:
        # The node topology describes the whole job only: hierarchical paths serve
        # the set that spans it; other sets run flat.
        whole_job = len(ranks) == self.world_size
        one_node = (
            self.shared_memory
            and 2 <= len(ranks) <= SHM_MAX_RANKS
            and self.node_ranks.issuperset(ranks)
        )
        allreduce = Transport.MPI
        if self.hierarchical_allreduce and whole_job:
            allreduce = Transport.HIERARCHICAL
        elif one_node:
            allreduce = Transport.SHARED_MEMORY
        allgather = Transport.MPI
        if self.hierarchical_allgather and whole_job:
            allgather = Transport.HIERARCHICAL
        elif one_node:
            allgather = Transport.SHARED_MEMORY
        reducescatter = Transport.MPI
        if one_node:
            reducescatter = Transport.SHARED_MEMORY
        elif self.hierarchical_allreduce and whole_job:
            reducescatter = Transport.HIERARCHICAL  # where the nodes are of one size
        across_nodes = not self.node_ranks.issuperset(ranks)
        half = Transport.HALF_WIRE if across_nodes else Transport.MPI
        device = self.device.routes(whole_job) if self.device is not None else None
        ring = None
        if across_nodes and self.ring and self.node_of is not None:
            ring = ring_order(self.node_of, ranks)
        per_hop = ring is not None and self.half_per_hop
        return Routes(allreduce, allgather, device, reducescatter, half, ring, per_hop)


def ring_order(node_of, ranks) -> tuple[int, ...]:
    """The set of global *ranks* on a ring, as communicator ranks (a rank's position
    among *ranks* sorted): each node's ranks together, so a node's ring edges cross
    its link once each way; nodes by *node_of* (a key per world rank, its node's
    lowest rank), ranks ascending within a node."""
    ranks = sorted(ranks)
    return tuple(sorted(range(len(ranks)), key=lambda i: (node_of[ranks[i]], ranks[i])))
