"""Response cache and fusion turned off, through Horovod's and hvdlite's knob names.

Runs under mpiexec at 1, 2 and 3 ranks.  Before init this module sets
HOROVOD_CACHE_CAPACITY=0 (Horovod's name is accepted), and both
HOROVOD_FUSION_THRESHOLD=1000000 and HVDLITE_FUSION_THRESHOLD=0 (hvdlite's
name wins): every name goes through the coordinator every time and every
response runs as its own batch.  Results must not change.
"""

import os

import numpy as np
import pytest
from core_helpers import assert_same, expect_internal_error, wait_all

for _var in ("HVDLITE_CACHE_CAPACITY", "HVDLITE_CYCLE_TIME"):
    os.environ.pop(_var, None)
os.environ["HOROVOD_CACHE_CAPACITY"] = "0"
os.environ["HOROVOD_FUSION_THRESHOLD"] = "1000000"
os.environ["HVDLITE_FUSION_THRESHOLD"] = "0"
os.environ["HOROVOD_CYCLE_TIME"] = "2.5"

import hvdlite as hvd  # noqa: E402
from hvdlite.engine.runtime import state  # noqa: E402

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
RANKS = range(SIZE)
ENGINE = state().engine
BATCH_SIZES: list = []
_run_batch = ENGINE.executor.run_batch


def _recording_run_batch(batch):
    BATCH_SIZES.append(len(batch))
    return _run_batch(batch)


ENGINE.executor.run_batch = _recording_run_batch


def test_horovod_names_accepted_and_hvdlite_names_win():
    cfg = state().config
    assert cfg.cache_capacity == 0  # from HOROVOD_CACHE_CAPACITY
    assert cfg.fusion_threshold == 0  # HVDLITE_FUSION_THRESHOLD beats HOROVOD_FUSION_THRESHOLD
    assert cfg.cycle_time_ms == 2.5  # from HOROVOD_CYCLE_TIME


def test_repeated_names_without_cache():
    for step in range(5):
        out = hvd.allreduce(np.full(4, RANK + step, np.float32), op=hvd.Sum, name="nc.ar")
        assert_same(out, np.full(4, sum(r + step for r in RANKS), np.float32))
        out = hvd.broadcast(np.full(2, RANK), step % SIZE, name="nc.bc")
        assert_same(out, np.full(2, step % SIZE))
        out = hvd.allgather(np.full((1, 2), RANK), name="nc.ag")
        assert_same(out, np.repeat(np.arange(SIZE), 2).reshape(SIZE, 2))
        hvd.barrier()
    assert len(ENGINE.bits.cache) == 0


def test_bursts_run_unfused():
    BATCH_SIZES.clear()
    order = list(range(20)) if RANK % 2 == 0 else list(range(19, -1, -1))
    handles = {
        i: hvd.allreduce_async(np.full(3, RANK + i, np.float64), op=hvd.Sum, name=f"nc.burst.{i}")
        for i in order
    }
    for i in range(20):
        assert_same(hvd.synchronize(handles[i]), np.full(3, float(sum(r + i for r in RANKS))))
    outs = hvd.grouped_allreduce([np.ones(3), np.ones(5, np.int64)], op=hvd.Sum, name="nc.grp")
    assert_same(outs[1], np.full(5, SIZE, np.int64))
    assert BATCH_SIZES and max(BATCH_SIZES) == 1


@pytest.mark.skipif(SIZE < 2, reason="a mismatch needs a second rank to disagree")
def test_mismatch_without_cache():
    for _ in range(2):
        hvd.allreduce(np.ones(3), name="nc.mm")
    shape = (4,) if RANK == 1 else (3,)
    h = hvd.allreduce_async(np.ones(shape), name="nc.mm")
    expect_internal_error(h, "shape", "rank 1: (4,)")
    assert hvd.allreduce(np.ones(3), op=hvd.Sum, name="nc.mm")[0] == SIZE


def test_async_handles_all_complete():
    handles = [hvd.allreduce_async(np.ones(2), op=hvd.Sum, name=f"nc.async.{i}") for i in range(10)]
    assert all(out[0] == SIZE for out in wait_all(handles))
