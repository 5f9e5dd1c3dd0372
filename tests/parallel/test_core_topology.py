"""Simulated multi-node topology: HVDLITE_TEST_NODE_SIZE=2 groups ranks in pairs.

Runs under mpiexec at 1, 2 and 3 ranks.  With nodes of two ranks, rank r is
on node r // 2 with local rank r % 2: at 3 ranks the local sizes are 2, 2, 1
and the job is not homogeneous; at 1 and 2 ranks there is one node.
"""

import os

import numpy as np
import pytest
from core_helpers import assert_same

os.environ["HVDLITE_TEST_NODE_SIZE"] = "2"

import hvdlite as hvd  # noqa: E402

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def test_local_and_cross_ranks():
    node, local = divmod(RANK, 2)
    assert hvd.local_rank() == local
    assert hvd.local_size() == min(2, SIZE - 2 * node)
    assert hvd.cross_rank() == node
    # Nodes holding a rank with this local rank: every node for local rank 0.
    assert hvd.cross_size() == len([r for r in range(SIZE) if r % 2 == local])


def test_local_sizes_and_homogeneity():
    sizes = hvd.allgather_object(hvd.local_size())
    expected = {1: [1], 2: [2, 2], 3: [2, 2, 1]}[SIZE]
    assert sizes == expected
    assert hvd.is_homogeneous() == (SIZE != 3)


def test_collectives_unaffected_by_topology():
    out = hvd.allreduce(np.full(3, RANK + 1.0), op=hvd.Sum, name="topo.ar")
    assert_same(out, np.full(3, float(sum(r + 1 for r in range(SIZE)))))
    out = hvd.allgather(np.full((RANK + 1, 2), RANK), name="topo.ag")
    assert out.shape == (sum(r + 1 for r in range(SIZE)), 2)
