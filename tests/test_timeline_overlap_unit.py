"""The overlap report without MPI: hand-made traces of training steps, the steps
track the builder draws from the training thread's spans, and the command line.

tests/parallel/test_torch_timeline_overlap.py checks a real 2-rank torch job's trace.
"""

from __future__ import annotations

import json

import pytest

from hvdlite.timeline import Timeline, Trace
from hvdlite.timeline import schema as s
from hvdlite.timeline import steps as steps_module
from hvdlite.timeline.__main__ import main as timeline_main
from hvdlite.timeline.events import TraceBuilder
from hvdlite.timeline.overlap import format_overlap, overlap, totals, union
from hvdlite.timeline.steps import StepSpans

pytestmark = pytest.mark.timeout(60)

T0 = 1000.0


def _span(phase, ts, dur, step):
    return {
        "ph": "X",
        "cat": phase,
        "name": s.ACTIVITIES[phase],
        "pid": 0,
        "tid": s.STEPS_TRACK,
        "ts": ts,
        "dur": dur,
        "args": {"step": step},
    }


def _collective(ts, dur, batch, tid=5):
    return {
        "ph": "X",
        "cat": s.COLLECTIVE,
        "name": "MPI_ALLREDUCE",
        "pid": 0,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"batch": batch, "path": "MPI"},
    }


def _step(step, start, backward, synchronize):
    return [
        _span(s.BACKWARD, start, backward, step),
        _span(s.SYNCHRONIZE, start + backward, synchronize, step),
    ]


# Step 1: backward 0-100 us, synchronize 100-160.  Batch 1 runs 30-50 (hidden), batch
# 2 runs 90-130 and crosses backward's end (10 hidden, 30 exposed), batch 3 runs
# 120-150 beside batch 2 (its part after 130 counts once: 20 exposed).
# Step 2: backward 1000-1100, synchronize 1100-1150; one batch 1100-1140, all exposed.
# A broadcast at -50 belongs to no step.
TWO_STEPS = (
    _step(1, 0.0, 100.0, 60.0)
    + _step(2, 1000.0, 100.0, 50.0)
    + [
        _collective(30.0, 20.0, 1),
        _collective(30.0, 20.0, 1, tid=6),  # batch 1 fused two tensors: drawn twice
        _collective(90.0, 40.0, 2),
        _collective(120.0, 30.0, 3),
        _collective(1100.0, 40.0, 4),
        _collective(-50.0, 10.0, 0),
    ]
)


def test_union_merges_overlapping_and_touching_intervals_and_drops_empty_ones():
    assert union([(5, 7), (1, 3), (2, 4), (4, 4.5), (9, 9)]) == [(1, 4.5), (5, 7)]
    assert union([]) == []


def test_each_step_splits_its_communication_into_hidden_and_exposed():
    steps, outside = overlap(Trace(TWO_STEPS))
    assert outside == 1
    first, second = steps
    assert (first.step, first.batches) == (1, 3)
    assert first.communication == pytest.approx(20 + 60)  # 30-50, then 90-150 as one
    assert first.hidden == pytest.approx(20 + 10)
    assert first.exposed == pytest.approx(50)
    assert first.hidden_fraction == pytest.approx(30 / 80)
    assert (second.communication, second.hidden, second.exposed) == (40.0, 0.0, 40.0)
    for x in steps:
        assert x.hidden + x.exposed == pytest.approx(x.communication)


def test_totals_sum_the_steps_and_the_report_leaves_the_first_out():
    steps, outside = overlap(Trace(TWO_STEPS))
    t = totals(steps)
    assert t["communication_ms"] == pytest.approx(0.120)
    assert t["hidden_ms"] == pytest.approx(0.030)
    assert t["exposed_ms"] == pytest.approx(0.090)
    assert t["hidden_fraction"] == pytest.approx(0.25)
    text = format_overlap(steps, outside, skip=1)
    assert "Rank 0's view" in text
    assert "Total over 1 steps (step 2; the first 1 left out)" in text
    assert "hidden fraction 0.0%" in text
    assert "1 collectives ran outside" in text
    everything = format_overlap(steps, outside, skip=0)
    assert "hidden fraction 25.0%" in everything


def test_a_step_cut_off_before_its_synchronize_is_left_out():
    events = _step(1, 0.0, 100.0, 60.0) + [_span(s.BACKWARD, 500.0, 80.0, 2)]
    steps, _ = overlap(Trace(events + [_collective(10.0, 5.0, 1)]))
    assert [x.step for x in steps] == [1]
    assert steps[0].hidden == 5.0


def test_a_trace_without_steps_says_where_they_come_from():
    steps, outside = overlap(Trace([_collective(10.0, 5.0, 1)]))
    assert (steps, outside) == ([], 1)  # the collective belongs to no step
    assert "DistributedOptimizer" in format_overlap(steps, outside)


def _built(records) -> Trace:
    builder = TraceBuilder(T0)
    out = [builder.header()]
    for record in records:
        builder.add(record, out)
    out.append(builder.footer(T0 + 1.0))
    return Trace(json.loads("".join(out)))


def test_the_builder_draws_the_spans_on_one_named_steps_track():
    trace = _built(
        [
            (s.R_SPAN, s.BACKWARD, T0 + 0.010, T0 + 0.030, 1),
            (s.R_SPAN, s.SYNCHRONIZE, T0 + 0.030, T0 + 0.035, 1),
            (s.R_SPAN, s.BACKWARD, T0 + 0.050, T0 + 0.070, 2),
        ]
    )
    assert trace.tracks == {s.STEPS_TRACK: "training steps"}
    back = trace.slices[s.BACKWARD]
    assert [e["name"] for e in back] == ["BACKWARD", "BACKWARD"]
    assert back[0]["ts"] == pytest.approx(10_000) and back[0]["dur"] == pytest.approx(20_000)
    assert [e["args"]["step"] for e in back] == [1, 2]
    (wait,) = trace.slices[s.SYNCHRONIZE]
    assert (wait["name"], wait["tid"], wait["dur"]) == ("SYNCHRONIZE", s.STEPS_TRACK, 5000.0)


def test_step_spans_record_only_while_a_timeline_is_written(tmp_path, monkeypatch):
    spans = StepSpans()
    spans.backward_began()  # no hvdlite running: nothing to record, nothing read
    assert spans._timeline is None and not spans.idle
    spans.synchronize_began()
    spans.synchronize_ended()
    assert spans.idle and spans.step == 2

    path = tmp_path / "steps.json"
    timeline = Timeline(str(path))
    monkeypatch.setattr(steps_module, "active_timeline", lambda: timeline)
    spans.backward_began()
    spans.synchronize_began()
    spans.synchronize_ended()
    timeline.close()
    trace = Trace.load(path)
    assert [e["args"]["step"] for e in trace.slices[s.BACKWARD]] == [2]
    assert [e["args"]["step"] for e in trace.slices[s.SYNCHRONIZE]] == [2]
    (step,) = overlap(trace)[0]
    assert (step.step, step.communication) == (2, 0.0)


def test_the_command_line_prints_the_overlap(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(TWO_STEPS))
    assert timeline_main(["overlap", str(path), "--skip", "0"]) == 0
    out = capsys.readouterr().out
    assert "hidden fraction 25.0%" in out
    assert "exposed 0.090 ms" in out
