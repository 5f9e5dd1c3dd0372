"""join(): ranks that run out of data early, while the others keep reducing.

Runs under mpiexec at 1, 2 and 3 ranks.  Rank r runs a rank-dependent number
of steps, then joins; in step s only ranks that have not joined contribute.
A joined rank adds zeros to allreduces (Average still divides by the full
size); every other collective fails, as in Horovod, on the ranks that call it
while a rank has joined.  join() returns the rank that joined last, the same
everywhere, and leaves nothing of the join behind.
"""

import itertools

import numpy as np
import pytest
from core_helpers import expect_internal_error, same_everywhere

import hvdlite as hvd

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
RANKS = range(SIZE)


def run_steps(steps_of, tag):
    """Rank r runs steps_of(r) steps of allreduce/allgather/reducescatter, then joins."""
    for s in range(steps_of(RANK)):
        active = [r for r in RANKS if steps_of(r) > s]
        value = RANK + 1
        # 160 KB: through shared memory where the ranks share a node (small ones
        # below go through MPI), so a joined rank's zeros are tested on both paths.
        avg = hvd.allreduce(np.full(20_000, float(value)), op=hvd.Average, name=f"{tag}.avg.{s}")
        np.testing.assert_allclose(avg, np.full(20_000, sum(r + 1 for r in active) / SIZE))
        total = hvd.allreduce(np.full(3, value, np.int64), op=hvd.Sum, name=f"{tag}.sum.{s}")
        np.testing.assert_array_equal(total, np.full(3, sum(r + 1 for r in active)))
        grouped = hvd.grouped_allreduce(
            [
                np.full(2, float(value)),
                np.full(5, 2.0 * value),
                np.full(300_000, float(value), np.float32),
            ],
            op=hvd.Sum,
            name=f"{tag}.group.{s}",
        )
        np.testing.assert_allclose(grouped[1], np.full(5, 2.0 * sum(r + 1 for r in active)))
        # The 1.2 MB tensor is not fused through MPI's buffer: joined ranks add zeros too.
        np.testing.assert_allclose(grouped[2], float(sum(r + 1 for r in active)))
        if len(active) < SIZE:
            continue  # only allreduce runs while a rank has joined
        gathered = hvd.allgather(np.full((value, 2), RANK, np.int32), name=f"{tag}.ag.{s}")
        expected = np.concatenate([np.full((r + 1, 2), r, np.int32) for r in active])
        np.testing.assert_array_equal(gathered, expected)
        shard = hvd.reducescatter(
            np.full((SIZE, 2), float(value)), op=hvd.Sum, name=f"{tag}.rs.{s}"
        )
        np.testing.assert_allclose(shard, np.full((1, 2), float(sum(r + 1 for r in active))))
    return hvd.join()


def test_join_returns_last_rank_and_joined_ranks_contribute_zeros():
    # Rank r runs r + 1 steps: rank SIZE-1 is necessarily the last to join.
    last = run_steps(lambda r: r + 1, "join1")
    assert last == SIZE - 1
    assert same_everywhere(last)


def test_join_again_with_another_last_rank():
    # The coordinator forgot the previous join: this time rank 0 runs longest.
    last = run_steps(lambda r: SIZE - r + 1, "join2")
    assert last == 0
    assert same_everywhere(last)


def test_join_at_once_everywhere():
    last = hvd.join()
    assert 0 <= last < SIZE
    assert same_everywhere(last)


def test_collectives_and_cache_work_after_join():
    for _ in range(3):
        out = hvd.allreduce(np.full(2, RANK + 1.0), op=hvd.Sum, name="after.join")
        np.testing.assert_allclose(out, np.full(2, float(sum(r + 1 for r in RANKS))))
    assert hvd.broadcast(np.full(2, RANK), 0, name="after.join.bc")[0] == 0
    hvd.barrier()


@pytest.mark.skipif(SIZE < 2, reason="needs a rank that joined while another still works")
def test_only_allreduce_runs_while_a_rank_has_joined():
    if RANK == 0:
        last = hvd.join()
    else:
        h = hvd.broadcast_async(np.ones(2), 1, name="join.bc")
        expect_internal_error(h, "join", "'join.bc'")
        h = hvd.alltoall_async(np.ones(SIZE), name="join.a2a")
        expect_internal_error(h, "join")
        h = hvd.allgather_async(np.ones((1, 2)), name="join.ag")
        expect_internal_error(h, "join", "'join.ag'", "only allreduce")
        h = hvd.reducescatter_async(np.ones((SIZE, 2)), name="join.rs")
        expect_internal_error(h, "join", "'join.rs'")
        # allreduce still works with rank 0 joined (it contributes zeros)
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="join.ar")
        np.testing.assert_allclose(out, np.full(2, SIZE - 1.0))
        last = hvd.join()
    assert 1 <= last < SIZE
    assert same_everywhere(last)


@pytest.mark.skipif(SIZE < 2, reason="needs a rank that joined while another still works")
def test_nothing_of_a_join_remains_after_it_returns_everywhere():
    # A rank whose collective failed at once (rank 0 has joined) joins next; once
    # join() has returned everywhere every kind of collective runs again, named or
    # not, and a second join works.  (The failing call is named: automatic names
    # count calls, and rank 0 does not make this one.)
    if RANK != 0:
        expect_internal_error(hvd.allgather_async(np.ones((1, 1)), name="join.fails"), "join")
    first = hvd.join()
    assert same_everywhere(first)
    assert hvd.broadcast(np.full(2, RANK), 0)[0] == 0
    gathered = hvd.allgather(np.full((1, 1), RANK))
    np.testing.assert_array_equal(gathered.ravel(), np.arange(SIZE))
    shard = hvd.reducescatter(np.ones((SIZE, 1)), op=hvd.Sum)
    np.testing.assert_allclose(shard, np.full((1, 1), float(SIZE)))
    assert same_everywhere(hvd.join())


# Cached names while a rank joins: see tests/mpi_scripts/core_join_cached.py (run from
# tests/test_core_launch.py, because today it aborts the whole MPI job).


def test_cached_names_that_change_shape_and_dtype_around_joins():
    # Horovod's test_horovod_join_allreduce, condensed: the same two names, cached or
    # not, change shape and dtype between joins, and a different rank joins first each
    # time.  A rank that admitted a name a cycle after the join ended used to wait on
    # its cache bit while the others had sent theirs to the coordinator: a hang at 3
    # ranks (the join's end is now decided by each cycle's global flag).
    for _, dtype, dim, first, cached in itertools.product(
        range(3), (np.int64, np.float64), (1, 2, 3), RANKS, (False, True)
    ):
        a = np.full((5,) * dim, 3, dtype)
        b = np.full((17,) * dim, 4, dtype)
        if cached:
            ha = hvd.allreduce_async(a, name="join.a", op=hvd.Sum)
            hb = hvd.allreduce_async(b, name="join.b", op=hvd.Sum)
            assert hvd.synchronize(ha)[(0,) * dim] == 3 * SIZE
            assert hvd.synchronize(hb)[(0,) * dim] == 4 * SIZE
        if RANK != first:
            ha = hvd.allreduce_async(a, name="join.a", op=hvd.Sum)
            hb = hvd.allreduce_async(b, name="join.b", op=hvd.Sum)
            assert hvd.synchronize(ha)[(0,) * dim] == 3 * (SIZE - 1)
            assert hvd.synchronize(hb)[(0,) * dim] == 4 * (SIZE - 1)
        last = hvd.join()
        assert last in RANKS and (SIZE == 1 or last != first) and same_everywhere(last)
