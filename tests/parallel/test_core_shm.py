"""The shared-memory allreduce and allgather (hvdlite/engine/transports/shm.py): where
they apply, and what they compute.

Runs under mpiexec at 1, 2 and 3 ranks, all on this one machine, so every set of
2-4 ranks reduces through a shared window; at one rank nothing does.  The other
core test modules run their allreduces through the same path; these tests cover
what only it has: batches cut into slot-sized chunks (a tensor split across
chunks, casts and scale factors on both sides of a cut), the reducer of a
removed set being freed, and the knob that turns the path off; allgathers of
uneven rows through the window, interleaved with allreduces that share it, and
the fall-back to MPI on every rank when one rank's rows do not fit its area;
a training loop's batch run *staged* (copied in before the engine's status
exchange), with late ranks and other collectives through the window between
its steps.
"""

import os
import time

import numpy as np
import pytest
from core_helpers import assert_same, same_everywhere, spy_on_shared_memory

import hvdlite as hvd
from hvdlite import basics
from hvdlite.engine.transports.shm import (
    ROTATION_BYTES,
    SHM_MIN_BYTES,
    SLOT_BYTES,
    SharedMemoryAllreduce,
)
from hvdlite.util.dtypes import BFLOAT16

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(120)

hvd.init(process_sets="dynamic")
RANK, SIZE = hvd.rank(), hvd.size()


def _reducer(set_id: int = 0):
    return basics.state().engine.executor._shm.get(set_id)


def test_the_global_set_reduces_through_shared_memory():
    hvd.allreduce(np.ones(3, np.float32), name="shm.first")
    if SIZE == 1:
        assert _reducer() is None
    else:
        assert isinstance(_reducer(), SharedMemoryAllreduce)


