"""Static process sets registered at init(), collectives on overlapping sets at once.

Runs under mpiexec at 1, 2 and 3 ranks.  The sets depend on the world size:
3 ranks: [0, 1] and [1, 2] (overlapping in rank 1); 2 ranks: [0] and [1];
1 rank: none (the only possible set would duplicate the global one).  This
module also sets HVDLITE_DYNAMIC_PROCESS_SETS=1 before init, so it checks that
the knob enables add_process_set() beside the static sets.
"""

import os

import numpy as np
import pytest
from core_helpers import WAIT, assert_same, check_engine_works, wait_all

os.environ["HVDLITE_DYNAMIC_PROCESS_SETS"] = "1"

import hvdlite as hvd  # noqa: E402
from mpi4py import MPI  # noqa: E402

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

_WORLD = MPI.COMM_WORLD.Get_size()
STATIC = {3: [[0, 1], [1, 2]], 2: [[0], [1]]}.get(_WORLD, [])
SETS = [hvd.ProcessSet(ranks) for ranks in STATIC]
hvd.init(process_sets=SETS)
RANK, SIZE = hvd.rank(), hvd.size()

needs_sets = pytest.mark.skipif(
    SIZE == 1, reason="at one rank every set duplicates the global set, so none is registered"
)


def mine():
    return [ps for ps in SETS if RANK in ps.ranks]


def test_registered_sets_have_ids_and_accessors():
    ids = [ps.process_set_id for ps in SETS]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(set(ids)) == len(ids)
    for ps, ranks in zip(SETS, STATIC):
        assert ps.ranks == ranks
        assert ps.size() == len(ranks)
        assert ps.included() == (RANK in ranks)
        assert ps.rank() == (ranks.index(RANK) if RANK in ranks else None)
    g = hvd.global_process_set
    assert g.process_set_id == 0 and g.ranks == list(range(SIZE)) and g.size() == SIZE
    assert g.included() and g.rank() == RANK


@needs_sets
def test_collectives_on_each_set():
    for ps in mine():
        tag = f"ps{ps.process_set_id}"
        ranks = ps.ranks
        out = hvd.allreduce(np.full(3, RANK + 1.0), op=hvd.Sum, name=f"{tag}.ar", process_set=ps)
        assert_same(out, np.full(3, float(sum(r + 1 for r in ranks))))
        out = hvd.allreduce(np.full(3, RANK + 1.0), name=f"{tag}.avg", process_set=ps)
        assert_same(out, np.full(3, sum(r + 1 for r in ranks) / len(ranks)))
        out = hvd.allgather(np.full((RANK + 1, 2), RANK), name=f"{tag}.ag", process_set=ps)
        assert_same(out, np.concatenate([np.full((r + 1, 2), r) for r in ranks]))
        root = ranks[-1]  # a global rank
        out = hvd.broadcast(np.full(2, RANK), root, name=f"{tag}.bc", process_set=ps)
        assert_same(out, np.full(2, root))
        x = np.arange(len(ranks) * 2) + 100 * RANK
        out = hvd.alltoall(x, name=f"{tag}.a2a", process_set=ps)
        me = ranks.index(RANK)
        assert_same(out, np.array([100 * r + 2 * me + k for r in ranks for k in range(2)]))
        out = hvd.reducescatter(
            np.full((len(ranks), 2), RANK + 1.0), op=hvd.Sum, name=f"{tag}.rs", process_set=ps
        )
        assert_same(out, np.full((1, 2), float(sum(r + 1 for r in ranks))))
        outs = hvd.grouped_allreduce(
            [np.ones(2), np.ones(3, np.int32)], op=hvd.Sum, name=f"{tag}.gar", process_set=ps
        )
        assert_same(outs[1], np.full(3, len(ranks), np.int32))
        hvd.barrier(process_set=ps)
        assert hvd.broadcast_object(("obj", RANK), root_rank=root, process_set=ps) == ("obj", root)
        assert hvd.allgather_object(RANK, process_set=ps) == ranks


@needs_sets
def test_unnamed_collectives_count_per_set():
    # At 3 ranks rank 1 calls unnamed collectives on two sets, ranks 0 and 2 on one:
    # automatic names must still match within each set.
    for _ in range(2):
        for ps in mine():
            out = hvd.allreduce(np.ones(2), op=hvd.Sum, process_set=ps)
            assert_same(out, np.full(2, float(len(ps.ranks))))
            hvd.barrier(process_set=ps)
            assert hvd.allgather_object(RANK, process_set=ps) == ps.ranks
    out = hvd.allreduce(np.ones(2), op=hvd.Sum)  # and the global set's count is its own
    assert_same(out, np.full(2, float(SIZE)))


