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
        assert spanning.reducescatter is Transport.MPI
        assert spanning.half_allreduce is Transport.HALF_WIRE
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
        "half",
    )
    assert peers[:3] == ("adasum", "half", peers[2]) and peers[2][0] == "hierarchical"
    assert peers[-1] == "mpi"
