"""The timeline of a real 2-rank job: phases, names, paths, stragglers, start/stop.

Runs under mpiexec at 2 ranks.  ``HVDLITE_TIMELINE`` is set before ``init()``
(what ``hvdrun --timeline-filename`` does), so rank 0 writes from the start;
the tests then stop it and start others at run time.  Only rank 0 writes and
checks files; every rank runs the same collectives.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

TMP = tempfile.mkdtemp(prefix="hvdlite-timeline-")
os.environ["HVDLITE_TIMELINE"] = os.path.join(TMP, "from-init.json")
os.environ["HVDLITE_TIMELINE_MARK_CYCLES"] = "1"
# The engine thread lets a burst gather for 100 ms before it negotiates it itself, so
# the tensors a step submits together are fused together even on a loaded machine
# (the waiting caller starts the cycle once the burst is in).
os.environ["HVDLITE_CYCLE_TIME"] = "100"

import hvdlite as hvd  # noqa: E402
from hvdlite.engine.runtime import state  # noqa: E402
from hvdlite.timeline import Trace, load  # noqa: E402

MPI_SIZES = (2,)

pytestmark = pytest.mark.timeout(90)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()


def _on_track(trace, name):
    """cat -> list of slices on *name*'s track, in time order."""
    tid = next(t for t, n in trace.tracks.items() if n == name)
    found = {}
    for e in sorted(
        (e for e in trace.events if e.get("tid") == tid and e.get("ph") == "X"),
        key=lambda e: e["ts"],
    ):
        found.setdefault(e["cat"], []).append(e)
    return found


def _step(step: int) -> None:
    small = [
        hvd.allreduce_async(np.full(16, RANK + i, np.float64), name=f"grad.small.{i}")
        for i in range(3)
    ]
    big = hvd.allreduce_async(np.ones(100_000, np.float32), name="grad.big")
    gathered = [hvd.allgather_async(np.ones((2, 3)), name=f"ag.{x}") for x in "ab"]
    for h in small + [big] + gathered:
        hvd.synchronize(h)
    hvd.broadcast(np.arange(4.0), 0, name="bc")
    if step == 1:
        if RANK == 1:
            time.sleep(0.2)  # the straggler: rank 0 reports "late" one cycle, rank 1 later
        hvd.allreduce(np.ones(2), name="late")


def test_the_knob_starts_a_timeline_at_init():
    hvd.allreduce(np.ones(3), name="at.init")
    hvd.stop_timeline()
    if RANK == 0:
        events = json.load(open(os.environ["HVDLITE_TIMELINE"]))  # closed: plain JSON
        trace = Trace(events)
        assert "at.init" in trace.tracks.values()
        assert "engine cycles" in trace.tracks.values() and trace.slices["cycle"]
    else:
        assert state().timeline is None  # only rank 0 writes
    hvd.barrier()


def test_a_training_loop_draws_every_phase_with_its_path_and_batch():
    path = os.path.join(TMP, "steps.json")
    hvd.start_timeline(path)
    for step in range(4):
        _step(step)
    hvd.stop_timeline()
    if RANK == 0:
        trace = Trace.load(path)
        assert {"grad.small.0", "grad.big", "ag.a", "ag.b", "bc", "late"} <= set(
            trace.tracks.values()
        )
        assert "cycle" not in trace.slices  # mark_cycles=False

        small = _on_track(trace, "grad.small.0")
        assert {
            "negotiate",
            "op",
            "queue",
            "copy_in",
            "collective",
            "copy_out",
            "callbacks",
        } <= set(small)
        assert {e["name"] for e in small["collective"]} == {"MPI_ALLREDUCE"}
        assert len(small["op"]) == 4
        assert {e["name"] for e in small["op"]} == {"ALLREDUCE"}
        assert {e["name"] for e in small["negotiate"]} == {"NEGOTIATE_ALLREDUCE"}
        assert {e["name"] for e in small["copy_in"]} == {"MEMCPY_IN_FUSION_BUFFER"}
        assert {e["name"] for e in small["copy_out"]} == {"MEMCPY_OUT_FUSION_BUFFER"}
        assert {e["name"] for e in _on_track(trace, "ag.a")["negotiate"]} == {"NEGOTIATE_ALLGATHER"}
        # the three small tensors of a step ran fused: one batch id
        batches = [
            {e["args"]["batch"] for e in _on_track(trace, f"grad.small.{i}")["op"]}
            for i in range(3)
        ]
        assert batches[0] == batches[1] == batches[2] and len(batches[0]) == 4
        assert small["op"][0]["args"]["fused"] == 3
        # the first step went through the coordinator (both ranks' reports); later
        # steps through the response cache
        ranks = {e["args"]["rank"] for e in trace.reports if trace.track(e) == "grad.small.0"}
        assert ranks == {0, 1}
        assert small["negotiate"][0]["args"]["ranks"] == 2
        assert small["negotiate"][-1]["args"] == {"cached": True}

        shm = state().engine.executor._shm.get(0) is not None
        big = _on_track(trace, "grad.big")
        assert {e["name"] for e in big["collective"]} == {
            "SHM_ALLREDUCE" if shm else "MPI_ALLREDUCE"
        }
        gathered = _on_track(trace, "ag.a")
        assert {e["name"] for e in gathered["collective"]} == {
            "SHM_ALLGATHER" if shm else "MPI_ALLGATHER"
        }
        assert "copy_in" in gathered and "copy_out" in gathered
        assert {e["name"] for e in _on_track(trace, "bc")["collective"]} == {"MPI_BCAST"}

        late = _on_track(trace, "late")["negotiate"][0]["args"]
        assert late["last"] == [1] and late["wait_for_last_us"] > 50_000, late

        out = subprocess.run(
            [sys.executable, "-m", "hvdlite.timeline", "summary", path],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "rank 1: last to report" in out.stdout and "grad.big" in out.stdout
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            pass
        else:
            from hvdlite.timeline.__main__ import main

            png = os.path.join(TMP, "step.png")
            assert main(["plot", path, "-o", png, "--step", "2", "--steps", "2"]) == 0
            assert open(png, "rb").read(4) == b"\x89PNG"

        # a job killed mid-write leaves a file without its tail: it still loads
        text = open(path).read()
        cut = os.path.join(TMP, "cut.json")
        with open(cut, "w") as f:
            f.write(text[: len(text) * 2 // 3])
        events = load(cut)
        assert events and events == json.loads(text)[: len(events)]
    hvd.barrier()


def test_start_and_stop_at_run_time():
    first = os.path.join(TMP, "first.json")
    hvd.start_timeline(first, mark_cycles=True)
    hvd.allreduce(np.ones(2), name="before.stop")
    hvd.stop_timeline()
    hvd.stop_timeline()  # a second stop does nothing
    size = os.path.getsize(first) if RANK == 0 else 0
    hvd.allreduce(np.ones(2), name="while.off")
    second = os.path.join(TMP, "second.json")
    hvd.start_timeline(second)
    hvd.start_timeline(second + ".2")  # a running timeline is ended first
    hvd.allreduce(np.ones(2), name="after.restart")
    hvd.stop_timeline()
    if RANK == 0:
        assert os.path.getsize(first) == size
        names = set(Trace.load(first).tracks.values())
        assert "before.stop" in names and "while.off" not in names
        json.load(open(second))  # ended properly when replaced
        assert "after.restart" in Trace.load(second + ".2").tracks.values()
    hvd.barrier()
