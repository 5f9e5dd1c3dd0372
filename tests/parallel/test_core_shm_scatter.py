"""The reduce-scatter through one node's shared memory
(hvdlite/engine/transports/shm_scatter.py): where it applies, and what it computes.

Runs under mpiexec at 1, 2 and 3 ranks, all on this machine, so every set of 2-4
ranks reduce-scatters through its shared window; at one rank nothing does.  Integer
values (and float values that are small integers) make every sum exact, so an
element reduced by the wrong rank, from the wrong segment or across a round's cut
shows as a wrong value.
"""

import numpy as np
import pytest

import hvdlite as hvd
from hvdlite import basics
from hvdlite.engine.transports.shm import SHM_MIN_BYTES, SLOT_BYTES, SharedMemoryAllreduce

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(120)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
RANKS_SUM = SIZE * (SIZE - 1) // 2


@pytest.fixture
def shm_calls(monkeypatch):
    """The tensor count of every batch this rank reduce-scatters through the window."""
    calls = []
    real = SharedMemoryAllreduce.reducescatter

    def spy(self, tensors, wire, op):
        calls.append(len(tensors))
        return real(self, tensors, wire, op)

    monkeypatch.setattr(SharedMemoryAllreduce, "reducescatter", spy)
    return calls


def shard(full: np.ndarray) -> np.ndarray:
    """This rank's dim-0 shard of *full*: rows split as evenly as possible, the
    first ranks one larger."""
    base, extra = divmod(full.shape[0], SIZE)
    lo = RANK * base + min(RANK, extra)
    return full[lo : lo + base + (1 if RANK < extra else 0)]


def test_the_route_answers_alike_on_every_rank():
    uses = basics.reducescatter_uses_shared_memory(hvd.global_process_set)
    assert uses == (2 <= SIZE <= 4)
    assert hvd.allgather_object(uses) == [uses] * SIZE


def test_small_batches_go_through_mpi_and_larger_ones_through_the_window(shm_calls):
    small = np.full(SIZE * 100, RANK, np.int32)
    np.testing.assert_array_equal(
        hvd.reducescatter(small, name="scatter.small", op=hvd.Sum), np.full(100, RANKS_SUM)
    )
    assert shm_calls == []
    rows = SHM_MIN_BYTES // 4
    large = np.arange(rows, dtype=np.int32) + RANK
    out = hvd.reducescatter(large, name="scatter.large", op=hvd.Sum)
    np.testing.assert_array_equal(out, shard(np.arange(rows) * SIZE + RANKS_SUM))
    assert shm_calls == ([] if SIZE == 1 else [1])


def test_uneven_rows_and_trailing_dimensions():
    # SIZE * 5 + 1 rows: rank 0's shard is one row longer, so its parts end past
    # the others' in every round.
    full = np.arange((SIZE * 5 + 1) * 3 * 701, dtype=np.int64).reshape(-1, 3, 701)
    out = hvd.reducescatter(full * (RANK + 1), name="scatter.uneven", op=hvd.Sum)
    assert out.shape == shard(full).shape and out.dtype == np.int64
    np.testing.assert_array_equal(out, shard(full) * (SIZE * (SIZE + 1) // 2))


def test_a_group_of_dtypes_with_scale_factors_and_an_empty_tensor():
    # float16 is reduced in float32 and cast back; int32 is scaled and truncated; the
    # zero-row tensor gives every rank an empty shard.
    n = 40_001
    halves = np.full(n, RANK + 1, np.float16)
    ints = np.arange(n, dtype=np.int32)
    doubles = np.arange(n, dtype=np.float64) * (RANK + 1)
    empty = np.zeros((0, 4), np.float32)
    outs = hvd.grouped_reducescatter(
        [halves, ints, empty, doubles],
        name="scatter.group",
        op=hvd.Sum,
        prescale_factor=2.0,
        postscale_factor=0.5,
    )
    assert [o.dtype for o in outs] == [np.float16, np.int32, np.float32, np.float64]
    np.testing.assert_array_equal(outs[0], shard(np.full(n, SIZE * (SIZE + 1) / 2, np.float16)))
    np.testing.assert_array_equal(outs[1], shard(np.arange(n) * SIZE))
    assert outs[2].shape == (0, 4)
    np.testing.assert_array_equal(outs[3], shard(np.arange(n) * (SIZE * (SIZE + 1) / 2)))


def test_average_divides_by_the_set_size():
    n = 300_007
    x = np.arange(n, dtype=np.float32) % 97 + RANK
    out = hvd.reducescatter(x, name="scatter.avg", op=hvd.Average)
    expected = shard(((np.arange(n) % 97) * SIZE + RANKS_SUM).astype(np.float32))
    np.testing.assert_allclose(out, expected / SIZE, rtol=1e-6)


def test_tensors_longer_than_one_round_among_small_ones():
    # Each rank's part of the large tensor is longer than a segment of one area, so
    # the batch takes more than one round and both areas; the small tensors before
    # and after it share rounds with its first and last pieces.
    n = SLOT_BYTES // 4 + 12_345
    big = np.arange(n, dtype=np.int32) % 1000 + RANK
    small = [np.full(SIZE * (7 + i), RANK * 10 + i, np.int32) for i in range(3)]
    outs = hvd.grouped_reducescatter(
        small[:1] + [big] + small[1:], name="scatter.rounds", op=hvd.Sum
    )
    np.testing.assert_array_equal(outs[1], shard((np.arange(n) % 1000) * SIZE + RANKS_SUM))
    for i, o in enumerate([outs[0]] + outs[2:]):
        np.testing.assert_array_equal(o, np.full(7 + i, RANKS_SUM * 10 + i * SIZE))


def test_a_loop_of_reduce_scatters_between_allreduces_and_allgathers_in_the_window():
    # A training loop's cached plan: the allreduce may run staged (copied in before
    # the status exchange), the reduce-scatter and allgather use the same areas.
    n = 200_000
    for step in range(6):
        x = np.full(n, RANK + step, np.int32)
        handles = [
            hvd.allreduce_async(x, name="scatter.loop.ar", op=hvd.Sum),
            hvd.reducescatter_async(x * 2, name="scatter.loop.rs", op=hvd.Sum),
            hvd.allgather_async(x[: 1000 + RANK], name="scatter.loop.ag"),
        ]
        total, part, gathered = (hvd.synchronize(h) for h in handles)
        np.testing.assert_array_equal(total, np.full(n, RANKS_SUM + SIZE * step))
        np.testing.assert_array_equal(part, shard(np.full(n, 2 * (RANKS_SUM + SIZE * step))))
        assert gathered.shape == (1000 * SIZE + RANKS_SUM,)
