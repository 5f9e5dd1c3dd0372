"""Dynamic process sets: init(process_sets="dynamic"), then add/remove at run time.

Runs under mpiexec at 1, 2 and 3 ranks.  Sets are built from the world size
(even ranks, odd ranks), so the module holds at any size; at one rank only the
checks that need no second set run.
"""

import numpy as np
import pytest
from core_helpers import WAIT, assert_same, check_engine_works, wait_all

import hvdlite as hvd
from mpi4py import MPI

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init(process_sets="dynamic")
RANK, SIZE = hvd.rank(), hvd.size()

EVEN = [r for r in range(SIZE) if r % 2 == 0]
ODD = [r for r in range(SIZE) if r % 2 == 1]

needs_two = pytest.mark.skipif(SIZE < 2, reason="at one rank every set duplicates the global one")


def test_add_existing_ranks_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(list(range(SIZE)))
    with pytest.raises(ValueError, match="outside"):
        hvd.add_process_set([SIZE])
    with pytest.raises(ValueError, match="distinct"):
        hvd.add_process_set([0, 0])
    # as in Horovod: False, not an error, for the global set and for a set without an id
    assert hvd.remove_process_set(hvd.global_process_set) is False
    assert hvd.remove_process_set(hvd.ProcessSet([0])) is False
    check_engine_works("after.refused")


@needs_two
def test_add_use_remove():
    evens = hvd.add_process_set(EVEN)
    odds = hvd.add_process_set(hvd.ProcessSet(ODD))
    assert isinstance(evens, hvd.ProcessSet) and isinstance(odds, hvd.ProcessSet)
    assert 0 < evens.process_set_id < odds.process_set_id
    assert evens.ranks == EVEN and odds.ranks == ODD
    mine, other = (evens, odds) if RANK % 2 == 0 else (odds, evens)
    assert mine.included() and not other.included()
    assert mine.rank() == mine.ranks.index(RANK) and other.rank() is None

    for step in range(3):  # repeated: the second and third go through the response cache
        out = hvd.allreduce(np.full(3, RANK + 1.0), op=hvd.Sum, name="dyn.ar", process_set=mine)
        assert_same(out, np.full(3, float(sum(r + 1 for r in mine.ranks))))
        out = hvd.allgather(np.full((1, 2), RANK), name=f"dyn.ag.{step}", process_set=mine)
        assert_same(out, np.repeat(np.array(mine.ranks), 2).reshape(-1, 2))
        out = hvd.broadcast(np.full(2, RANK), mine.ranks[-1], name="dyn.bc", process_set=mine)
        assert_same(out, np.full(2, mine.ranks[-1]))
        hvd.barrier(process_set=mine)
    with pytest.raises(ValueError, match="not a member"):
        hvd.allreduce(np.ones(2), name="dyn.other", process_set=other)

    assert hvd.remove_process_set(odds)
    assert hvd.remove_process_set(evens)
    assert evens.process_set_id is None and odds.process_set_id is None
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(np.ones(2), name="dyn.removed", process_set=mine)
    check_engine_works("after.remove")


@needs_two
def test_add_again_after_remove_and_concurrent_with_global():
    ps = hvd.add_process_set(EVEN)
    first_id = ps.process_set_id
    handles = [hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dyn2.global")]
    if RANK in EVEN:
        handles.append(hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dyn2.ps", process_set=ps))
    results = wait_all(handles)
    assert_same(results[0], np.full(2, float(SIZE)))
    if RANK in EVEN:
        assert_same(results[1], np.full(2, float(len(EVEN))))
    hvd.remove_process_set(ps)
    again = hvd.add_process_set(EVEN)
    assert again.process_set_id is not None
    assert len(set(hvd.allgather_object((first_id, again.process_set_id)))) == 1
    if RANK in EVEN:
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="dyn2.ps", process_set=again)
        assert_same(out, np.full(2, float(len(EVEN))))
    hvd.remove_process_set(again)


@needs_two
def test_removing_a_set_fails_its_pending_collectives():
    ps = hvd.add_process_set(EVEN)
    pending = None
    if RANK == 0 and len(EVEN) > 1:
        # Rank 2 never submits this, so it is still pending when the set goes away.
        pending = hvd.allreduce_async(np.ones(2), name="dyn3.pending", process_set=ps)
    hvd.allreduce(np.ones(1), name="dyn3.sync")  # rank 0's submission is in the engine now
    hvd.remove_process_set(ps)
    if pending is not None:
        with pytest.raises(hvd.HorovodInternalError, match="removed"):
            pending.result(timeout=WAIT)
    check_engine_works("after.dyn3")


def registry_everywhere():
    """(id, ranks) of every registered set, the same on every rank when consistent."""
    from hvdlite.engine import runtime

    table = runtime.state().sets
    return sorted((ps.process_set_id, tuple(ps.ranks)) for ps in table.all())


@needs_two
def test_a_failed_collective_or_an_exception_leaves_the_registry_consistent():
    before = registry_everywhere()
    ps = hvd.add_process_set(EVEN)
    try:
        if RANK in EVEN and len(EVEN) > 1:
            shape = (3,) if RANK == EVEN[-1] else (2,)  # a mismatch inside the set
            with pytest.raises(hvd.HorovodInternalError, match="Mismatched"):
                hvd.allreduce(np.ones(shape), name="dyn4.mismatch", process_set=ps)
        raise KeyError("the program fails between add and remove")
    except KeyError:
        pass
    finally:
        hvd.remove_process_set(ps)
    assert registry_everywhere() == before
    assert all(r == before for r in hvd.allgather_object(registry_everywhere()))
    again = hvd.add_process_set(EVEN)  # the ranks are free again, with one id everywhere
    assert len(set(hvd.allgather_object(again.process_set_id))) == 1
    if RANK in EVEN:
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="dyn4.after", process_set=again)
        assert_same(out, np.full(2, float(len(EVEN))))
    hvd.remove_process_set(again)
    check_engine_works("after.dyn4")


@needs_two
def test_refused_adds_change_nothing_anywhere():
    before = registry_everywhere()
    for bad in ([SIZE], [], list(range(SIZE))):
        with pytest.raises(ValueError):
            hvd.add_process_set(bad)
    assert registry_everywhere() == before
    ps = hvd.add_process_set(EVEN)
    assert len(set(hvd.allgather_object(ps.process_set_id))) == 1
    hvd.remove_process_set(ps)


@pytest.mark.skipif(SIZE < 3, reason="needs a set and a later one with other members")
def test_unnamed_collectives_on_a_reused_id_start_counting_again():
    # Rank 0 counts two unnamed allreduces on a set of its own; the set's id then goes to
    # a set of ranks 0 and 2, whose unnamed collectives must still pair up by name.
    # Started again, so that no earlier test's removed ids are waiting to be given.
    MPI.COMM_WORLD.Barrier()
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    alone = hvd.add_process_set([0])
    assert alone.process_set_id == 1
    if RANK == 0:
        for _ in range(2):
            hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=alone)
    old_id = alone.process_set_id
    hvd.remove_process_set(alone)
    pair = hvd.add_process_set([0, 2])
    assert pair.process_set_id == old_id
    if RANK in (0, 2):
        handle = hvd.allreduce_async(np.ones(2), op=hvd.Sum, process_set=pair)
        assert_same(hvd.synchronize(handle), np.full(2, 2.0))
    hvd.remove_process_set(pair)
    check_engine_works("after.reused.id")
