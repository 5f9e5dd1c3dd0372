"""What a rank knows about the job after init(): ranks, topology, capabilities.

Runs under mpiexec at 1, 2 and 3 ranks with the default knobs (no simulated
nodes): the topology must be consistent with what the ranks report about
their hosts.
"""

import os
import socket

import numpy as np
import pytest
from core_helpers import same_everywhere

import hvdlite as hvd
from mpi4py import MPI

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def test_rank_and_size_match_mpi():
    assert SIZE == MPI.COMM_WORLD.Get_size()
    assert RANK == MPI.COMM_WORLD.Get_rank()
    assert hvd.is_initialized()
    assert sorted(hvd.allgather_object(RANK)) == list(range(SIZE))


def test_topology_is_consistent():
    local_rank, local_size = hvd.local_rank(), hvd.local_size()
    cross_rank, cross_size = hvd.cross_rank(), hvd.cross_size()
    assert 0 <= local_rank < local_size <= SIZE
    assert 0 <= cross_rank < cross_size <= SIZE
    facts = hvd.allgather_object(
        (socket.gethostname(), local_rank, local_size, cross_rank, cross_size)
    )
    # (cross_rank, local_rank) identifies a rank: no two ranks share both.
    assert len({(f[3], f[1]) for f in facts}) == SIZE
    # Ranks on one host form one node: same local size, distinct local ranks.
    hosts = {}
    for host, lr, ls, _, _ in facts:
        hosts.setdefault(host, []).append((lr, ls))
    for members in hosts.values():
        assert sorted(lr for lr, _ in members) == list(range(len(members)))
        assert {ls for _, ls in members} == {len(members)}
    # cross_size = number of nodes that have a rank with this local rank.
    assert cross_size == sum(1 for f in facts if f[1] == local_rank)
    assert hvd.is_homogeneous() == (len({len(m) for m in hosts.values()}) == 1)
    if len(hosts) == 1:
        assert (local_size, local_rank, cross_size, cross_rank) == (SIZE, RANK, 1, 0)


def test_capabilities():
    assert hvd.mpi_enabled() is True and hvd.mpi_built() is True
    assert hvd.gloo_enabled() is False and hvd.gloo_built() is False
    assert isinstance(hvd.nccl_built(), int)
    assert isinstance(hvd.cuda_built(), bool)
    assert hvd.rocm_built() is False and hvd.ddl_built() is False and hvd.ccl_built() is False
    assert isinstance(hvd.mpi_threads_supported(), bool)
    assert same_everywhere(hvd.mpi_threads_supported())


def test_reduce_ops_have_horovod_values():
    assert [
        int(op) for op in (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product)
    ] == [0, 1, 2, 3, 4, 5]


def test_error_classes():
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert hvd.HvdliteInternalError is hvd.HorovodInternalError


def test_handle_is_a_future():
    import concurrent.futures

    h = hvd.allreduce_async(np.ones(2), op=hvd.Sum, name="basics.future")
    assert isinstance(h, concurrent.futures.Future)
    assert h.result(timeout=30)[0] == SIZE
    assert h.done() and hvd.poll(h)


def test_overlap_follows_the_cores_left_for_the_engine_thread():
    import os

    from hvdlite import basics

    expected = len(os.sched_getaffinity(0)) > hvd.local_size()
    assert basics.state().engine.overlap is expected


def test_async_work_nobody_waits_on_still_completes():
    # Without overlap the engine thread leaves async work to a waiting caller;
    # a program that only polls must still see its collective finish.
    import time

    h = hvd.allreduce_async(np.full(3, 2.0), op=hvd.Sum, name="basics.polled")
    deadline = time.monotonic() + 20
    while not hvd.poll(h):
        assert time.monotonic() < deadline, "an async allreduce never completed"
        time.sleep(0.001)
    np.testing.assert_array_equal(h.result(), np.full(3, 2.0 * SIZE))


