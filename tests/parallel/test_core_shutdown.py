"""Life cycle: before init, bad knobs, idempotent init, shutdown with pending work, restart.

Runs under mpiexec at 1, 2 and 3 ranks.  The tests depend on each other's
order (the module drives one process through init -> shutdown -> init ...),
which pytest keeps: every rank runs them top to bottom.
"""

import os

import numpy as np
import pytest
from core_helpers import WAIT, check_engine_works

import hvdlite as hvd
from mpi4py import MPI

MPI_SIZES = (1, 2, 3)
MPI_ALONE = True  # it starts from a process that never initialized hvdlite

pytestmark = pytest.mark.timeout(60)

WORLD_SIZE = MPI.COMM_WORLD.Get_size()  # known before hvd.init()

needs_two = pytest.mark.skipif(
    WORLD_SIZE < 2,
    reason="at one rank every collective completes as soon as it is submitted, so none "
    "can still be pending",
)

QUERIES = (
    hvd.size,
    hvd.rank,
    hvd.local_size,
    hvd.local_rank,
    hvd.cross_size,
    hvd.cross_rank,
    hvd.is_homogeneous,
)


def test_before_init_queries_raise_value_error_naming_init():
    assert not hvd.is_initialized()
    for query in QUERIES:
        with pytest.raises(ValueError, match=r"init\(\)"):
            query()
    with pytest.raises(ValueError, match=r"init\(\)"):
        hvd.allreduce(np.ones(2))
    with pytest.raises(ValueError, match=r"init\(\)"):
        hvd.broadcast_object(1)
    hvd.shutdown()  # shutdown before init is a no-op


@pytest.mark.parametrize(
    "var,value",
    [
        ("HVDLITE_FUSION_THRESHOLD", "lots"),
        ("HOROVOD_CACHE_CAPACITY", "-1"),
        ("HVDLITE_STALL_CHECK_DISABLE", "maybe"),
        ("HVDLITE_LOG_LEVEL", "LOUD"),
        ("HVDLITE_CYCLE_TIME", "0"),
    ],
)
def test_bad_knob_value_fails_init_with_value_error(var, value):
    os.environ[var] = value
    try:
        with pytest.raises(ValueError) as info:
            hvd.init()
        assert var.replace("HOROVOD_", "HVDLITE_") in str(info.value)
    finally:
        del os.environ[var]
    assert not hvd.is_initialized()


def test_init_is_idempotent():
    from hvdlite.engine.runtime import state

    hvd.init()
    first = state().engine
    hvd.init()
    hvd.init()
    assert state().engine is first
    assert hvd.is_initialized()
    check_engine_works("idempotent")


@needs_two
def test_shutdown_fails_pending_handles():
    pending = None
    if hvd.rank() == 0:
        pending = hvd.allreduce_async(np.ones(2), name="never.submitted.elsewhere")
    hvd.allreduce(np.ones(1), name="before.shutdown")  # rank 0's entry reached the engine
    hvd.shutdown()
    assert not hvd.is_initialized()
    if pending is not None:
        with pytest.raises(hvd.HorovodInternalError, match="shut down on this rank"):
            pending.result(timeout=WAIT)


def test_shutdown_twice_is_a_no_op_and_queries_say_init():
    hvd.init()
    hvd.shutdown()
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match=r"init\(\)"):
        hvd.rank()


def test_collective_after_shutdown_raises_horovod_internal_error():
    assert not hvd.is_initialized()
    with pytest.raises(hvd.HorovodInternalError, match="shut down"):
        hvd.allreduce(np.ones(2), name="after.shutdown")


def test_collective_after_shutdown_fails_clearly():
    # Whatever the class, it must be an error that says what to do, never a hang.
    with pytest.raises((ValueError, hvd.HorovodInternalError), match=r"init\(\)"):
        hvd.allreduce(np.ones(2), name="after.shutdown")
    with pytest.raises((ValueError, hvd.HorovodInternalError), match=r"init\(\)"):
        hvd.allreduce_async(np.ones(2), name="after.shutdown")


def test_restart_after_shutdown():
    hvd.init()
    assert hvd.is_initialized()
    check_engine_works("restarted")
    hvd.shutdown()
    hvd.init(comm=list(range(WORLD_SIZE)))  # every rank of COMM_WORLD, as a list
    assert hvd.size() == WORLD_SIZE
    check_engine_works("restarted.list")
    for _ in range(3):  # and the cache works in the new engine
        check_engine_works("restarted.list.again")


@needs_two
def test_shutdown_on_another_rank_fails_this_ranks_collectives():
    if hvd.rank() == 1:
        hvd.shutdown()
    else:
        # Whether rank 1 shuts down before or after this submission: an error, not a hang,
        # that says another rank left (not "call init() again" as if this rank had).
        with pytest.raises(hvd.HorovodInternalError, match="shut down by another rank") as e:
            hvd.allreduce(np.ones(2), name="never.on.rank1")
        assert "init()" not in str(e.value)
        # The engine stopped here too: further collectives fail the same way.
        with pytest.raises(hvd.HorovodInternalError, match="shut down by another rank"):
            hvd.allreduce(np.ones(2), name="after.remote.shutdown")
        assert not hvd.is_initialized()
        # The job's facts still answer, as hvd.rank() does: code that ends a job
        # ("am I rank 0? then print the result") must not see a rank of None.
        me = MPI.COMM_WORLD.Get_rank()
        assert hvd.rank() == me
        assert hvd.global_process_set.rank() == me and hvd.global_process_set.included()
        hvd.shutdown()
    assert hvd.global_process_set.rank() is None  # this rank's own shutdown: no job
    hvd.init()
    check_engine_works("after.remote.restart")


def test_final_shutdown():
    hvd.shutdown()
    assert not hvd.is_initialized()