def test_small_batches_go_through_mpi_and_larger_ones_through_shared_memory(monkeypatch):
    calls = spy_on_shared_memory(monkeypatch)
    small = [np.full(1000, RANK + i, np.int32) for i in range(3)]  # 12 KB together
    out = hvd.grouped_allreduce(small, name="shm.route.small", op=hvd.Sum)
    assert calls == []
    large = np.full(SHM_MIN_BYTES // 4, RANK, np.int32)
    total = hvd.allreduce(large, name="shm.route.large", op=hvd.Sum)
    assert calls == ([] if SIZE == 1 else [1])
    ranks_sum = SIZE * (SIZE - 1) // 2
    for i, o in enumerate(out):
        np.testing.assert_array_equal(o, np.full(1000, ranks_sum + i * SIZE))
    np.testing.assert_array_equal(total, np.full(SHM_MIN_BYTES // 4, ranks_sum))


def test_allreduce_uses_shared_memory_answers_alike_on_every_rank():
    expected = 2 <= SIZE <= 4  # every rank of these tests shares one node
    assert basics.allreduce_uses_shared_memory(hvd.global_process_set) == expected
    assert same_everywhere(basics.allreduce_uses_shared_memory(hvd.global_process_set))


def test_pieces_cut_between_the_ranks_portions_in_place_and_scaled():
    # Odd sizes put portion boundaries inside tensors; in place, each rank's output is
    # also its input, and a prescale makes every rank copy its own portion in too.
    sizes = [12_345, 7, 40_001, 3, 29_999]
    xs = [np.arange(n, dtype=np.float64) + RANK for n in sizes]
    outs = hvd.grouped_allreduce(xs, name="shm.inplace", op=hvd.Sum, outputs=xs)
    for n, o, x in zip(sizes, outs, xs, strict=True):
        assert o is x
        np.testing.assert_array_equal(x, np.arange(n) * SIZE + SIZE * (SIZE - 1) / 2)
    ys = [np.arange(n, dtype=np.float64) + RANK for n in sizes]
    avg = hvd.grouped_allreduce(
        ys, name="shm.scaled", op=hvd.Average, prescale_factor=4.0, postscale_factor=0.25
    )
    for n, a in zip(sizes, avg, strict=True):
        np.testing.assert_allclose(a, np.arange(n) + (SIZE - 1) / 2)
    assert same_everywhere(np.concatenate(avg).tobytes())


def test_a_training_loop_reuses_the_layout_with_new_values_every_step():
    # The same names every step: the engine reuses its batch and the reducer its cut,
    # while the arrays and their values change.  Mixed sizes put pieces on both sides
    # of the portion bounds; odd steps reduce in place, and each rank reduces its own
    # portion straight into its outputs.
    sizes = [16_384, 5, 70_001, 16_384, 33]
    for step in range(4):
        xs = [np.arange(n, dtype=np.float32) % 251 + RANK + step for n in sizes]
        handles = [
            hvd.allreduce_async(x, name=f"shm.loop.{i}", op=hvd.Sum, output=x if step % 2 else None)
            for i, x in enumerate(xs)
        ]
        outs = [hvd.synchronize(h) for h in handles]
        for n, x, o in zip(sizes, xs, outs, strict=True):
            assert (o is x) == bool(step % 2)
            np.testing.assert_array_equal(
                o, (np.arange(n) % 251 + step) * SIZE + SIZE * (SIZE - 1) // 2
            )
    assert same_everywhere(np.concatenate(outs).tobytes())


def test_a_last_chunk_smaller_than_the_set_is_cut_right():
    # The second chunk holds one element: some ranks' portions of it are empty.
    n = SLOT_BYTES // 4 + 1
    x = np.arange(n, dtype=np.int32) % 977 + RANK
    out = hvd.allreduce(x, name="shm.tail", op=hvd.Sum)
    np.testing.assert_array_equal(out, (np.arange(n) % 977) * SIZE + SIZE * (SIZE - 1) // 2)


def test_a_tensor_larger_than_one_slot_is_reduced_in_chunks():
    # int32 sums are exact, so any misplaced element across a chunk cut shows.
    n = SLOT_BYTES // 4 + 12345
    big = np.arange(n, dtype=np.int32) % 1000 + RANK
    small = [np.full(7 + i, RANK * 10 + i, dtype=np.int32) for i in range(3)]
    out = hvd.grouped_allreduce(small[:1] + [big] + small[1:], name="shm.chunks", op=hvd.Sum)
    ranks_sum = SIZE * (SIZE - 1) // 2
    np.testing.assert_array_equal(out[1], (np.arange(n) % 1000) * SIZE + ranks_sum)
    for i, o in enumerate([out[0]] + out[2:]):
        np.testing.assert_array_equal(o, np.full(7 + i, ranks_sum * 10 + i * SIZE))


@pytest.mark.parametrize("half", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
def test_casts_and_scale_factors_on_both_sides_of_a_chunk_cut(half):
    # float16 and bfloat16 are reduced in a float32 wire buffer: 5 M values (20 MB on
    # the wire) cross a cut, and every piece goes through the scratch buffer with
    # both scale factors.
    n = 5 * 1024 * 1024
    x = np.full(n, RANK + 1, dtype=half)
    name = f"shm.{np.dtype(half).name}"
    out = hvd.allreduce(x, name=name, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5)
    assert out.dtype == half
    np.testing.assert_array_equal(out, np.full(n, SIZE * (SIZE + 1) / 2, half))
    y = np.full(SLOT_BYTES // 8 + 3, float(RANK), dtype=np.float64)
    avg = hvd.allreduce(y, name="shm.avg", op=hvd.Average)
    np.testing.assert_allclose(avg, np.full_like(y, (SIZE - 1) / 2))


def test_min_and_max_across_a_chunk_cut():
    n = SLOT_BYTES // 8 + 99
    x = np.arange(n, dtype=np.int64) * (RANK + 1)
    np.testing.assert_array_equal(hvd.allreduce(x, name="shm.max", op=hvd.Max), np.arange(n) * SIZE)
    np.testing.assert_array_equal(hvd.allreduce(x, name="shm.min", op=hvd.Min), np.arange(n))


def test_successive_chunks_move_through_the_start_of_the_areas_alike_everywhere():
    if SIZE == 1:
        pytest.skip("one rank has no shared-memory reducer")
    hvd.allreduce(np.ones(SHM_MIN_BYTES // 4, np.float32), name="shm.place.first")
    reducer = _reducer()
    before = reducer._next_start
    starts = []
    real = reducer._place

    def place(nbytes):
        starts.append(real(nbytes))
        return starts[-1]

    reducer._place = place
    try:
        n = 4 * (ROTATION_BYTES // 12 + 1)  # bytes a chunk: three do not fit, so it wraps
        for step in range(4):
            total = hvd.allreduce(
                np.full(n // 4, RANK + step, np.float32), op=hvd.Sum, name=f"shm.place.{step}"
            )
            np.testing.assert_array_equal(total, SIZE * step + SIZE * (SIZE - 1) // 2)
        big = hvd.allreduce(
            np.full(ROTATION_BYTES // 4 + 1, 1.0, np.float32), op=hvd.Sum, name="shm.place.big"
        )  # larger than the rotation: at the start
        np.testing.assert_array_equal(big, SIZE)
    finally:
        del reducer._place
    # Each chunk begins where the last one ended (on a page), back at the start
    # once it would run past ROTATION_BYTES; one larger than that at the start.
    expected, at = [], before
    for nbytes in [n] * 4 + [ROTATION_BYTES + 4]:
        at = at if at + nbytes <= ROTATION_BYTES else 0
        expected.append(at)
        at += -(-nbytes // 4096) * 4096
    assert starts == expected
    assert 0 in starts[1:4] and any(starts[:4])  # it wrapped, and it moved
    assert same_everywhere(starts)


def _staged_runs() -> int:
    reducer = _reducer()
    return 0 if reducer is None else reducer.staged_runs


def _loop_step(step: int, sizes, in_place: bool, name: str):
    """One step of a loop's grouped allreduce: float32 and float16 (cast to a float32
    wire), prescaled and averaged; returns the outputs and what they must be."""
    xs = [
        (np.arange(n) % 251 + RANK + step).astype(np.float32 if i % 2 else np.float16)
        for i, n in enumerate(sizes)
    ]
    outs = hvd.grouped_allreduce(
        xs, name=name, op=hvd.Average, prescale_factor=2.0, outputs=xs if in_place else None
    )
    expected = [2 * (np.arange(n) % 251 + step) + (SIZE - 1) for n in sizes]
    return xs, outs, expected


def test_a_training_loop_s_batch_runs_staged_from_its_third_step():
    # Step 1 is negotiated, step 2 makes the cached plan; from then on every rank
    # copies its part in before the status exchange.  Casts, scale factors and
    # outputs in place come out as they do unstaged.  A loss averaged every step
    # (a plan of its own, through MPI) and a check negotiated anew every step
    # come between the steps.
    sizes = [16_384, 5, 70_001, 33, 9_999]
    before = _staged_runs()
    steps = 6
    for step in range(steps):
        xs, outs, expected = _loop_step(step, sizes, bool(step % 2), "shm.staged.loop")
        loss = hvd.allreduce(np.float32(RANK + step), name="shm.staged.loss", op=hvd.Sum)
        assert loss == SIZE * step + SIZE * (SIZE - 1) // 2
        for x, o, e in zip(xs, outs, expected, strict=True):
            assert (o is x) == bool(step % 2)
            assert o.dtype == x.dtype
            assert_same(o, e)
        assert same_everywhere(b"".join(o.tobytes() for o in outs))
    assert _staged_runs() - before == (0 if SIZE == 1 else steps - 2)


def test_ranks_that_arrive_late_find_the_early_ranks_batch_staged():
    # Each step a different rank comes late: the others stage, exchange, find the
    # batch not ready everywhere, wait, and run it staged once the late rank has
    # staged too, with the copy they made before.
    sizes = [40_000, 3, 20_000]
    before = _staged_runs()
    steps = 2 + 2 * SIZE
    for step in range(steps):
        if step >= 2 and step % SIZE == RANK:
            time.sleep(0.05)
        xs, outs, expected = _loop_step(step, sizes, False, "shm.staged.late")
        for o, e in zip(outs, expected, strict=True):
            assert_same(o, e)
    assert _staged_runs() - before == (0 if SIZE == 1 else steps - 2)


def test_other_collectives_through_the_window_between_staged_steps():
    # An allgather and a large unstaged allreduce between a loop's steps take the
    # areas in turn; the loop's batch is staged again two steps after each.
    sizes = [30_000, 17, 50_000]
    for step in range(8):
        _, outs, expected = _loop_step(step, sizes, False, "shm.staged.mixed")
        for o, e in zip(outs, expected, strict=True):
            assert_same(o, e)
        if step in (3, 5):
            rows = hvd.allgather(
                np.full((RANK + 1, 4), RANK + step, np.int32), name=f"shm.staged.gather.{step}"
            )
            np.testing.assert_array_equal(
                rows, np.concatenate([np.full((r + 1, 4), r + step) for r in range(SIZE)])
            )
            big = hvd.allreduce(
                np.full(SHM_MIN_BYTES, RANK + step, np.float32),
                name=f"shm.staged.between.{step}",
                op=hvd.Sum,
            )
            np.testing.assert_array_equal(big, SIZE * step + SIZE * (SIZE - 1) // 2)


def test_a_plan_of_an_allreduce_and_an_allgather_stages_its_first_batch():
    # A Keras step with a sparse embedding gradient: a grouped allreduce and an
    # allgather ready in the same cycle, one plan of two batches.  The allreduce
    # runs staged, then the allgather through the same window as usual.
    sizes = [25_000, 11, 8_000]
    before = _staged_runs()
    steps = 6
    for step in range(steps):
        xs = [np.full(n, RANK + step, np.float32) for n in sizes]
        rows = np.full((RANK + 2, 3), 10 * RANK + step, np.int64)
        reduced = hvd.grouped_allreduce_async(xs, name="shm.staged.dense", op=hvd.Sum)
        gathered = hvd.allgather_async(rows, name="shm.staged.sparse")
        for o, n in zip(hvd.synchronize(reduced), sizes, strict=True):
            np.testing.assert_array_equal(o, np.full(n, SIZE * step + SIZE * (SIZE - 1) // 2))
        np.testing.assert_array_equal(
            hvd.synchronize(gathered),
            np.concatenate([np.full((r + 2, 3), 10 * r + step) for r in range(SIZE)]),
        )
    if SIZE > 1:
        assert _staged_runs() - before >= 1


def test_a_loop_s_batch_of_more_than_one_chunk_is_never_staged():
    n = SLOT_BYTES // 4 + 1000
    before = _staged_runs()
    for step in range(4):
        total = hvd.allreduce(
            np.arange(n, dtype=np.int32) % 1000 + RANK + step, name="shm.staged.chunks", op=hvd.Sum
        )
        np.testing.assert_array_equal(
            total, (np.arange(n) % 1000 + step) * SIZE + SIZE * (SIZE - 1) // 2
        )
    assert _staged_runs() == before


def spy_on_shared_allgather(monkeypatch) -> list[bool]:
    """Record, per allgather batch through the window, whether it finished there
    (False: some rank's rows did not fit, and the batch went on through MPI)."""
    calls = []
    real = SharedMemoryAllreduce.allgather

    def spy(self, *args, **kwargs):
        dims, outputs = real(self, *args, **kwargs)
        calls.append(outputs is not None)
        return dims, outputs

    monkeypatch.setattr(SharedMemoryAllreduce, "allgather", spy)
    return calls


def test_grouped_allgathers_of_uneven_rows_interleaved_with_allreduces(monkeypatch):
    calls = spy_on_shared_allgather(monkeypatch)
    for step in range(3):
        # Rank r has r + step rows of each (rank 0 none in step 0), of three dtypes.
        rows = RANK + step
        parts = [
            np.full((rows, 3), 10 * RANK + step, np.float32),
            np.arange(rows, dtype=np.int64) + 100 * RANK,
            np.full((rows, 2, 2), RANK, np.float16),
        ]
        gathered = hvd.grouped_allgather(parts, name=f"shm.gather.{step}")
        # The same window reduces in between, and must hand the areas back intact.
        total = hvd.allreduce(
            np.full(SHM_MIN_BYTES, RANK + step, np.float32), name=f"shm.between.{step}", op=hvd.Sum
        )
        np.testing.assert_array_equal(total, SIZE * step + SIZE * (SIZE - 1) // 2)
        everyone = range(SIZE)
        np.testing.assert_array_equal(
            gathered[0],
            np.concatenate([np.full((r + step, 3), 10 * r + step, np.float32) for r in everyone]),
        )
        np.testing.assert_array_equal(
            gathered[1],
            np.concatenate([np.arange(r + step, dtype=np.int64) + 100 * r for r in everyone]),
        )
        assert gathered[2].shape == (sum(r + step for r in everyone), 2, 2)
        assert gathered[2].dtype == np.float16
    assert calls == ([] if SIZE == 1 else [True] * 3)


def test_rows_too_large_for_one_rank_s_area_gather_through_mpi_on_every_rank(monkeypatch):
    calls = spy_on_shared_allgather(monkeypatch)
    # Rank 0 alone has more rows than its area holds.
    rows = SLOT_BYTES // 8 + 1 if RANK == 0 else 3
    gathered = hvd.allgather(np.full((rows, 2), RANK, np.float32), name="shm.gather.big")
    assert gathered.shape == (SLOT_BYTES // 8 + 1 + 3 * (SIZE - 1), 2)
    np.testing.assert_array_equal(gathered[: SLOT_BYTES // 8 + 1], 0)
    np.testing.assert_array_equal(
        gathered[SLOT_BYTES // 8 + 1 :], np.repeat(np.arange(1, SIZE), 3)[:, None] * np.ones(2)
    )
    assert calls == ([] if SIZE == 1 else [False])
    # The next one fits again, through the window.
    small = hvd.allgather(np.full((1, 1), RANK, np.int32), name="shm.gather.after")
    np.testing.assert_array_equal(small[:, 0], np.arange(SIZE))
    assert calls == ([] if SIZE == 1 else [False, True])


@pytest.mark.skipif(SIZE < 3, reason="needs a set smaller than the world")
def test_a_removed_set_frees_its_shared_window():
    ps = hvd.add_process_set([0, 1])
    if RANK in (0, 1):
        n = SHM_MIN_BYTES // 8 + 5  # large enough for the shared-memory path
        total = hvd.allreduce(np.full(n, RANK + 1.0), name="shm.pair", op=hvd.Sum, process_set=ps)
        np.testing.assert_array_equal(total, np.full(n, 3.0))
        assert isinstance(_reducer(ps.process_set_id), SharedMemoryAllreduce)
    set_id = ps.process_set_id
    hvd.remove_process_set(ps)
    assert _reducer(set_id) is None
    assert set_id not in basics.state().engine.executor._shm


def test_the_knob_turns_the_path_off():
    hvd.shutdown()
    os.environ["HVDLITE_SHM_ALLREDUCE_DISABLE"] = "1"
    try:
        hvd.init(process_sets="dynamic")
        total = hvd.allreduce(np.full(5, RANK + 1, np.int64), name="shm.off", op=hvd.Sum)
        np.testing.assert_array_equal(total, np.full(5, SIZE * (SIZE + 1) // 2))
        assert _reducer() is None
    finally:
        del os.environ["HVDLITE_SHM_ALLREDUCE_DISABLE"]
        hvd.shutdown()
        hvd.init(process_sets="dynamic")
    hvd.allreduce(np.ones(2), name="shm.back")
    assert (_reducer() is None) == (SIZE == 1)


def test_a_small_dev_shm_falls_back_to_mpi_on_every_rank(monkeypatch):
    # One rank short of room is enough: all ranks must take the MPI path together.
    import hvdlite.engine.transports.shm as shm

    if RANK == SIZE - 1:
        monkeypatch.setattr(shm, "_free_shm_bytes", lambda path="/dev/shm": 0)
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    total = hvd.allreduce(np.full(6, RANK + 1.0), name="shm.small", op=hvd.Sum)
    np.testing.assert_array_equal(total, np.full(6, SIZE * (SIZE + 1) / 2))
    assert _reducer() is None