def test_async_work_rouses_an_engine_thread_that_looks_rarely(monkeypatch):
    # Without overlap, an engine thread whose callers drive everything looks for
    # work less and less often.  An async submission nobody waits on brings its
    # next look forward; here the look would otherwise be an hour away.
    import time

    from hvdlite import basics
    from hvdlite.engine import driver

    hvd.shutdown()
    os.environ["HVDLITE_OVERLAP"] = "off"
    monkeypatch.setattr(driver, "_QUIET_CAP", 3600.0)
    try:
        hvd.init()
        engine_driver = basics.state().engine.driver
        deadline = time.monotonic() + 20
        while engine_driver._wakes_at - time.monotonic() < 600:
            assert time.monotonic() < deadline, "the engine thread never slowed down"
            # "no cycle of its own for a day" (again, if init's last cycle ran on it)
            engine_driver._thread_worked = time.monotonic() - 1e5
            time.sleep(0.005)
        h = hvd.allreduce_async(np.full(3, 2.0), op=hvd.Sum, name="basics.quiet")
        while not hvd.poll(h):
            assert time.monotonic() < deadline, "the quiet engine thread was not roused"
            time.sleep(0.001)
        np.testing.assert_array_equal(h.result(), np.full(3, 2.0 * SIZE))
        # the thread ran it, so it looks often again
        assert time.monotonic() - engine_driver._thread_worked < 600
    finally:
        del os.environ["HVDLITE_OVERLAP"]
        hvd.shutdown()
        hvd.init()


@pytest.mark.skipif(SIZE < 3, reason="needs a rank outside a process set of two")
def test_a_rank_outside_a_process_set_cycles_for_it_while_computing():
    # Every cycle is global: ranks 0 and 1 reduce over their own set while rank 2
    # sleeps (no call of its own drives its engine).  Its thread hears their
    # doorbell and runs the cycles, and since those ran work it looks often again.
    import time

    from hvdlite import basics

    hvd.shutdown()
    pair = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[pair])
    try:
        engine_driver = basics.state().engine.driver
        if RANK == 2:
            engine_driver._thread_worked = time.monotonic() - 1e5
            time.sleep(1.0)
            assert time.monotonic() - engine_driver._thread_worked < 1.0
        else:
            for _ in range(3):
                out = hvd.allreduce(np.ones(4), op=hvd.Sum, name="basics.pair", process_set=pair)
                np.testing.assert_array_equal(out, np.full(4, 2.0))
    finally:
        hvd.shutdown()
        hvd.init()


def _rings_over_synchronous_calls(calls: int) -> int:
    from hvdlite import basics

    doorbell = basics.state().engine.doorbell
    x = np.ones(16, dtype=np.float32)
    hvd.allreduce(x, name="basics.loop", op=hvd.Sum)
    before = doorbell.rings
    for _ in range(calls):
        out = hvd.allreduce(x, name="basics.loop", op=hvd.Sum)
    assert out[0] == SIZE
    return doorbell.rings - before


@pytest.mark.parametrize("overlap", ["on", "rank 0 only"])
def test_back_to_back_synchronous_calls_need_no_doorbell_where_a_rank_overlaps(overlap):
    # A cycle that ran work is followed by another without waiting when some rank's
    # engine thread overlaps, so a loop of synchronous calls keeps the ranks
    # cycling instead of waking them one call at a time.  (The engine thread may
    # still slip a cycle in between two calls now and then; a ring per call would
    # be CALLS rings.)  One rank that overlaps is enough: the policy is agreed.
    from hvdlite import basics

    hvd.shutdown()
    os.environ["HVDLITE_OVERLAP"] = "on" if overlap == "on" or RANK == 0 else "off"
    try:
        hvd.init()
        assert basics.state().engine.overlap_anywhere
        if SIZE > 1:
            calls = 200
            assert _rings_over_synchronous_calls(calls) < calls // 4
    finally:
        del os.environ["HVDLITE_OVERLAP"]
        hvd.shutdown()
        hvd.init()


def test_without_overlap_each_call_rings_and_runs_no_empty_cycle():
    # No rank overlaps: after work ran, every rank waits at once (no empty cycle
    # for the engine thread to run in the middle of the framework's compute), so
    # every call rings the doorbell (twice where a rank ran a cycle before its
    # peers had submitted) -- by some rank: one that has heard a peer's ring
    # before it would ring is woken already and does not ring too.
    from hvdlite import basics

    hvd.shutdown()
    os.environ["HVDLITE_OVERLAP"] = "off"
    try:
        hvd.init()
        assert not basics.state().engine.overlap_anywhere
        if SIZE > 1:
            calls = 50
            rings = sum(hvd.allgather_object(_rings_over_synchronous_calls(calls)))
            assert rings >= calls
    finally:
        del os.environ["HVDLITE_OVERLAP"]
        hvd.shutdown()
        hvd.init()
