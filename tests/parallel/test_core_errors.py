"""Error paths of the engine: cross-rank mismatches, duplicate names, bad arguments.

Runs under mpiexec at 1, 2 and 3 ranks.  Mismatch tests need a second rank to
disagree with, so they skip at one rank; argument checks run everywhere.  In a
mismatch test rank 1 is the odd one out: every rank must get a
HorovodInternalError that names the field and the ranks, promptly (long before
any stall timeout), and the engine must keep working afterwards.
"""

import time

import numpy as np
import pytest
from core_helpers import WAIT, check_engine_works, expect_internal_error

import hvdlite as hvd

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
ODD = RANK == 1
OTHERS = "ranks 0, 2" if SIZE == 3 else "rank 0"

needs_two = pytest.mark.skipif(SIZE < 2, reason="a mismatch needs a second rank to disagree")

#: A mismatch is answered as soon as every rank submitted: far below any stall timeout.
PROMPT = 5.0


def mismatch(submit, *fragments, check_name):
    """Submit (rank-dependent) via *submit*; every rank must fail promptly naming *fragments*."""
    start = time.monotonic()
    handle = submit()
    message = expect_internal_error(handle, *fragments)
    assert time.monotonic() - start < PROMPT, f"mismatch took {time.monotonic() - start:.1f}s"
    check_engine_works(check_name)
    return message


# ------------------------------------------------------------- mismatches
@needs_two
def test_shape_mismatch():
    shape = (5,) if ODD else (4,)
    msg = mismatch(
        lambda: hvd.allreduce_async(np.ones(shape, np.float32), name="mm.shape"),
        "shape",
        "'mm.shape'",
        "rank 1: (5,)",
        f"{OTHERS}: (4,)",
        check_name="mm.shape.after",
    )
    assert "allreduce" in msg


@needs_two
def test_dtype_mismatch():
    dtype = np.float64 if ODD else np.float32
    msg = mismatch(
        lambda: hvd.allreduce_async(np.ones(4, dtype), name="mm.dtype"),
        "dtype",
        "rank 1",
        check_name="mm.dtype.after",
    )
    assert "float64" in msg or np.dtype(np.float64).str in msg
    assert "float32" in msg or np.dtype(np.float32).str in msg


@needs_two
def test_op_mismatch():
    op = hvd.Sum if ODD else hvd.Average
    mismatch(
        lambda: hvd.allreduce_async(np.ones(4), op=op, name="mm.op"),
        "reduction op",
        "rank 1: Sum",
        f"{OTHERS}: Average",
        check_name="mm.op.after",
    )


@needs_two
def test_root_rank_mismatch():
    root = 1 if ODD else 0
    mismatch(
        lambda: hvd.broadcast_async(np.ones(4), root, name="mm.root"),
        "root rank",
        "broadcast",
        "rank 1: 1",
        f"{OTHERS}: 0",
        check_name="mm.root.after",
    )


@needs_two
def test_prescale_mismatch():
    pre = 2.0 if ODD else 1.0
    mismatch(
        lambda: hvd.allreduce_async(np.ones(4), prescale_factor=pre, name="mm.pre"),
        "prescale_factor",
        "rank 1: 2.0",
        check_name="mm.pre.after",
    )


@needs_two
def test_postscale_mismatch():
    post = 0.5 if ODD else 1.0
    mismatch(
        lambda: hvd.allreduce_async(np.ones(4), postscale_factor=post, name="mm.post"),
        "postscale_factor",
        "rank 1: 0.5",
        check_name="mm.post.after",
    )


@needs_two
def test_collective_kind_mismatch():
    def submit():
        if ODD:
            return hvd.allgather_async(np.ones((1, 4)), name="mm.kind")
        return hvd.allreduce_async(np.ones(4), name="mm.kind")

    mismatch(
        submit,
        "collective",
        "rank 1: allgather",
        f"{OTHERS}: allreduce",
        check_name="mm.kind.after",
    )


