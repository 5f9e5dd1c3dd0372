"""HVDLITE_CHECK_ORDER=1: ranks that call different collectives fail at once, named.

Runs under mpiexec at 2 and 3 ranks with the check on (set before init) and
the stall inspector's warning far away, so an error here can only come from
the order check, and a hang would fail the test by its timeout.  The last
rank takes a different code path: an unnamed allgather where the others call
an unnamed allreduce.  Both collectives fail on every rank that submitted
them, within seconds, naming the two ranks, the position and both names; the
engine keeps working.  A join, where ranks run different numbers of
allreduces by design, raises nothing.
"""

import os

import numpy as np
import pytest
from core_helpers import check_engine_works, same_everywhere

os.environ["HVDLITE_CHECK_ORDER"] = "1"
os.environ["HVDLITE_STALL_CHECK_TIME_SECONDS"] = "600"

import hvdlite as hvd  # noqa: E402

MPI_SIZES = (2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
LAST = SIZE - 1


def test_the_same_collectives_in_the_same_order_run_as_usual():
    for step in range(3):
        out = hvd.grouped_allreduce([np.ones(3), np.full(2, RANK)], op=hvd.Sum, name=f"ok.{step}")
        np.testing.assert_array_equal(out[1], np.full(2, sum(range(SIZE))))
        assert hvd.allgather(np.full((1, 2), RANK)).shape == (SIZE, 2)
        hvd.broadcast(np.ones(2), root_rank=0, name=f"ok.bc.{step}")


def test_a_rank_on_another_code_path_fails_both_collectives_at_once():
    hvd.allreduce(np.ones(2), name="before.divergence")
    x = np.full((2, 2), float(RANK))
    if RANK == LAST:
        handle = hvd.allgather_async(x)  # the others reduce here
    else:
        handle = hvd.allreduce_async(x)
    with pytest.raises(hvd.MismatchError) as info:
        handle.result(timeout=30)  # the stall warning is 600 s away: this is the check
    message = str(info.value)
    for part in (
        "different orders",
        "process set 0",
        "collective rank",
        f"rank {LAST}",
        "allgather 'allgather.noname.",
        "allreduce 'allreduce.noname.",
        "HVDLITE_CHECK_ORDER",
    ):
        assert part in message, message
    assert same_everywhere(message)
    check_engine_works("after.divergence")


def test_a_join_is_not_a_divergence():
    # Rank r runs r + 1 allreduces, then joins; afterwards everyone agrees again.
    for step in range(RANK + 1):
        hvd.allreduce(np.ones(2), name=f"join.step.{step}")
    assert hvd.join() == LAST
    check_engine_works("after.join")  # counted afresh on every rank
