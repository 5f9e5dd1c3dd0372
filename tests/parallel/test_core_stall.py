"""The stall inspector: names that some ranks never submit.

Runs under mpiexec at 2 and 3 ranks (at one rank nothing can wait for another
rank, and the inspector is off).  Before init this module sets
HVDLITE_STALL_CHECK_TIME_SECONDS=1 and HVDLITE_STALL_SHUTDOWN_TIME_SECONDS=3:
after about a second the coordinator (rank 0) logs a warning listing, per
missing rank, the names it has not submitted; after about three seconds every
pending handle of those names fails with HorovodInternalError instead of
hanging.  The engine keeps working afterwards.
"""

import logging
import os
import time

import numpy as np
import pytest
from core_helpers import check_engine_works, expect_internal_error, mpi_sync

os.environ["HVDLITE_STALL_CHECK_TIME_SECONDS"] = "1"
os.environ["HVDLITE_STALL_SHUTDOWN_TIME_SECONDS"] = "3"
os.environ.pop("HVDLITE_STALL_CHECK_DISABLE", None)
os.environ.pop("HOROVOD_STALL_CHECK_DISABLE", None)

import hvdlite as hvd  # noqa: E402
from mpi4py import MPI  # noqa: E402

MPI_SIZES = (2, 3)

pytestmark = pytest.mark.timeout(60)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
LAST = SIZE - 1


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[tuple[float, str]] = []

    def emit(self, record):
        self.records.append((time.monotonic(), record.getMessage()))


WARNINGS = _Records()
logging.getLogger("hvdlite").addHandler(WARNINGS)


def submitted_by(rank):
    """Which names each rank submits: 'stall.a' by all but the last rank, 'stall.b' by
    rank 0 only (a name every rank ran before: rank 0's request is a response-cache
    hit), 'stall.c' by the last rank only: every rank misses some name."""
    names = []
    if rank != LAST:
        names.append("stall.a")
    if rank == 0:
        names.append("stall.b")
    if rank == LAST:
        names.append("stall.c")
    return names


def test_stalled_names_warn_then_fail_on_every_rank():
    for _ in range(2):
        assert hvd.allreduce(np.ones(2), op=hvd.Sum, name="stall.b")[0] == SIZE
    start = time.monotonic()
    handles = {n: hvd.allreduce_async(np.ones(2), name=n) for n in submitted_by(RANK)}
    failed_at = {}
    for name, handle in handles.items():
        holders = [r for r in range(SIZE) if name in submitted_by(r)]
        missing = [r for r in range(SIZE) if r not in holders]
        message = expect_internal_error(handle, "Stalled", repr(name), str(missing))
        assert str(holders) in message
        failed_at[name] = time.monotonic()
    waited = min(failed_at.values()) - start
    assert waited >= 2.5, f"stalled handles failed after {waited:.1f}s, before the 3s limit"
    mpi_sync()  # every rank saw its failures (outside the engine: nothing to stall on)

    if RANK == 0:
        texts = [text for _, text in WARNINGS.records if "Missing ranks" in text]
        assert texts, f"no stall warning was logged: {WARNINGS.records}"
        first_warning = min(t for t, text in WARNINGS.records if "Missing ranks" in text)
        assert first_warning < min(failed_at.values())  # warned before cancelling
        report = texts[0]
        for r in range(SIZE):
            names = [n for n in ("stall.a", "stall.b", "stall.c") if n not in submitted_by(r)]
            host = MPI.Get_processor_name()  # every rank runs on this host here
            assert f"rank {r} (on {host}): [{', '.join(names)}]" in report, report
    else:
        assert not [text for _, text in WARNINGS.records if "Missing ranks" in text]
    # Every rank waited, and said where: the stack of the thread that submitted the
    # names it waited on, down to this test function, once per name.
    stacks = [text for _, text in WARNINGS.records if "which submitted them, is now at" in text]
    assert stacks, WARNINGS.records
    assert f"rank {RANK} waits on" in stacks[0]
    assert "test_stalled_names_warn_then_fail_on_every_rank" in stacks[0], stacks[0]
    for name in submitted_by(RANK):
        assert sum(repr(name) in text for text in stacks) == 1, stacks


def test_engine_works_after_stall_and_names_are_free_again():
    check_engine_works("after.stall")
    for name in ("stall.a", "stall.b", "stall.c"):
        out = hvd.allreduce(np.ones(2), op=hvd.Sum, name=name)
        assert out[0] == SIZE


def test_no_warning_when_everyone_is_just_slow():
    # A rank that submits late (but within the warning time) is not reported.
    WARNINGS.records.clear()
    if RANK == LAST:
        time.sleep(0.2)
    out = hvd.allreduce(np.ones(2), op=hvd.Sum, name="slow.but.fine")
    assert out[0] == SIZE
    assert not [text for _, text in WARNINGS.records if "Missing ranks" in text]