@needs_two
def test_allgather_trailing_shape_mismatch_but_dim0_may_differ():
    trailing = 4 if ODD else 3
    mismatch(
        lambda: hvd.allgather_async(np.ones((RANK + 1, trailing)), name="mm.ag"),
        "shape",
        "allgather",
        "rank 1: (4,)",
        check_name="mm.ag.after",
    )


@needs_two
def test_reducescatter_and_grouped_mismatches():
    rows = SIZE + 1 if ODD else SIZE
    mismatch(
        lambda: hvd.reducescatter_async(np.ones((rows, 2)), name="mm.rs"),
        "shape",
        "reducescatter",
        "rank 1",
        check_name="mm.rs.after",
    )
    count = 3 if ODD else 2
    mismatch(
        lambda: hvd.grouped_allreduce_async([np.ones(2)] * count, name="mm.group"),
        "'mm.group'",
        "rank 1",
        check_name="mm.group.after",
    )


@needs_two
def test_every_rank_fails_even_when_submitting_at_different_times():
    # The odd rank submits late: the others' handles wait, then fail together with it.
    if ODD:
        time.sleep(0.3)
    shape = (2,) if ODD else (3,)
    mismatch(
        lambda: hvd.allreduce_async(np.ones(shape), name="mm.late"),
        "shape",
        check_name="mm.late.after",
    )


@needs_two
def test_cached_name_resubmitted_with_different_shape():
    x = np.full(4, RANK + 1.0)
    for _ in range(3):  # the name runs, then is answered from the response cache
        assert hvd.allreduce(x, op=hvd.Sum, name="mm.cached")[0] == sum(range(1, SIZE + 1))
    shape = (6,) if ODD else (4,)
    mismatch(
        lambda: hvd.allreduce_async(np.ones(shape), op=hvd.Sum, name="mm.cached"),
        "shape",
        "'mm.cached'",
        "rank 1: (6,)",
        check_name="mm.cached.after",
    )
    # Afterwards the name works again, with the old shape and then a new agreed shape.
    for _ in range(2):
        assert hvd.allreduce(x, op=hvd.Sum, name="mm.cached")[0] == sum(range(1, SIZE + 1))
    y = np.ones(7)
    for _ in range(2):
        assert hvd.allreduce(y, op=hvd.Sum, name="mm.cached")[0] == SIZE


@needs_two
@pytest.mark.parametrize("late", ["odd", "others"])
def test_cached_name_changed_on_one_rank_that_submits_at_another_time(late):
    # One side waits on a cache hit while the other side's changed request arrives later
    # (or the other way round): the hit must be withdrawn and every rank must fail.
    name = f"mm.cached.late.{late}"
    for _ in range(2):
        hvd.allreduce(np.ones(4), op=hvd.Sum, name=name)
    if ODD == (late == "odd"):
        time.sleep(0.3)
    shape = (2,) if ODD else (4,)
    mismatch(
        lambda: hvd.allreduce_async(np.ones(shape), op=hvd.Sum, name=name),
        "shape",
        "rank 1: (2,)",
        check_name=name + ".after",
    )
    assert hvd.allreduce(np.ones(4), op=hvd.Sum, name=name)[0] == SIZE


@needs_two
def test_cached_name_resubmitted_with_different_op():
    for _ in range(2):
        hvd.allreduce(np.ones(3), op=hvd.Sum, name="mm.cached.op")
    op = hvd.Max if ODD else hvd.Sum
    mismatch(
        lambda: hvd.allreduce_async(np.ones(3), op=op, name="mm.cached.op"),
        "reduction op",
        "rank 1: Max",
        check_name="mm.cached.op.after",
    )
    assert hvd.allreduce(np.ones(3), op=hvd.Sum, name="mm.cached.op")[0] == SIZE


@needs_two
def test_cached_broadcast_resubmitted_with_different_root():
    for _ in range(2):
        assert hvd.broadcast(np.full(2, RANK), 0, name="mm.cached.bc")[0] == 0
    root = 1 if ODD else 0
    mismatch(
        lambda: hvd.broadcast_async(np.full(2, RANK), root, name="mm.cached.bc"),
        "root rank",
        check_name="mm.cached.bc.after",
    )
    assert hvd.broadcast(np.full(2, RANK), 1, name="mm.cached.bc")[0] == 1


