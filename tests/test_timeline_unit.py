"""The timeline without MPI: records to trace lines, the file, reading it back.

The engine's side is played by hand-made records (see hvdlite/timeline/schema.py);
tests/parallel/test_core_timeline.py checks a real 2-rank job's trace.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from types import SimpleNamespace

import pytest

from hvdlite.engine.messages import Kind, Params, Response
from hvdlite.timeline import MAX_ROWS, Timeline, Trace, load
from hvdlite.timeline import schema as s
from hvdlite.timeline.__main__ import main as timeline_main
from hvdlite.timeline.events import MAX_OPEN, TraceBuilder
from hvdlite.timeline.summary import format_summary, summarize
from hvdlite.engine.transports.routes import Transport
from hvdlite.ops import ReduceOp

T0 = 1000.0


def _params(name, kind=Kind.ALLREDUCE):
    return Params(set_id=0, name=name, kind=int(kind), dtypes=("<f4",), shapes=((4,),))


def _response(name, kind=Kind.ALLREDUCE):
    p = _params(name, kind)
    return Response(0, p, p.key)


def _ms(t):
    return T0 + t / 1e3


def _trace(records, mark_cycles=False) -> Trace:
    builder = TraceBuilder(T0, mark_cycles)
    out = [builder.header()]
    for record in records:
        builder.add(record, out)
    out.append(builder.footer(_ms(50)))
    text = "".join(out)
    return Trace(json.loads(text))  # a closed file is plain JSON


def _on(trace, name):
    tid = next(t for t, n in trace.tracks.items() if n == name)
    return {e["cat"]: e for e in trace.events if e.get("tid") == tid and e.get("ph") == "X"}


# Rank 0 submits a and b at 1 and 2 ms; rank 1 reports a with them (3 ms) and b
# one cycle later (5 ms); the responses are known at 6 ms; the fused batch runs
# from 7 ms: copy in to 8, collective to 9, copy out to 10, callbacks 11 to 12.
FUSED = [
    (s.R_CYCLE, _ms(0.5), 1),
    (
        s.R_SUBMIT,
        [((0, "a"), _ms(1), int(Kind.ALLREDUCE)), ((0, "b"), _ms(2), int(Kind.ALLREDUCE))],
    ),
    (s.R_REPORTS, _ms(3), [([_params("a"), _params("b")], None), ([_params("a")], None)]),
    (s.R_CYCLE, _ms(4), 2),
    (s.R_REPORTS, _ms(5), [([], None), ([_params("b")], None)]),
    (s.R_DECIDED, _ms(6)),
    (
        s.R_BATCH,
        [_response("a"), _response("b")],
        Transport.MPI,
        [_ms(7), (s.COPY_IN, _ms(7.5)), (s.COLLECTIVE, _ms(8)), (s.COPY_OUT, _ms(9))],
        _ms(10),
        _ms(12),
    ),
]


def test_a_fused_batch_draws_every_phase_on_each_of_its_tensors_tracks():
    trace = _trace(FUSED, mark_cycles=True)
    assert set(trace.tracks.values()) == {"engine cycles", "a", "b"}
    a, b = _on(trace, "a"), _on(trace, "b")
    assert (
        set(a)
        == set(b)
        == {"negotiate", "op", "queue", "copy_in", "collective", "copy_out", "callbacks"}
    )
    spans = {cat: (round(e["ts"]), round(e["ts"] + e["dur"])) for cat, e in a.items()}
    assert spans == {
        "negotiate": (1000, 6000),
        "op": (6000, 12000),
        "queue": (6000, 7000),
        "copy_in": (7000, 8000),
        "collective": (8000, 9000),
        "copy_out": (9000, 10000),
        "callbacks": (10000, 12000),
    }
    # Horovod's activity names, which users' scripts search a timeline for
    names = {cat: e["name"] for cat, e in a.items()}
    assert names == {
        "negotiate": "NEGOTIATE_ALLREDUCE",
        "op": "ALLREDUCE",
        "queue": "QUEUE",
        "copy_in": "MEMCPY_IN_FUSION_BUFFER",
        "collective": "MPI_ALLREDUCE",
        "copy_out": "MEMCPY_OUT_FUSION_BUFFER",
        "callbacks": "CALLBACKS",
    }
    assert a["collective"]["args"]["path"] == "MPI"
    assert b["negotiate"]["ts"] == pytest.approx(2000)
    # one batch id ties the fused tensors together
    assert a["op"]["args"]["batch"] == b["op"]["args"]["batch"] == a["copy_in"]["args"]["batch"]
    assert a["op"]["args"]["fused"] == 2 and a["op"]["args"]["shapes"] == [[4]]
    # the coordinator's report instants, and who was last
    reports = sorted((trace.track(e), e["args"]["rank"], round(e["ts"])) for e in trace.reports)
    assert reports == [("a", 0, 3000), ("a", 1, 3000), ("b", 0, 3000), ("b", 1, 5000)]
    assert {e["name"] for e in trace.reports} == {"0", "1"}  # named by the rank, as Horovod
    assert a["negotiate"]["args"] == {"ranks": 2, "last": [0, 1], "wait_for_last_us": 0.0}
    assert b["negotiate"]["args"]["last"] == [1]
    assert b["negotiate"]["args"]["wait_for_last_us"] == pytest.approx(2000)
    cycles = sorted(e["name"] for e in trace.slices[s.CYCLE])
    assert cycles == ["cycle 1", "cycle 2"]
    marks = [e for e in trace.events if e.get("name") == "CYCLE_START"]
    assert [(e["ph"], e["s"], round(e["ts"]), e["args"]["cycle"]) for e in marks] == [
        ("i", "g", 500, 1),
        ("i", "g", 4000, 2),
    ]


def _one_batch(timeline: Timeline, name: str, cycle: int) -> None:
    """What the engine records for one tensor that goes through the coordinator."""
    entry = SimpleNamespace(
        key=(0, name), submitted=timeline._builder._t0 + 0.001, params=_params(name)
    )
    timeline.cycle_began(cycle, [entry])
    timeline.reports([([_params(name)], None)])
    timeline.decided()
    timeline.batch_began()
    timeline.via(Transport.MPI)
    timeline.phase(s.COLLECTIVE)
    timeline.finishing()
    timeline.batch_ended([_response(name)])


@pytest.mark.parametrize("mark_cycles", [False, True])
def test_cycle_start_marks_only_with_mark_cycles(tmp_path, mark_cycles):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), mark_cycles=mark_cycles)
    _one_batch(timeline, "c", 1)
    timeline.close()
    trace = Trace(json.loads(path.read_text()))
    starts = [e for e in trace.events if e.get("name") == s.CYCLE_START]
    assert len(starts) == (1 if mark_cycles else 0)
    assert bool(trace.slices.get(s.CYCLE)) == mark_cycles


def test_a_batch_is_on_disk_as_valid_json_soon_after_it_ran(tmp_path):
    # Horovod's suite reads the file 0.1 s after an allreduce returned, while the job runs.
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), mark_cycles=True)
    try:
        for i in range(3):
            _one_batch(timeline, f"live.{i}", i + 1)
            deadline = time.monotonic() + 0.1
            while True:
                text = path.read_text()
                try:
                    events = json.loads(text)  # a complete JSON array, not a cut one
                except json.JSONDecodeError:  # read in the middle of a write
                    events = []
                if f"live.{i}" in text and events or time.monotonic() > deadline:
                    break
                time.sleep(0.005)
            names = {e.get("name") for e in events}
            assert {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "MPI_ALLREDUCE", "CYCLE_START"} <= names
            assert f"live.{i}" in Trace(events).tracks.values()
    finally:
        timeline.close()
    events = json.loads(path.read_text())
    assert events[-1]["name"] == "timeline end"
    assert {f"live.{i}" for i in range(3)} <= set(Trace(events).tracks.values())


@pytest.mark.parametrize(
    "path, kind, op, name",
    [
        (Transport.MPI, Kind.BROADCAST, 0, "MPI_BCAST"),
        (Transport.MPI, Kind.ALLGATHER, 0, "MPI_ALLGATHER"),
        (Transport.MPI, Kind.ALLTOALL, 0, "MPI_ALLTOALL"),
        (Transport.MPI, Kind.REDUCESCATTER, 0, "MPI_REDUCESCATTER"),
        (Transport.MPI, Kind.ALLREDUCE, int(ReduceOp.ADASUM), "MPI_ADASUM_ALLREDUCE"),
        (Transport.NCCL, Kind.ALLGATHER, 0, "NCCL_ALLGATHER"),
        (Transport.CUDA_AWARE_MPI, Kind.ALLREDUCE, 0, "MPI_ALLREDUCE"),
        (Transport.STAGED, Kind.ALLREDUCE, 0, "MPI_ALLREDUCE"),
        (Transport.HIERARCHICAL, Kind.ALLGATHER, 0, "HIERARCHICAL_ALLGATHER"),
    ],
)
def test_each_kind_and_path_has_horovods_name(path, kind, op, name):
    p = Params(set_id=0, name="t", kind=int(kind), op=op, dtypes=("<f4",), shapes=((4,),))
    records = [
        (s.R_SUBMIT, [((0, "t"), _ms(1), int(kind))]),
        (s.R_DECIDED, _ms(2)),
        (s.R_BATCH, [Response(0, p, p.key)], path, [_ms(3)], _ms(4), _ms(5)),
    ]
    t = _on(_trace(records), "t")
    assert t["collective"]["name"] == name
    assert t["collective"]["args"]["path"] == ("MPI" if path is Transport.MPI else path.value)
    assert t["negotiate"]["name"] == "NEGOTIATE_" + t["op"]["name"]


def test_a_batch_without_marks_is_one_collective_named_by_its_path():
    trace = _trace(
        [
            (s.R_SUBMIT, [((0, "g"), _ms(1), int(Kind.ALLREDUCE))]),
            (s.R_DECIDED, _ms(2)),
            (s.R_BATCH, [_response("g")], Transport.SHARED_MEMORY, [_ms(3)], _ms(5), _ms(6)),
        ]
    )
    g = _on(trace, "g")
    assert g["collective"]["name"] == "SHM_ALLREDUCE"
    assert g["collective"]["args"]["path"] == "shared memory"
    assert (g["collective"]["ts"], g["collective"]["dur"]) == pytest.approx((3000, 2000))
    assert g["negotiate"]["args"] == {"cached": True}  # no reports: the response cache
    assert "copy_in" not in g and trace.reports == []


def test_a_batch_rank_0_does_not_run_only_closes_its_negotiation():
    trace = _trace(
        [
            (s.R_REPORTS, _ms(1), [([], None), ([_params("x")], None), ([_params("x")], None)]),
            (s.R_DECIDED, _ms(2)),
            (s.R_BATCH, [_response("x")], None, [_ms(3)], None, _ms(3)),  # not a member
        ]
    )
    assert set(_on(trace, "x")) == {"negotiate"}
    assert summarize(trace)["batches"] == 0


def test_names_that_never_run_are_forgotten_past_a_bound():
    builder = TraceBuilder(T0)
    for i in range(MAX_OPEN + 100):
        builder.add((s.R_SUBMIT, [((0, f"n{i}"), _ms(1), 0)]), [])
    builder.add((s.R_SUBMIT, [((0, "join"), _ms(1), int(Kind.JOIN))]), [])  # never traced
    assert len(builder._open) == MAX_OPEN


def test_summary_counts_each_batch_once_and_names_the_straggler():
    summary = summarize(_trace(FUSED))
    assert summary["batches"] == 1
    assert summary["phases"]["collective: MPI_ALLREDUCE"] == pytest.approx((1, 1.0, 1.0))
    assert summary["phases"]["negotiate"][0] == 2  # per tensor
    assert summary["tensors"]["b"]["negotiate"] == pytest.approx((1, 4.0, 4.0))
    assert summary["late_ranks"] == {1: (1, pytest.approx(2.0))}
    text = format_summary(summary)
    assert "rank 1: last to report 1 times" in text and "copy in" in text


def _write(tmp_path, records) -> str:
    builder = TraceBuilder(T0, True)
    out = [builder.header()]
    for record in records:
        builder.add(record, out)
    path = tmp_path / "t.json"
    path.write_text("".join(out) + builder.footer(_ms(50)))
    return str(path)


def test_a_file_cut_anywhere_still_loads_the_events_before_the_cut(tmp_path):
    text = open(_write(tmp_path, FUSED)).read()
    complete = json.loads(text)
    cut = tmp_path / "cut.json"
    for end in range(1, len(text), 11):
        cut.write_text(text[:end])
        events = load(cut)
        assert events == complete[: len(events)]
    cut.write_text(text[: text.rindex("]")])  # all but the closing bracket
    assert load(cut) == complete
    cut.write_text(json.dumps({"traceEvents": complete})[:-30])
    assert 0 < len(load(cut)) < len(complete)
    cut.write_text("not a trace")
    with pytest.raises(ValueError, match="not a Chrome trace"):
        load(cut)


def test_the_recorder_writes_a_valid_file_and_ignores_records_after_close(tmp_path):
    path = tmp_path / "t.json"
    timeline = Timeline(str(path), mark_cycles=True)
    entry = SimpleNamespace(
        key=(0, "w"), submitted=timeline._builder._t0 + 0.001, params=_params("w")
    )
    timeline.cycle_began(1, [entry])
    timeline.reports([([_params("w")], None)])
    timeline.decided()
    timeline.batch_began()
    timeline.via(Transport.HIERARCHICAL)
    timeline.phase(s.COPY_IN)
    timeline.phase(s.COLLECTIVE)
    timeline.phase(s.COPY_OUT)
    timeline.finishing()
    timeline.batch_ended([_response("w")])
    timeline.close()
    timeline.close()
    timeline.decided()  # the engine may hold it for the rest of a cycle
    trace = Trace(json.loads(path.read_text()))
    w = _on(trace, "w")
    assert w["collective"]["name"] == "HIERARCHICAL_ALLREDUCE"
    assert {"negotiate", "copy_in", "copy_out", "callbacks"} <= set(w)
    assert trace.slices[s.CYCLE][0]["name"] == "cycle 1"


def test_the_command_line_summarises(tmp_path, capsys):
    # (the plot command draws the 2-rank job's trace in tests/parallel/test_core_timeline.py)
    assert timeline_main(["summary", _write(tmp_path, FUSED)]) == 0
    out = capsys.readouterr().out
    assert "Per phase" in out and "Stragglers" in out


def test_plotting_without_matplotlib_says_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert timeline_main(["plot", _write(tmp_path, FUSED), "-o", str(tmp_path / "x.png")]) == 2
    assert "pip install 'hvdlite[plot]'" in capsys.readouterr().err


ONE_TRACK = [
    (s.R_SUBMIT, [((0, "only"), _ms(1), int(Kind.ALLREDUCE))]),
    (s.R_REPORTS, _ms(2), [([_params("only")], None), ([_params("only")], None)]),
    (s.R_DECIDED, _ms(3)),
    (
        s.R_BATCH,
        [_response("only")],
        Transport.MPI,
        [_ms(4), (s.COLLECTIVE, _ms(5))],
        _ms(6),
        _ms(7),
    ),
]


@pytest.mark.parametrize("records", [ONE_TRACK, FUSED], ids=["one-track", "two-tracks"])
def test_the_plot_is_sized_to_its_tracks_and_cuts_nothing_off(records, tmp_path):
    pytest.importorskip("matplotlib")
    import warnings

    from hvdlite.timeline import plot
    from hvdlite.timeline.plot import draw_steps, plot_steps

    trace = _trace(records, mark_cycles=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layout warning, nothing else either
        fig, first, last = draw_steps(trace, 1, 1, title="t.json")
        assert plot_steps(trace, str(tmp_path / "p.png"), 1, 1) == (first, last)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # what savefig renders with for .png
    canvas.draw()
    renderer = canvas.get_renderer()
    whole = fig.bbox
    (ax,) = fig.axes
    parts = [fig.legends[0], ax.xaxis.label, ax.title, *ax.get_yticklabels()]
    for part in parts:
        box = part.get_window_extent(renderer)
        assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1, part
        assert whole.y0 - 1 <= box.y0 and box.y1 <= whole.y1 + 1, part
    # the legend sits below the axis label, not over it
    assert (
        fig.legends[0].get_window_extent(renderer).y1
        <= ax.xaxis.label.get_window_extent(renderer).y0 + 1
    )
    rows = len(ax.get_yticklabels())
    assert fig.get_size_inches()[1] == pytest.approx(plot._TOP + plot._ROW * rows + plot._BOTTOM)


def _batch(name):
    params = Params(set_id=0, name=name, kind=Kind.ALLREDUCE, shapes=((2,),), dtypes=("<f4",))
    return [Response(0, params, (0, name))]


def _run_batch(timeline, name):
    """What the engine calls around one batch."""
    timeline.batch_began()
    timeline.finishing()
    timeline.batch_ended(_batch(name))


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_a_timeline_that_cannot_be_written_turns_itself_off_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hvdlite"):
        timeline = Timeline("/dev/full")
        for i in range(2000):  # far more than one write buffer
            _run_batch(timeline, f"t{i}")
        timeline.close()
    warnings = [r for r in caplog.records if "timeline could not be written" in r.getMessage()]
    assert len(warnings) == 1


def test_timeline_rows_stay_bounded(tmp_path):
    timeline = Timeline(str(tmp_path / "t.json"))
    for i in range(3000):
        _run_batch(timeline, f"allreduce.noname.{i}")
    timeline.close()
    assert timeline.rows == 1
    timeline = Timeline(str(tmp_path / "t2.json"))
    for i in range(MAX_ROWS + 50):
        _run_batch(timeline, f"grad.{i}")
    timeline.close()
    assert timeline.rows == MAX_ROWS