@needs_sets
def test_overlapping_sets_concurrently_in_rank_dependent_order():
    # Every rank starts its collectives on all its sets and the global set at once, in an
    # order that differs between ranks; none may deadlock and every result must be right.
    for round_ in range(3):
        jobs = [(ps, f"conc.{round_}.ps{ps.process_set_id}") for ps in mine()]
        jobs.append((hvd.global_process_set, f"conc.{round_}.global"))
        if RANK % 2:
            jobs.reverse()
        handles = []
        for ps, name in jobs:
            handles.append(
                hvd.allreduce_async(np.full(4, RANK + 1.0), op=hvd.Sum, name=name, process_set=ps)
            )
            handles.append(
                hvd.allgather_async(np.full((1,), RANK), name=name + ".ag", process_set=ps)
            )
        results = wait_all(handles)
        for k, (ps, _) in enumerate(jobs):
            assert_same(results[2 * k], np.full(4, float(sum(r + 1 for r in ps.ranks))))
            assert_same(results[2 * k + 1], np.array(ps.ranks))


@needs_sets
def test_repeated_names_on_sets():
    # A training loop: the same names every step, on each set and on the global set.
    for step in range(4):
        handles = [
            hvd.allreduce_async(np.full(2, RANK + step), op=hvd.Sum, name="loop.ar", process_set=ps)
            for ps in mine()
        ]
        handles.append(hvd.allreduce_async(np.full(2, RANK + step), op=hvd.Sum, name="loop.ar"))
        for ps, out in zip(mine() + [hvd.global_process_set], wait_all(handles)):
            assert_same(out, np.full(2, sum(r + step for r in ps.ranks)))
        for ps in mine():
            out = hvd.broadcast(np.full(2, RANK), ps.ranks[0], name="loop.bc", process_set=ps)
            assert_same(out, np.full(2, ps.ranks[0]))


@needs_sets
def test_same_name_in_two_sets_at_once():
    handles = [
        hvd.allreduce_async(np.full(2, RANK + 1.0), op=hvd.Sum, name="shared.name", process_set=ps)
        for ps in mine()
    ]
    for ps, h in zip(mine(), handles):
        assert_same(h.result(timeout=WAIT), np.full(2, float(sum(r + 1 for r in ps.ranks))))


@needs_sets
def test_non_member_gets_value_error():
    others = [ps for ps in SETS if RANK not in ps.ranks]
    if not others:
        pytest.skip("this rank is in every set")  # no collective here: a per-rank skip is safe
    for ps in others:
        for call in (
            lambda ps=ps: hvd.allreduce(np.ones(2), name="nm", process_set=ps),
            lambda ps=ps: hvd.allgather(np.ones((1, 2)), name="nm", process_set=ps),
            lambda ps=ps: hvd.broadcast(np.ones(2), ps.ranks[0], name="nm", process_set=ps),
            lambda ps=ps: hvd.barrier(process_set=ps),
        ):
            with pytest.raises(ValueError, match="not a member") as info:
                call()
            assert str(RANK) in str(info.value)


@needs_sets
def test_root_outside_the_set_is_rejected():
    for ps in mine():
        outsiders = [r for r in range(SIZE) if r not in ps.ranks]
        for root in outsiders:
            with pytest.raises(ValueError, match="root_rank"):
                hvd.broadcast(np.ones(2), root, name="bad.root.ps", process_set=ps)


@needs_sets
def test_mismatch_inside_a_set_names_the_ranks():
    for ps in mine():
        if len(ps.ranks) < 2:
            continue
        odd = RANK == ps.ranks[-1]
        h = hvd.allreduce_async(
            np.ones(3 if odd else 2), name=f"mm.ps{ps.process_set_id}", process_set=ps
        )
        with pytest.raises(hvd.HorovodInternalError, match="shape") as info:
            h.result(timeout=WAIT)
        assert f"rank {ps.ranks[-1]}: (3,)" in str(info.value)
    check_engine_works("after.ps.mismatch")


def test_dynamic_knob_allows_adding_beside_static_sets():
    # Registering the ranks of an existing set again is refused on every rank.
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(list(range(SIZE)))
    for ranks in STATIC:
        with pytest.raises(ValueError, match="already registered"):
            hvd.add_process_set(ranks)
    if SIZE < 3:
        return  # every set of 1 or 2 ranks is already registered
    extra = hvd.add_process_set([0, 2])
    assert extra.process_set_id not in [ps.process_set_id for ps in SETS] + [0]
    if RANK in (0, 2):
        out = hvd.allreduce(np.full(2, RANK), op=hvd.Sum, name="dyn", process_set=extra)
        assert_same(out, np.full(2, 2))
    assert hvd.remove_process_set(extra)
    assert extra.process_set_id is None
    check_engine_works("after.dyn")
    for ps in mine():  # the static sets still work
        check_engine_works(f"after.dyn.ps{ps.process_set_id}", ps)


@needs_sets
def test_join_with_process_sets():
    # Rank 0 joins at once; the others reduce on their sets (rank 0 adds zeros where it
    # is a member), then join.
    if RANK == 0:
        last = hvd.join()
    else:
        for ps in mine():
            active = [r for r in ps.ranks if r != 0]
            for step in range(2):
                out = hvd.allreduce(
                    np.full(2, RANK + 1.0), op=hvd.Sum, name=f"pj.{step}", process_set=ps
                )
                assert_same(out, np.full(2, float(sum(r + 1 for r in active))))
        last = hvd.join()
    assert last != 0 and hvd.allgather_object(last) == [last] * SIZE