def test_consistent_change_of_a_cached_name_just_works():
    for n in (3, 3, 5, 5, 2):
        out = hvd.allreduce(np.ones(n), op=hvd.Sum, name="cached.reshaped")
        assert out.shape == (n,) and out[0] == SIZE


# ---------------------------------------------------------- duplicate names
@needs_two
def test_duplicate_name_in_flight_raises_at_submission():
    # Rank 0 submits 'dup' and, while it cannot complete (the others have not submitted
    # it yet), submits it again: ValueError at once.  Then everyone completes it.
    if RANK == 0:
        first = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dup")
        with pytest.raises(ValueError, match="already in flight") as info:
            hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="dup")
        assert "'dup'" in str(info.value)
        with pytest.raises(ValueError, match="already in flight"):
            hvd.broadcast_async(np.ones(2), 0, name="dup")  # the name, whatever the op
    hvd.allreduce(np.ones(1), name="dup.sync")  # rank 0 has submitted both by now
    if RANK == 0:
        assert first.result(timeout=WAIT)[0] == SIZE
    else:
        assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="dup")[0] == SIZE
    # Once completed, the name can be used again.
    assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="dup")[0] == SIZE


def test_same_name_in_different_process_sets_is_not_a_duplicate():
    # The global set is the only one here; the check is per (set, name).
    h1 = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="unique.a")
    h2 = hvd.allreduce_async(np.ones(1), op=hvd.Sum, name="unique.b")
    assert h1.result(timeout=WAIT)[0] == SIZE and h2.result(timeout=WAIT)[0] == SIZE


# -------------------------------------------------- bad arguments: ValueError
@pytest.mark.parametrize(
    "dtype", [np.uint32, np.uint64, np.complex64, object], ids=lambda d: np.dtype(d).name
)
def test_unsupported_dtype(dtype):
    x = np.ones(3, dtype=dtype)
    for call in (
        lambda: hvd.allreduce(x, name="bad.dtype"),
        lambda: hvd.allgather(x, name="bad.dtype"),
        lambda: hvd.broadcast(x, 0, name="bad.dtype"),
        lambda: hvd.alltoall(np.ones(SIZE, dtype=dtype), name="bad.dtype"),
        lambda: hvd.reducescatter(x, name="bad.dtype"),
    ):
        with pytest.raises(ValueError) as info:
            call()
        message = str(info.value)
        assert "not supported" in message and "float32" in message and "astype" in message


def test_non_contiguous_array():
    x = np.ones((4, 4), np.float32)[:, ::2]
    assert not x.flags.c_contiguous
    calls = (
        lambda: hvd.allreduce(x, name="bad.contig"),
        lambda: hvd.allgather(x, name="bad.contig"),
        lambda: hvd.broadcast(x, 0, name="bad.contig"),
        lambda: hvd.reducescatter(x, name="bad.contig"),
        lambda: hvd.grouped_allreduce([np.ones(2), x], name="bad.contig"),
        lambda: hvd.alltoall(np.ones((SIZE * 2, 4))[:, ::2], name="bad.contig"),
    )
    for call in calls:
        with pytest.raises(ValueError, match="ascontiguousarray"):
            call()


@pytest.mark.parametrize("root", [-1, "size", "x", None])
def test_bad_root_rank(root):
    root = SIZE if root == "size" else root
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(np.ones(2), root, name="bad.root")
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast_async(np.ones(2), root, name="bad.root")


