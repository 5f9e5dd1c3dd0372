"""Tensor fusion with a tiny threshold, and a response cache of two entries.

Runs under mpiexec at 1, 2 and 3 ranks with HVDLITE_FUSION_THRESHOLD=256
(bytes) and HVDLITE_CACHE_CAPACITY=2, set before init: bursts of async
tensors of mixed dtypes are split into many fused batches, and repeated names
keep evicting each other from the cache.  Results must be exactly what
unfused, uncached collectives give.  The batches the executor runs are
recorded (by wrapping it) to check the fusion invariants.
"""

import os

import numpy as np
import pytest
from core_helpers import NUMERIC_DTYPES, assert_same, wait_all

os.environ["HVDLITE_FUSION_THRESHOLD"] = "256"
os.environ["HVDLITE_CACHE_CAPACITY"] = "2"

import hvdlite as hvd  # noqa: E402
from hvdlite.engine.runtime import state  # noqa: E402
from hvdlite.util.dtypes import reduce_dtype  # noqa: E402
from hvdlite.engine.fusion import nbytes_of  # noqa: E402

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
RANKS = range(SIZE)
THRESHOLD = 256

ENGINE = state().engine
BATCHES: list = []
_run_batch = ENGINE.executor.run_batch


def _recording_run_batch(batch):
    BATCHES.append([(r.key, r.params) for r in batch])
    return _run_batch(batch)


ENGINE.executor.run_batch = _recording_run_batch


def test_knobs_reached_the_engine():
    assert state().config.fusion_threshold == THRESHOLD
    assert state().config.cache_capacity == 2


def burst(tag, order):
    """Async allreduces, allgathers, broadcasts and reducescatters of mixed dtypes and sizes."""
    handles, expected = {}, {}
    for k in order:
        dtype = NUMERIC_DTYPES[k % len(NUMERIC_DTYPES)]
        n = 1 + (k * 7) % 40  # 1..40 elements: several fit in 256 bytes, some do not
        kind = k % 4
        name = f"{tag}.{k}"
        if kind == 0:
            handles[k] = hvd.allreduce_async(np.full(n, RANK + 1, dtype), op=hvd.Sum, name=name)
            expected[k] = np.full(n, sum(r + 1 for r in RANKS), dtype)
        elif kind == 1:
            handles[k] = hvd.allgather_async(np.full((RANK + 1, n), k % 7, dtype), name=name)
            expected[k] = np.full((sum(r + 1 for r in RANKS), n), k % 7, dtype)
        elif kind == 2:
            root = k % SIZE
            handles[k] = hvd.broadcast_async(np.full(n, RANK + k % 5, dtype), root, name=name)
            expected[k] = np.full(n, root + k % 5, dtype)
        else:
            handles[k] = hvd.reducescatter_async(
                np.full((SIZE, n), RANK + 1, dtype), op=hvd.Sum, name=name
            )
            expected[k] = np.full((1, n), sum(r + 1 for r in RANKS), dtype)
    for k in order:
        assert_same(hvd.synchronize(handles[k]), expected[k], expected[k].dtype)


def test_bursts_of_mixed_dtypes_in_rank_dependent_order():
    for round_ in range(3):
        order = list(range(48))
        if RANK % 2:
            order.reverse()
        burst(f"burst{round_}", order)


def test_many_small_allreduces_are_fused_within_the_threshold():
    BATCHES.clear()
    for attempt in range(5):
        handles = [
            hvd.allreduce_async(
                np.full(4, RANK + i, np.float32), op=hvd.Sum, name=f"small.{attempt}.{i}"
            )
            for i in range(24)
        ]
        for i, out in enumerate(wait_all(handles)):
            assert_same(out, np.full(4, sum(r + i for r in RANKS), np.float32))
    fused = [b for b in BATCHES if len(b) > 1]
    assert fused, "24 async allreduces submitted at once were never fused (5 attempts)"
    assert max(len(b) for b in fused) <= THRESHOLD // 16  # 16 bytes per tensor


def test_every_fused_batch_respects_threshold_and_kind():
    assert BATCHES
    for batch in BATCHES:
        if len(batch) == 1:
            continue
        params = [p for _, p in batch]
        assert sum(nbytes_of(p) for p in params) <= THRESHOLD
        assert len({p.kind for p in params}) == 1
        assert len({p.set_id for p in params}) == 1
        assert len({reduce_dtype(d).str for p in params for d in p.dtypes}) == 1 or params[
            0
        ].kind not in (0, 4)


def test_grouped_allreduce_larger_than_the_threshold():
    tensors = [np.full(100, RANK + k, np.float64) for k in range(5)]  # 4000 bytes
    outs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name="big.group")
    for k, out in enumerate(outs):
        assert_same(out, np.full(100, float(sum(r + k for r in RANKS))))
    big = hvd.allreduce(np.full(1000, RANK + 1.0), op=hvd.Average, name="big.single")
    assert_same(big, np.full(1000, sum(r + 1 for r in RANKS) / SIZE))


def test_tiny_cache_evicts_and_stays_consistent():
    cache = ENGINE.bits.cache
    names = [f"evict.{i}" for i in range(6)]
    for round_ in range(5):
        order = names if (RANK + round_) % 2 == 0 else names[::-1]
        handles = {
            n: hvd.allreduce_async(np.full(3, RANK + round_, np.int32), op=hvd.Sum, name=n)
            for n in order
        }
        for n in names:
            assert_same(
                hvd.synchronize(handles[n]), np.full(3, sum(r + round_ for r in RANKS), np.int32)
            )
        assert len(cache) <= 2
        # Synchronous repeats of two names: these two can stay cached and hit.
        for _ in range(3):
            for n in names[:2]:
                out = hvd.allreduce(np.ones(2), op=hvd.Sum, name=n + ".sync")
                assert_same(out, np.full(2, float(SIZE)))
    assert len(cache) == 2


def test_cache_bits_agree_across_ranks():
    # Every rank applied the same puts and evictions: the same names own the same bits.
    table = sorted((bit, key) for key, bit in ENGINE.bits.cache._bit_of.items())
    gathered = hvd.allgather_object(table)
    assert all(t == gathered[0] for t in gathered)
