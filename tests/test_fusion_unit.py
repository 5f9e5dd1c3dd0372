"""Fusion without MPI: which ready responses share a batch, up to the threshold, and
the pool of fusion buffers."""

from __future__ import annotations

import random

import numpy as np
import pytest
from engine_requests import F16, F32, F64, I32, B, P, ok

from hvdlite.util.dtypes import reduce_dtype
from hvdlite.device.buffers import BufferPool
from hvdlite.engine.fusion import nbytes_of, plan_batches
from hvdlite.engine.messages import RESPONSE_ERROR, Kind, Response
from hvdlite.ops import ReduceOp

pytestmark = pytest.mark.timeout(60)


def test_plan_fuses_same_kind_dtype_op_up_to_the_threshold():
    responses = [ok(P(f"t{i}", shapes=((4,),))) for i in range(10)]  # 16 bytes each
    assert [len(b) for b in plan_batches(responses, 64)] == [4, 4, 2]
    assert [len(b) for b in plan_batches(responses, 1 << 20)] == [10]
    assert [len(b) for b in plan_batches(responses, 0)] == [1] * 10  # 0 disables fusion
    # Batches keep submission order inside and across.
    flat = [r.key[1] for b in plan_batches(responses, 64) for r in b]
    assert flat == [f"t{i}" for i in range(10)]


def test_plan_never_fuses_across_kind_set_op_dtype_or_root():
    responses = [
        ok(P("a")),
        ok(P("b", dtypes=(F64,))),
        ok(P("c", op=ReduceOp.MAX)),
        ok(P("d", set_id=1)),
        ok(P("e", kind=Kind.ALLGATHER)),
        ok(P("f", kind=Kind.BROADCAST, root=0)),
        ok(P("g", kind=Kind.BROADCAST, root=1)),
        ok(P("h")),
        ok(P("i", kind=Kind.BROADCAST, root=0)),
    ]
    batches = plan_batches(responses, 1 << 20)
    names = [[r.key[1] for r in b] for b in batches]
    assert names == [["a", "h"], ["b"], ["c"], ["d"], ["e"], ["f", "i"], ["g"]]


def test_plan_float16_fuses_apart_from_the_float32_it_is_reduced_in():
    # One wire dtype (float32), but float16 batches may cross nodes as 16 bits.
    responses = [ok(P(name, dtypes=(dt,))) for name, dt in zip("abcd", (F16, F32, F16, F32))]
    names = [[r.key[1] for r in b] for b in plan_batches(responses, 1 << 20)]
    assert names == [["a", "c"], ["b", "d"]]
    assert reduce_dtype(F16) == np.float32 and reduce_dtype(B) == np.uint8
    assert reduce_dtype(I32) == np.int32


def test_plan_keeps_errors_alltoall_adasum_barrier_and_mixed_groups_alone():
    err = Response(RESPONSE_ERROR, None, (0, "bad"), "boom")
    responses = [
        ok(P("a")),
        err,
        ok(P("b", kind=Kind.ALLTOALL)),
        ok(P("c")),
        ok(P("d", op=ReduceOp.ADASUM)),
        ok(P("e", kind=Kind.BARRIER, dtypes=(), shapes=())),
        ok(P("f", dtypes=(F32, I32), shapes=((2,), (2,)))),
        ok(P("g")),
    ]
    names = [[r.key[1] for r in b] for b in plan_batches(responses, 1 << 20)]
    assert names == [["a", "c", "g"], ["bad"], ["b"], ["d"], ["e"], ["f"]]


def test_plan_oversized_response_runs_alone():
    responses = [ok(P("small")), ok(P("huge", shapes=((1000,),))), ok(P("small2"))]
    names = [[r.key[1] for r in b] for b in plan_batches(responses, 64)]
    assert names == [["small"], ["huge"], ["small2"]]  # packing is sequential
    for batch in plan_batches(responses, 64):
        assert len(batch) == 1 or sum(nbytes_of(r.params) for r in batch) <= 64


def test_plan_is_a_pure_function_of_the_responses():
    rng = random.Random(3)
    kinds = [Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.REDUCESCATTER, Kind.ALLTOALL]
    responses = [
        ok(
            P(
                f"r{i}",
                kind=rng.choice(kinds),
                dtypes=(rng.choice([F32, F64, I32]),),
                shapes=((rng.randrange(1, 50),),),
                root=rng.randrange(2),
            )
        )
        for i in range(200)
    ]
    first = plan_batches(responses, 512)
    assert first == plan_batches(list(responses), 512)
    assert sorted(r.key for b in first for r in b) == sorted(r.key for r in responses)
    for batch in first:
        if len(batch) > 1:
            assert sum(nbytes_of(r.params) for r in batch) <= 512


def test_nbytes_and_buffer_pool():
    assert nbytes_of(P(dtypes=(F32, F64), shapes=((2, 3), (4,)))) == 6 * 4 + 4 * 8
    pool = BufferPool()
    a = pool.get(np.float32, 10)
    assert a.shape == (10,) and a.dtype == np.float32
    b = pool.get(np.float32, 5)
    assert np.shares_memory(a, b)  # reused, not reallocated
    c = pool.get(np.float32, 100)
    assert c.shape == (100,)
    assert not np.shares_memory(pool.get(np.float32, 4, slot=1), pool.get(np.float32, 4))
    pool.clear()


def test_fusion_buffers_shrink_after_a_peak_and_unused_ones_are_freed():
    pool = BufferPool()
    pool.get(np.float32, 8 << 20)  # a 32 MiB peak
    pool.get(np.float64, 1000)
    for _ in range(2 * BufferPool.WINDOW):
        pool.get(np.float32, 1024)
    assert pool.nbytes() == 1024 * 4  # shrunk to the window's largest; float64 freed
