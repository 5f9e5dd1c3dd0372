"""The transport plan: one path per process set, from facts every rank shares."""

from __future__ import annotations

import pytest

from hvdlite.engine.transports.routes import SHM_MIN_BYTES, Router, Transport

pytestmark = pytest.mark.timeout(60)


def test_the_plan_names_one_path_per_set_from_shared_facts():
    router = Router(
        world_size=4,
        node_ranks=[0, 1],
        shared_memory=True,
        hierarchical_allreduce=False,
        hierarchical_allgather=True,
    )
    node_pair = router.routes([1, 0])
    assert node_pair.allreduce is Transport.SHARED_MEMORY
    assert node_pair.allgather is Transport.SHARED_MEMORY
    assert node_pair.allreduce_path(SHM_MIN_BYTES - 1) is Transport.MPI
    assert node_pair.allreduce_path(SHM_MIN_BYTES) is Transport.SHARED_MEMORY
    assert router.routes([0, 2]).allreduce is Transport.MPI  # not all on this node
    assert router.routes([0, 2]).allgather is Transport.MPI
    assert router.routes([0]).allreduce is Transport.MPI  # one rank: nothing to share
    whole = router.routes(range(4))
    assert whole.allreduce is Transport.MPI and whole.allgather is Transport.HIERARCHICAL
    hier = Router(4, [0, 1, 2, 3], True, True, False)
    assert hier.routes(range(4)).allreduce is Transport.HIERARCHICAL
    assert hier.routes([0, 1]).allreduce is Transport.SHARED_MEMORY  # subsets run flat
    off = Router(2, [0, 1], False, False, False).routes([0, 1])
    assert off.allreduce is Transport.MPI and off.allgather is Transport.MPI


def test_reduce_scatters_share_the_node_and_float16_crosses_nodes_as_16_bits():
    router = Router(
        4, [0, 1], shared_memory=True, hierarchical_allreduce=True, hierarchical_allgather=False
    )
    pair = router.routes([0, 1])
    assert pair.reducescatter is Transport.SHARED_MEMORY
    assert pair.half_allreduce is Transport.MPI  # one node: float16 reduces in float32
    for ranks in ([0, 2], range(4)):
        spanning = router.routes(ranks)
        assert spanning.half_allreduce is Transport.HALF_WIRE
    # the whole job goes through the two levels with allreduce, a subset stays flat
    assert router.routes(range(4)).reducescatter is Transport.HIERARCHICAL
    assert router.routes([0, 2]).reducescatter is Transport.MPI
    flat = Router(4, [0, 1], True, False, False).routes(range(4))
    assert flat.reducescatter is Transport.MPI
    off = Router(2, [0, 1], False, False, False).routes([0, 1])
    assert off.reducescatter is Transport.MPI


def test_the_16_bit_wire_stands_before_the_two_level_path():
    from hvdlite.engine.transports.peer import lineup

    routes = Router(4, [0, 1], True, True, False).routes(range(4))
    peers = lineup(
        routes,
        "mpi",
        "adasum",
        lambda kinds: ("hierarchical", kinds),
        lambda kinds: ("shm", kinds),
        lambda device: [],
        lambda order, per_hop: ("half", order),
    )
    assert peers[:3] == ("adasum", ("half", None), peers[2]) and peers[2][0] == "hierarchical"
    assert peers[-1] == "mpi"


def test_sets_across_nodes_get_a_ring_that_keeps_each_nodes_ranks_together():
    from hvdlite.engine.transports.peer import lineup
    from hvdlite.engine.transports.routes import ring_order

    # hosts of two ranks placed round-robin: ranks 0 and 2 on one node, 1 and 3 on another
    round_robin = (0, 1, 0, 1)
    assert ring_order(round_robin, range(4)) == (0, 2, 1, 3)
    assert ring_order((0, 0, 2, 2, 4, 4), range(6)) == tuple(range(6))
    # in communicator ranks: ranks 1, 2, 3 are 0, 1, 2; rank 2 (node 0) comes first
    assert ring_order(round_robin, [3, 1, 2]) == (1, 0, 2)
    router = Router(4, [0, 2], True, False, False, node_of=round_robin)
    assert router.routes([0, 2]).ring is None  # one node: shared memory, no ring
    assert router.routes(range(4)).ring == (0, 2, 1, 3)
    assert router.variant(True, True).routes(range(4)).ring == (0, 2, 1, 3)
    off = Router(4, [0, 2], True, False, False, node_of=round_robin, ring=False)
    assert off.routes(range(4)).ring is None
    assert Router(4, [0, 2], True, False, False).routes(range(4)).ring is None  # no layout
    peers = lineup(
        router.routes(range(4)),
        "mpi",
        "adasum",
        lambda kinds: ("hierarchical", kinds),
        lambda kinds: ("shm", kinds),
        lambda device: [],
        lambda order, per_hop: ("half", order),
        lambda order: ("ring", order),
    )
    assert peers[-2:] == (("ring", (0, 2, 1, 3)), "mpi")


def test_float16_partial_sums_go_per_hop_only_around_a_ring_and_when_asked():
    from hvdlite.engine.transports.half_wire import HalfWirePeer

    round_robin = (0, 1, 0, 1)
    asked = Router(4, [0, 2], True, False, False, node_of=round_robin, half_per_hop=True)
    assert asked.routes(range(4)).half_per_hop
    assert asked.variant(False, True).routes(range(4)).half_per_hop  # autotune keeps it
    assert not asked.routes([0, 2]).half_per_hop  # one node: no ring
    no_ring = Router(
        4, [0, 2], True, False, False, node_of=round_robin, ring=False, half_per_hop=True
    )
    assert not no_ring.routes(range(4)).half_per_hop
    assert (
        not Router(4, [0, 2], True, False, False, node_of=round_robin).routes(range(4)).half_per_hop
    )
    assert not HalfWirePeer(None, None, per_hop=True).per_hop  # no ring to go around


def test_halves_take_the_two_levels_first_where_allreduces_go_through_them():
    from types import SimpleNamespace

    from hvdlite.engine.transports.half_two_level import HalfTwoLevelPeer
    from hvdlite.engine.transports.peer import lineup

    def peers_of(routes):
        return lineup(
            routes,
            "mpi",
            "adasum",
            lambda kinds: ("hierarchical", kinds),
            lambda kinds: ("shm", kinds),
            lambda device: [],
            lambda order, per_hop: ("half", order),
            None,
            lambda: "half in two levels",
        )

    two_level = Router(4, [0, 1], True, True, False).routes(range(4))
    assert peers_of(two_level)[1:3] == ("half in two levels", ("half", None))
    flat = Router(4, [0, 1], True, False, False).routes(range(4))
    assert "half in two levels" not in peers_of(flat)
    one_node = Router(2, [0, 1], True, True, False).routes(range(2))
    assert "half in two levels" not in peers_of(one_node)  # nothing crosses
    # nodes of one rank: the peer steps aside, the flat wire rounds once
    assert HalfTwoLevelPeer(None, SimpleNamespace(nodes=[(0, 1), (2, 3)])).useful
    assert HalfTwoLevelPeer(None, SimpleNamespace(nodes=[(0, 1), (2,)])).useful
    assert not HalfTwoLevelPeer(None, SimpleNamespace(nodes=[(0,), (1,)])).useful
    assert not HalfTwoLevelPeer(None, SimpleNamespace(nodes=[(0, 1, 2)])).useful
