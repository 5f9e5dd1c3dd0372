"""Helpers shared by the core-engine parallel tests (tests/parallel/test_core_*.py).

Not a test module: it is imported by modules that run under mpiexec, one
pytest per rank.  Everything here is either local to a rank or a collective
that every rank calls at the same point.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import hvdlite as hvd
from hvdlite.util.dtypes import BFLOAT16
from hvdlite.util.splits import even_split

#: Every dtype the engine accepts, in the order the tests use them (bfloat16: numpy's,
#: from ml_dtypes).
INT_DTYPES = (np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64)
FLOAT_DTYPES = (np.float16, BFLOAT16, np.float32, np.float64)
NUMERIC_DTYPES = INT_DTYPES + FLOAT_DTYPES
ALL_DTYPES = NUMERIC_DTYPES + (np.bool_,)

#: Seconds a test waits for a handle that must complete (or fail) before calling it a hang.
WAIT = 30.0


def dtype_id(dt) -> str:
    return np.dtype(dt).name


def assert_same(actual, expected, dtype=None) -> None:
    """Exact for integers and bool, a 16-bit-sized tolerance for 16-bit floats."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if dtype is not None:
        assert actual.dtype == np.dtype(dtype), (actual.dtype, dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if actual.dtype == BFLOAT16:
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=8e-3, atol=8e-3
        )
    elif actual.dtype.kind == "f":
        rtol = 2e-3 if actual.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(
            actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=rtol
        )
    else:
        np.testing.assert_array_equal(actual, expected)


def expect_internal_error(handle, *fragments: str, timeout: float = WAIT) -> str:
    """Wait for *handle* to fail with HorovodInternalError; check its message; return it."""
    start = time.monotonic()
    with pytest.raises(hvd.HorovodInternalError) as info:
        handle.result(timeout=timeout)
    assert time.monotonic() - start < timeout, "the handle timed out instead of failing"
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in error message: {message}"
    assert isinstance(info.value, RuntimeError)
    return message


def wait_all(handles, timeout: float = WAIT) -> list:
    """Results of *handles*, in order (each must finish within *timeout*)."""
    return [h.result(timeout=timeout) for h in handles]


def check_engine_works(name: str, process_set=hvd.global_process_set) -> None:
    """A fresh allreduce on every member of *process_set* gives the right answer."""
    ranks = process_set.ranks
    x = np.full(3, hvd.rank() + 1, dtype=np.float64)
    out = hvd.allreduce(x, name=name, op=hvd.Sum, process_set=process_set)
    assert_same(out, np.full(3, sum(r + 1 for r in ranks), dtype=np.float64))


def mpi_sync() -> None:
    """A barrier outside the engine (plain MPI on COMM_WORLD), polled with a short sleep.

    For tests that need every rank at one point without submitting anything to
    the engine (e.g. while the stall inspector watches the engine's queues).
    """
    from mpi4py import MPI

    request = MPI.COMM_WORLD.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def same_everywhere(value) -> bool:
    """True when every rank of the job passes an equal *value*."""
    return all(v == value for v in hvd.allgather_object(value))


def spy_on_shared_memory(monkeypatch) -> list[int]:
    """Record the item count of every batch this rank reduces through shared memory,
    staged or not (the reduction itself still runs)."""
    from hvdlite.engine.transports.shm import SharedMemoryAllreduce

    calls = []
    real, real_staged = SharedMemoryAllreduce.allreduce, SharedMemoryAllreduce.run_staged

    def spy(self, items, wire, op, **kwargs):
        calls.append(len(items))
        return real(self, items, wire, op, **kwargs)

    def spy_staged(self):
        calls.append(len(self._staged[0].layout.counts))
        return real_staged(self)

    monkeypatch.setattr(SharedMemoryAllreduce, "allreduce", spy)
    monkeypatch.setattr(SharedMemoryAllreduce, "run_staged", spy_staged)
    return calls


def init_with_a_set_of_the_first_ranks():
    """``hvd.init()`` with, at 3 ranks or more, a process set of every rank but the
    last (on simulated nodes of one rank each, a set with a ring of its own); returns
    that set (registered or not)."""
    from mpi4py import MPI

    size = MPI.COMM_WORLD.Get_size()
    first = hvd.ProcessSet(list(range(size - 1)))
    hvd.init(process_sets=[first] if size > 2 else [])
    return first


def spy_on(monkeypatch, cls, method: str, measure) -> list:
    """Record ``measure(*args)`` for every call of *cls*.*method* on this rank (the
    call itself still runs)."""
    calls = []
    real = getattr(cls, method)

    def spy(self, *args):
        calls.append(measure(*args))
        return real(self, *args)

    monkeypatch.setattr(cls, method, spy)
    return calls


def half_values(rank: int, count: int, seed: int, dtype=np.float16) -> np.ndarray:
    """Rank *rank*'s float16 (or bfloat16) input for the rounding tests: values whose
    16-bit sums need rounding."""
    rs = np.random.RandomState(1000 * seed + rank)
    return (rs.standard_normal(count) * 40).astype(np.float32).astype(dtype)


def rows_of(full: np.ndarray, rank: int, size: int) -> np.ndarray:
    """Rank *rank*'s block of *full*'s rows, as every reduce-scatter over *size*
    ranks cuts them (the first ``rows % size`` ranks get one row more)."""
    counts = even_split(full.shape[0], size)
    lo = sum(counts[:rank])
    return full[lo : lo + counts[rank]]


def assert_bits(actual: np.ndarray, expected: np.ndarray) -> None:
    """The same dtype, shape and bits; the message shows a few that differ."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    differ = np.flatnonzero(actual.view(np.uint16) != expected.view(np.uint16))
    assert differ.size == 0, (
        f"{differ.size} of {actual.size} elements rounded differently, "
        f"e.g. {actual[differ[:3]]} instead of {expected[differ[:3]]}"
    )
