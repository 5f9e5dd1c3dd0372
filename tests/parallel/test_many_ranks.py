"""The core collectives and the torch DistributedOptimizer at 8 ranks.

Every other module runs at 1 to 3 ranks; this one runs where a regression
that only shows beyond three ranks (an off-by-one in a rank range, a status
field that outgrows a word, a doorbell storm, a message that lists every rank)
would fail CI.  It runs oversubscribed (8 ranks on a machine of 2 cores), so
it stays lean: each test does a few collectives with values every rank can
check exactly.  Run it at 16 or 32 ranks by hand with ``mpiexec -n 32 python
-m pytest tests/parallel/test_many_ranks.py``.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from core_helpers import assert_same, check_engine_works, expect_internal_error
from torch import nn

import hvdlite as hvd
import hvdlite.torch as hvd_torch

MPI_SIZES = (8,)

pytestmark = pytest.mark.timeout(120)

torch.set_num_threads(1)
hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
#: The ranks of the upper half: at 8 ranks, a run of ranks a message should name as a range.
UPPER = range(SIZE // 2, SIZE)


def test_collectives_give_exact_values():
    out = hvd.allreduce(np.full(1000, RANK + 1, np.float32), op=hvd.Sum, name="many.sum")
    assert_same(out, np.full(1000, SIZE * (SIZE + 1) / 2, np.float32))
    assert_same(
        hvd.allreduce(np.array([RANK], np.int64), op=hvd.Max, name="many.max"), np.array([SIZE - 1])
    )
    # Twenty tensors of different sizes fused into one batch, averaged.
    outs = hvd.grouped_allreduce(
        [np.full(10 + i, RANK + i, np.float64) for i in range(20)],
        op=hvd.Average,
        name="many.group",
    )
    for i, o in enumerate(outs):
        assert_same(o, np.full(10 + i, (SIZE - 1) / 2 + i))
    # Allgather with a different number of rows on every rank.
    gathered = hvd.allgather(np.full((RANK + 1, 2), RANK, np.int32), name="many.ag")
    assert_same(
        gathered,
        np.repeat(np.arange(SIZE, dtype=np.int32), np.arange(1, SIZE + 1))[:, None].repeat(
            2, axis=1
        ),
    )
    assert_same(
        hvd.broadcast(np.full(5, RANK, np.int64), root_rank=SIZE - 1, name="many.bc"),
        np.full(5, SIZE - 1),
    )
    received = hvd.alltoall(np.arange(SIZE, dtype=np.int32) + 100 * RANK, name="many.a2a")
    assert_same(received, np.array([100 * s + RANK for s in range(SIZE)], np.int32))
    scattered = hvd.reducescatter(np.ones((2 * SIZE, 3), np.float32), op=hvd.Sum, name="many.rs")
    assert_same(scattered, np.full((2, 3), SIZE, np.float32))
    assert hvd.allgather_object(RANK) == list(range(SIZE))
    hvd.barrier()


def test_steady_state_loop_of_cached_names():
    # A training step's worth of named allreduces, repeated: every step after the
    # first is answered by the response cache on every rank.
    for step in range(20):
        handles = [
            hvd.allreduce_async(
                np.full(100, RANK + step, np.float32), op=hvd.Sum, name=f"many.loop.{i}"
            )
            for i in range(10)
        ]
        for handle in handles:
            out = hvd.synchronize(handle)
        assert out[0] == SIZE * (SIZE - 1) / 2 + SIZE * step


def test_mismatch_message_names_rank_ranges():
    shape = (5,) if RANK in UPPER else (4,)
    handle = hvd.allreduce_async(np.ones(shape, np.float32), name="many.mismatch")
    lower = f"ranks 0-{SIZE // 2 - 1}" if SIZE // 2 >= 3 else None
    upper = f"ranks {SIZE // 2}-{SIZE - 1}"
    expect_internal_error(handle, "shape", upper, *([lower] if lower else []))
    check_engine_works("many.after.mismatch")


def test_torch_distributed_optimizer_matches_one_process():
    batch, steps = 4, 5

    def make_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))

    def global_batch(step):
        g = torch.Generator().manual_seed(100 + step)
        return torch.randn(SIZE * batch, 5, generator=g), torch.randn(SIZE * batch, 3, generator=g)

    model, ref = make_model(), make_model()
    opt = hvd_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    hvd_torch.broadcast_parameters(model.state_dict(), root_rank=0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    mine = slice(RANK * batch, (RANK + 1) * batch)
    for step in range(steps):
        x, y = global_batch(step)
        opt.zero_grad()
        F.mse_loss(model(x[mine]), y[mine]).backward()
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)
