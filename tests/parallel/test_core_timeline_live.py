"""A running job's timeline as Horovod's users read it: Horovod's activity names, and a
file that is complete JSON a moment after a collective returned.

Runs under mpiexec at 1, 2 and 3 ranks.  ``HOROVOD_TIMELINE`` and
``HOROVOD_TIMELINE_MARK_CYCLES`` (Horovod's spellings) are set before ``init()``, as
Horovod's test_timeline.py sets them; rank 0 writes the file and reads it while the job
runs; every rank runs the same collectives.
"""

import json
import os
import tempfile
import time

import numpy as np
import pytest

TMP = tempfile.mkdtemp(prefix="hvdlite-timeline-live-")
os.environ["HOROVOD_TIMELINE"] = os.path.join(TMP, "live.json")
os.environ["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"

import hvdlite as hvd  # noqa: E402
from hvdlite.timeline import Trace  # noqa: E402

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(90)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def _trace_within(seconds: float, track: str, names: set[str]) -> Trace:
    """The file as a trace once it parses as JSON and has *names* on *track*'s slices,
    read for at most *seconds* (a read can fall in the middle of a write, or between
    a tensor's first events and its last)."""
    deadline = time.monotonic() + seconds
    while True:
        text = open(os.environ["HOROVOD_TIMELINE"]).read()
        try:
            trace = Trace(json.loads(text))
        except json.JSONDecodeError:
            trace = None
        if trace is not None:
            on_track = {e.get("name") for e in trace.events if trace.track(e) == track}
            if names <= on_track:
                return trace
        if time.monotonic() > deadline:
            assert trace is not None, f"not a complete JSON array after {seconds} s:\n{text}"
            assert names <= on_track, (track, on_track)
        time.sleep(0.005)


def test_horovods_names_are_on_disk_a_tenth_of_a_second_after_the_collective():
    for step in range(3):
        hvd.allreduce(np.arange(3.0) + RANK, name=f"test_allreduce.{step}")
        hvd.broadcast(np.arange(2.0), 0, name=f"test_broadcast.{step}")
        if RANK == 0:
            trace = _trace_within(
                0.1, f"test_broadcast.{step}", {"NEGOTIATE_BROADCAST", "BROADCAST", "MPI_BCAST"}
            )
            on_allreduce = {
                e.get("name") for e in trace.events if trace.track(e) == f"test_allreduce.{step}"
            }
            assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MPI_ALLREDUCE"} <= on_allreduce
            assert any(e.get("name") == "CYCLE_START" for e in trace.events)
        hvd.barrier()


def test_the_coordinators_ready_marks_are_named_by_rank():
    hvd.allreduce(np.ones(4), name="ready.marks")
    if RANK == 0:
        trace = _trace_within(0.1, "ready.marks", {"ALLREDUCE"})
        marks = [e for e in trace.reports if trace.track(e) == "ready.marks"]
        assert sorted(e["name"] for e in marks) == [str(r) for r in range(SIZE)]
    hvd.barrier()


def test_the_closed_file_ends_with_the_timeline_end_event():
    hvd.allreduce(np.ones(2), name="last")
    hvd.stop_timeline()
    if RANK == 0:
        events = json.load(open(os.environ["HOROVOD_TIMELINE"]))
        assert events[-1]["name"] == "timeline end"
        assert "last" in Trace(events).tracks.values()
    hvd.barrier()
