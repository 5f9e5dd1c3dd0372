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