def test_bad_output_array():
    x = np.ones(4, np.float32)
    for out in (np.ones(5, np.float32), np.ones(4, np.float64), np.ones(8, np.float32)[::2]):
        with pytest.raises(ValueError, match="output"):
            hvd.allreduce(x, name="bad.out", output=out)
    read_only = np.ones(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        hvd.broadcast(x, 0, name="bad.out", output=read_only)


def test_bad_ops_and_flags():
    with pytest.raises(ValueError, match="average"):
        hvd.allreduce(np.ones(2), average=True, op=hvd.Sum, name="bad.op")
    with pytest.raises(ValueError, match="reduction op"):
        hvd.allreduce(np.ones(2), op=42, name="bad.op")
    with pytest.raises(ValueError, match="Adasum"):
        hvd.reducescatter(np.ones((SIZE, 2)), op=hvd.Adasum, name="bad.op")
    with pytest.raises(ValueError, match="number"):
        hvd.allreduce(np.ones(2), prescale_factor="big", name="bad.op")
    if SIZE & (SIZE - 1):
        with pytest.raises(ValueError, match="power-of-two"):
            hvd.allreduce(np.ones(2), op=hvd.Adasum, name="bad.op")


def test_bad_shapes_and_splits():
    with pytest.raises(ValueError, match="dimension"):
        hvd.reducescatter(np.float64(1.0), name="bad.shape")
    with pytest.raises(ValueError, match="dimension"):
        hvd.alltoall(np.float64(1.0), name="bad.shape")
    if SIZE > 1:
        with pytest.raises(ValueError, match="splits="):
            hvd.alltoall(np.ones(SIZE + 1), name="bad.split")
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(np.ones(3), splits=[4] + [0] * (SIZE - 1), name="bad.split")
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(np.ones(3), splits=[3] + [0] * SIZE, name="bad.split")
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(
            np.ones(3), splits=[-1, 4] + [0] * (SIZE - 2) if SIZE > 1 else [-1], name="bad.split"
        )
    with pytest.raises(ValueError, match="at least one"):
        hvd.grouped_allreduce([], name="bad.empty")
    with pytest.raises(ValueError, match="at least one"):
        hvd.grouped_allgather([], name="bad.empty")


def test_bad_names_and_handles():
    with pytest.raises(ValueError, match="name"):
        hvd.allreduce(np.ones(2), name="")
    with pytest.raises(ValueError, match="name"):
        hvd.allreduce(np.ones(2), name=7)
    with pytest.raises(ValueError, match="handle"):
        hvd.synchronize(np.ones(2))


def test_unregistered_process_set():
    stranger = hvd.ProcessSet([0])
    with pytest.raises(ValueError, match="not registered"):
        hvd.allreduce(np.ones(2), name="bad.set", process_set=stranger)
    with pytest.raises(ValueError, match="ProcessSet"):
        hvd.allreduce(np.ones(2), name="bad.set", process_set=[0])


def test_process_sets_need_dynamic_mode():
    with pytest.raises(ValueError, match="dynamic"):
        hvd.add_process_set([0])
    with pytest.raises(ValueError, match="dynamic"):
        hvd.remove_process_set(hvd.global_process_set)


def test_rejected_submissions_leave_no_trace():
    # Everything above raised before reaching the engine: names are free, the engine works.
    check_engine_works("bad.dtype")
    check_engine_works("bad.contig")
    check_engine_works("bad.root")


def test_argument_errors_are_caught_as_horovod_errors_and_as_value_errors():
    # Horovod reports bad arguments as collective failures (RuntimeError subclasses);
    # hvdlite raises them at submission, as one class that is both.
    calls = (
        lambda: hvd.reducescatter(np.ones((SIZE, 2)), op=hvd.Adasum, name="arg.rs"),
        lambda: hvd.allreduce(np.ones(2, np.uint32), name="arg.dtype"),
        lambda: hvd.broadcast(np.ones(2), SIZE, name="arg.root"),
        lambda: hvd.alltoall(
            np.ones(SIZE), splits=[SIZE + 1] + [0] * (SIZE - 1), name="arg.splits"
        ),
    )
    for call in calls:
        for caught in (hvd.HorovodInternalError, RuntimeError, ValueError, hvd.ArgumentError):
            with pytest.raises(caught):
                call()
    check_engine_works("arg.after")


@needs_two
def test_mismatches_and_join_conflicts_raise_mismatch_error():
    shape = (5,) if ODD else (4,)
    with pytest.raises(hvd.MismatchError, match="Mismatched shape"):
        hvd.allreduce(np.ones(shape), name="mm.class")
    check_engine_works("mm.class.after")
