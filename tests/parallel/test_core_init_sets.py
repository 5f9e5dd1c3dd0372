"""init(process_sets=[...]) as Horovod runs it: communicators that show each rank its own
part, a list with duplicates, and init() called again while the job runs.

Runs under mpiexec at 1, 2 and 3 ranks.  The tests run in order in one process: the
first finds hvdlite not initialized, the second starts it (with duplicates, so it
raises), the later ones call init() again.  Every rank runs the same calls; where
a rank's own list decides the outcome (a later init() is local), the test says so.
"""

import numpy as np
import pytest
from core_helpers import assert_same, check_engine_works
from mpi4py import MPI

import hvdlite as hvd
from hvdlite import basics

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
# Even and odd ranks: each rank's communicator holds its own half.
HALF = WORLD.Split(color=RANK % 2, key=RANK)
MY_HALF = [r for r in range(SIZE) if r % 2 == RANK % 2]


def _expected_table() -> dict[int, list[int]]:
    """The sets the first init registers: the halves (rank 0's first), then [0], each
    only where it is not a set already or every rank."""
    order = []
    for ranks in ([r for r in range(SIZE) if r % 2 == 0], [r for r in range(SIZE) if r % 2], [0]):
        if ranks and ranks != list(range(SIZE)) and ranks not in order:
            order.append(ranks)
    return {0: list(range(SIZE)), **{i + 1: ranks for i, ranks in enumerate(order)}}


@pytest.mark.skipif(SIZE < 2, reason="one rank has one view of every communicator")
def test_communicators_whose_members_disagree_fail_init_on_every_rank():
    # Rank 0 gives the whole world where the others give a communicator of their own.
    world_copy = WORLD.Dup()  # collective: every rank makes it
    mine = world_copy if RANK == 0 else MPI.COMM_SELF
    with pytest.raises(ValueError, match="do not agree on it"):
        hvd.init(process_sets=[hvd.ProcessSet(mine)])
    assert not hvd.is_initialized()
    world_copy.Free()


def test_a_list_with_duplicates_starts_the_job_then_raises_on_every_rank():
    first = hvd.ProcessSet(HALF)
    world_copy = hvd.ProcessSet(WORLD.Dup())  # every rank: the global set again
    zero = hvd.ProcessSet([0])
    zero_again = hvd.ProcessSet([0])
    with pytest.raises(ValueError, match="lists a set twice") as info:
        hvd.init(comm=WORLD, process_sets=[first, world_copy, zero, zero_again])
    assert "hvd.init(process_sets=[...]) again" in str(info.value)
    # initialized nevertheless, as Horovod is
    assert hvd.is_initialized() and hvd.size() == SIZE and hvd.rank() == RANK
    assert basics._get_process_set_ids_and_ranks() == _expected_table()
    assert hvd.global_process_set.mpi_comm is WORLD
    assert world_copy.process_set_id is None and zero_again.process_set_id is None
    if MY_HALF != list(range(SIZE)):
        assert first.ranks == MY_HALF and first.process_set_id in (1, 2)
    check_engine_works("after.duplicates")


def test_a_later_init_gives_new_objects_the_registered_ids():
    table = basics._get_process_set_ids_and_ranks()
    id_of = {tuple(ranks): set_id for set_id, ranks in table.items()}
    if MY_HALF == list(range(SIZE)):
        pytest.skip("at one rank every set is the global one")
    half, zero = hvd.ProcessSet(HALF), hvd.ProcessSet([0])
    hvd.init(process_sets=[half, zero] if MY_HALF != [0] else [half])
    assert half.process_set_id == id_of[tuple(MY_HALF)] and half.ranks == MY_HALF
    if MY_HALF != [0]:
        assert zero.process_set_id == id_of[(0,)]
    assert basics._get_process_set_ids_and_ranks() == table  # nothing registered
    out = hvd.allreduce(np.full(2, RANK + 1.0), op=hvd.Sum, name="half.sum", process_set=half)
    assert_same(out, np.full(2, float(sum(r + 1 for r in MY_HALF))))


def test_a_later_init_decides_on_each_ranks_own_list():
    # Horovod's rule, local to each rank: the even half and the set of even ranks given as
    # ranks are one set on the even ranks (a duplicate there) and two sets on the odd ones.
    evens = [r for r in range(SIZE) if r % 2 == 0]
    if SIZE < 3:
        pytest.skip("needs an even half of two ranks and an odd half")
    half, even_ranks = hvd.ProcessSet(HALF), hvd.ProcessSet(evens)
    if RANK % 2 == 0:
        with pytest.raises(ValueError, match="lists a set twice"):
            hvd.init(process_sets=[half, even_ranks])
        assert half.process_set_id == 1 and even_ranks.process_set_id is None
    else:
        hvd.init(process_sets=[half, even_ranks])
        assert (half.process_set_id, even_ranks.process_set_id) == (2, 1)
    check_engine_works("after.local.init")


def test_a_later_init_with_a_set_that_is_not_registered_fails_without_a_collective():
    with pytest.raises(ValueError, match="outside the world"):
        hvd.init(process_sets=[hvd.ProcessSet([SIZE])])
    if SIZE >= 3:
        with pytest.raises(ValueError, match="did not register"):
            hvd.init(process_sets=[hvd.ProcessSet([1, 2])])
    hvd.init()  # nothing to match: nothing happens
    check_engine_works("after.unknown.set")


def test_the_framework_modules_reach_the_table_as_horovods_tests_do():
    import hvdlite.torch as hvd_torch

    table = hvd_torch.mpi_ops._basics._get_process_set_ids_and_ranks()
    assert table == basics._get_process_set_ids_and_ranks() == _expected_table()
