"""Collectives submitted from several threads of each rank, without names.

Runs under mpiexec at 2 and 3 ranks.  Automatic names are counted per thread
(see hvdlite.engine.auto_names), so the unnamed collectives of thread "A" on one rank
pair up with those of thread "A" on the others, whatever order the threads of
each rank happen to run in.  Here the order is made to differ on purpose: on
even ranks thread A submits first, on odd ranks thread B does.  With one
counter shared by all threads, A's first call would meet B's first call of
another rank, and their shapes differ.
"""

import threading
import time

import numpy as np
import pytest
from core_helpers import WAIT, assert_same, check_engine_works

import os  # noqa: E402 - the affinity knob must be set before hvdlite reads it

_CORES = sorted(os.sched_getaffinity(0))
# One core id per local rank (every rank of these tests is on this node).
os.environ["HVDLITE_THREAD_AFFINITY"] = ",".join(str(_CORES[i % len(_CORES)]) for i in range(8))

import hvdlite as hvd  # noqa: E402

MPI_SIZES = (2, 3)

pytestmark = pytest.mark.timeout(90)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
SHAPES = {"A": (3,), "B": (5, 2)}
CALLS = 40


def test_unnamed_collectives_pair_up_per_thread_whatever_the_order():
    results: dict[str, list] = {"A": [], "B": []}
    errors: list[BaseException] = []
    order = ("A", "B") if RANK % 2 == 0 else ("B", "A")

    def work(label):
        try:
            if label == order[1]:
                time.sleep(0.2)  # this rank's second thread submits its first call later
            for i in range(CALLS):
                x = np.full(SHAPES[label], RANK + i, dtype=np.float64)
                results[label].append(hvd.allreduce(x, op=hvd.Sum))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(label,), name=label) for label in order]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * 2)
    assert not errors, errors
    base = sum(range(SIZE))
    for label, outs in results.items():
        assert len(outs) == CALLS
        for i, out in enumerate(outs):
            assert_same(out, np.full(SHAPES[label], base + SIZE * i, dtype=np.float64))
    check_engine_works("threads.after")


def test_two_live_threads_with_one_name_are_refused_before_anything_is_sent():
    release = threading.Event()
    errors = []

    def first():
        hvd.allreduce(np.ones(2), op=hvd.Sum)
        release.wait(WAIT)

    def second():
        try:
            hvd.allreduce_async(np.ones(2))
        except ValueError as exc:
            errors.append(exc)

    a = threading.Thread(target=first, name="same")
    a.start()
    b = threading.Thread(target=second, name="same")
    b.start()
    b.join(WAIT)
    release.set()
    a.join(WAIT)
    assert errors and "distinct name" in str(errors[0])
    check_engine_works("threads.refused.after")


def test_the_engine_thread_is_pinned_to_its_local_ranks_core():
    from hvdlite.engine import runtime

    engine_thread = runtime.state().engine.driver._thread
    with open(f"/proc/self/task/{engine_thread.native_id}/status") as status:
        allowed = next(line for line in status if line.startswith("Cpus_allowed_list"))
    want = _CORES[hvd.local_rank() % len(_CORES)]
    assert allowed.split(":")[1].strip() == str(want)
    assert len(os.sched_getaffinity(0)) == len(_CORES)  # the calling thread is not pinned
