"""``python -m hvdlite.timeline overlap FILE``: how much of each step's communication
backward hid.

Reads the steps track (:mod:`~hvdlite.timeline.steps`): each training step is
its ``backward`` slice (from the step's first gradient to ``synchronize()``)
and the ``synchronize`` slice after it.  A step's window runs from the start
of its backward slice to the end of its synchronize slice; every collective
slice that starts inside the window belongs to the step (for a
DistributedOptimizer: its gradient allreduces).  Per step:

- communication: the length of the union of those collective slices (batches
  that ran side by side count once; negotiation, queueing and the fusion
  buffer's copies are not communication here);
- hidden: the part of that union inside the backward slice, where the
  transfers ran while backward computed;
- exposed: the rest, after backward ended: what ``synchronize()`` waited for.
  hidden + exposed = communication.

Everything is rank 0's view: the timeline is written by rank 0, so its
backward pass and its engine's collectives (a collective lasts until rank 0's
part of it is done, waiting for slower peers included).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from . import schema as s
from .reader import Trace

__all__ = ["StepOverlap", "union", "overlap", "steps_of", "totals", "format_overlap"]


@dataclass
class StepOverlap:
    """One step's figures, in microseconds (the trace's unit)."""

    step: int
    start: float  # the backward slice's start
    backward: float  # the backward slice's length
    synchronize: float  # the synchronize slice's length
    batches: int  # collective slices (distinct batches) in the step's window
    communication: float
    hidden: float

    @property
    def exposed(self) -> float:
        return self.communication - self.hidden

    @property
    def hidden_fraction(self) -> float:
        return self.hidden / self.communication if self.communication > 0 else 0.0


def union(intervals) -> list[tuple[float, float]]:
    """The disjoint, sorted intervals that cover *intervals* ((start, end) pairs)."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _length(intervals, lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """The length of disjoint *intervals* inside [lo, hi]."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


def steps_of(trace: Trace) -> list[tuple[int, dict, dict]]:
    """(step, backward slice, synchronize slice) of every step on the steps track,
    in time order: each backward slice with the synchronize slice of the same step
    that starts nearest its end.  A backward slice without one (a trace cut
    mid-step) is left out."""
    waits: dict = {}
    for event in trace.slices.get(s.SYNCHRONIZE, ()):
        waits.setdefault((event.get("args") or {}).get("step"), []).append(event)
    steps = []
    for event in sorted(trace.slices.get(s.BACKWARD, ()), key=lambda e: float(e["ts"])):
        step = (event.get("args") or {}).get("step")
        end = float(event["ts"]) + float(event.get("dur", 0.0))
        candidates = waits.get(step)
        if not candidates:
            continue
        wait = min(candidates, key=lambda w: abs(float(w["ts"]) - end))
        candidates.remove(wait)
        steps.append((int(step), event, wait))
    return steps


def overlap(trace: Trace) -> tuple[list[StepOverlap], int]:
    """Every step's :class:`StepOverlap`, and how many collectives ran outside any
    step's window (a broadcast of the parameters, a metric's allreduce...)."""
    steps = steps_of(trace)
    windows = []
    for step, back, wait in steps:
        start = float(back["ts"])
        end = max(float(wait["ts"]) + float(wait.get("dur", 0.0)), start)
        windows.append((start, end, step, back, wait))
    starts = [w[0] for w in windows]
    inside: list[list[tuple[float, float]]] = [[] for _ in windows]
    seen = set()
    outside = 0
    for event in trace.slices.get(s.COLLECTIVE, ()):
        ts = float(event["ts"])
        mark = ((event.get("args") or {}).get("batch"), ts)
        if mark in seen:  # a fused batch's slice, repeated on each of its tensors' tracks
            continue
        seen.add(mark)
        i = bisect.bisect_right(starts, ts) - 1
        if i < 0 or ts > windows[i][1]:
            outside += 1
            continue
        inside[i].append((ts, ts + float(event.get("dur", 0.0))))
    result = []
    for (start, _end, step, back, wait), intervals in zip(windows, inside, strict=True):
        covered = union(intervals)
        backward_end = start + float(back.get("dur", 0.0))
        result.append(
            StepOverlap(
                step=step,
                start=start,
                backward=float(back.get("dur", 0.0)),
                synchronize=float(wait.get("dur", 0.0)),
                batches=len(intervals),
                communication=_length(covered),
                hidden=_length(covered, start, backward_end),
            )
        )
    return result, outside


def totals(steps: list[StepOverlap]) -> dict:
    """Sums over *steps* (milliseconds) and the hidden fraction of their communication."""
    comm = sum(x.communication for x in steps)
    hidden = sum(x.hidden for x in steps)
    return {
        "steps": len(steps),
        "backward_ms": sum(x.backward for x in steps) / 1e3,
        "synchronize_ms": sum(x.synchronize for x in steps) / 1e3,
        "communication_ms": comm / 1e3,
        "hidden_ms": hidden / 1e3,
        "exposed_ms": (comm - hidden) / 1e3,
        "hidden_fraction": hidden / comm if comm > 0 else 0.0,
    }


def format_overlap(steps: list[StepOverlap], outside: int = 0, skip: int = 1) -> str:
    """The report: one row per step, then the totals over the steps after the first
    *skip* (the first step negotiates every name with the coordinator)."""
    if not steps:
        return (
            "no training steps on this timeline: it has no backward/synchronize slices. "
            "They are drawn on rank 0 by hvdlite.torch's DistributedOptimizer while the "
            "timeline is written (start it before the steps you want, e.g. "
            "HVDLITE_TIMELINE=file or hvd.start_timeline(file))."
        )
    lines = [
        "Rank 0's view (rank 0 writes the timeline): its backward pass, and the collective "
        "phase of its engine's batches",
        f"{'step':>6s}{'backward':>11s}{'synchronize':>13s}{'batches':>9s}{'comm ms':>10s}"
        f"{'hidden ms':>11s}{'exposed ms':>12s}{'hidden':>8s}",
    ]
    for x in steps:
        lines.append(
            f"{x.step:6d}{x.backward / 1e3:11.3f}{x.synchronize / 1e3:13.3f}{x.batches:9d}"
            f"{x.communication / 1e3:10.3f}{x.hidden / 1e3:11.3f}{x.exposed / 1e3:12.3f}"
            f"{x.hidden_fraction:8.0%}"
        )
    counted = steps[skip:] if len(steps) > skip else steps
    t = totals(counted)
    which = (
        f"steps {counted[0].step}-{counted[-1].step}"
        if len(counted) > 1
        else f"step {counted[0].step}"
    )
    lines += [
        "",
        f"Total over {t['steps']} steps ({which}"
        + (f"; the first {skip} left out" if counted is not steps else "")
        + "):",
        f"  communication {t['communication_ms']:.3f} ms, hidden behind backward "
        f"{t['hidden_ms']:.3f} ms, exposed {t['exposed_ms']:.3f} ms",
        f"  hidden fraction {t['hidden_fraction']:.1%}; backward {t['backward_ms']:.3f} ms, "
        f"synchronize {t['synchronize_ms']:.3f} ms",
    ]
    if outside:
        lines.append(f"  ({outside} collectives ran outside every step's window: not counted)")
    return "\n".join(lines)
