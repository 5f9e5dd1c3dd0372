"""join() beside every kind of collective, unnamed calls, and joins that end early.

Runs under mpiexec at 2, 3 and 4 ranks.  As in Horovod's own join tests, each
rank in turn joins first while the others call a collective that cannot run
beside a joined rank: it fails on every rank that called it, at once, whatever
its name (unnamed calls are numbered per rank, and the joined rank skipped
one, so from 3 ranks on the callers' names differ); then they join too, and
join() returns the same rank everywhere.  A join that a caller leaves before it
returns (here: a timer's exception, as a test's time limit raises one) leaves
nothing joined behind.
"""

import signal
import threading

import numpy as np
import pytest
from core_helpers import mpi_sync, same_everywhere

import hvdlite as hvd
from hvdlite.engine.runtime import state

MPI_SIZES = (2, 3, 4)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()

#: Collectives a joined rank cannot take part in, called without name= (broadcast's
#: root is the caller itself, as in Horovod's test: the join is found first).
UNNAMED = {
    "allgather": lambda: hvd.allgather(np.ones((2, 3), np.float32)),
    "grouped_allgather": lambda: hvd.grouped_allgather([np.ones((1, 2)), np.ones((3,))]),
    "broadcast": lambda: hvd.broadcast(np.ones(3, np.float32), RANK),
    "broadcast_object": lambda: hvd.broadcast_object({"rank": RANK}, 0),
    "alltoall": lambda: hvd.alltoall(np.ones((SIZE, 2))),
    "reducescatter": lambda: hvd.reducescatter(np.ones((SIZE, 2)), op=hvd.Sum),
    "grouped_reducescatter": lambda: hvd.grouped_reducescatter([np.ones((SIZE, 2))], op=hvd.Sum),
    "barrier": hvd.barrier,
}


def each_rank_joins_first(call) -> None:
    for first in range(SIZE):
        if RANK == first:
            last = hvd.join()
        else:
            with pytest.raises(hvd.HorovodInternalError, match="join"):
                call()
            last = hvd.join()
        assert last != first  # a caller of the collective joined after it
        assert same_everywhere(last)


@pytest.mark.parametrize("kind", list(UNNAMED))
def test_an_unnamed_collective_fails_on_its_callers_while_a_rank_has_joined(kind):
    each_rank_joins_first(UNNAMED[kind])


def test_a_named_broadcast_with_differing_roots_fails_while_a_rank_has_joined():
    # Horovod's test_horovod_join_broadcast: one name, each caller its own root.
    each_rank_joins_first(lambda: hvd.broadcast(np.ones(4), RANK, name="join.kinds.bc"))


def test_every_kind_runs_unnamed_after_those_joins():
    # Each rank made every unnamed call above SIZE - 1 times: the names agree again.
    assert hvd.broadcast(np.full(2, RANK), 0)[0] == 0
    np.testing.assert_array_equal(hvd.allgather(np.full((1, 1), RANK)).ravel(), np.arange(SIZE))
    np.testing.assert_allclose(
        hvd.reducescatter(np.ones((SIZE, 1)), op=hvd.Sum), np.full((1, 1), float(SIZE))
    )
    np.testing.assert_array_equal(hvd.alltoall(np.full(SIZE, RANK)), np.arange(SIZE))
    hvd.barrier()
    assert same_everywhere(hvd.join())


class _TimeLimit(Exception):
    """What the timer raises in the waiting caller (pytest-timeout raises its own)."""


def _raise_in_join_after(seconds: float) -> None:
    """Raise _TimeLimit in the main thread after *seconds*, once it is back from an
    engine step (an exception inside a step stops the engine by design: the step's
    collective cannot be finished)."""
    driver = state().engine.driver

    def handler(signum, frame):
        if driver._owner == threading.get_ident():
            signal.setitimer(signal.ITIMER_REAL, 0.001)  # inside a step: a moment later
            return
        raise _TimeLimit()

    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def leave_join_after(seconds: float) -> None:
    """Call join() and leave it after *seconds* through an exception."""
    previous = signal.getsignal(signal.SIGALRM)
    try:
        _raise_in_join_after(seconds)
        with pytest.raises(_TimeLimit):
            hvd.join()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_join_left_by_a_timeout_leaves_nothing_joined():
    # Rank 0's join() ends in a timeout while the others have not joined.  Then
    # broadcast and allgather (which cannot run beside a joined rank) work on
    # every rank, and every rank can join again.
    if RANK == 0:
        leave_join_after(0.5)
    mpi_sync()
    assert hvd.broadcast(np.full(2, RANK), 0, name="left.bc")[0] == 0
    np.testing.assert_array_equal(hvd.allgather(np.full((1, 1), RANK)).ravel(), np.arange(SIZE))
    total = hvd.allreduce(np.ones(2), op=hvd.Sum, name="left.ar")
    np.testing.assert_allclose(total, np.full(2, float(SIZE)))  # rank 0 adds ones, not zeros
    assert same_everywhere(hvd.join())


def test_a_join_after_a_failed_collective_and_a_left_join():
    # A mismatch (rank-dependent shapes) fails everywhere; rank 1 leaves a join
    # early; then rank 0 joins, the others' allgather fails (rank 0, and only
    # rank 0, has joined), and the join completes with every rank.
    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        hvd.allreduce(np.ones(RANK + 1), name="join.after.mismatch")
    if RANK == 1:
        leave_join_after(0.3)
    mpi_sync()
    if RANK == 0:
        last = hvd.join()
    else:
        with pytest.raises(hvd.HorovodInternalError, match=r"ranks \[0\] have called join"):
            hvd.allgather(np.ones((1, 2)), name="join.after.ag")
        last = hvd.join()
    assert last != 0
    assert same_everywhere(last)
