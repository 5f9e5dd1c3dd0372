"""``python -m hvdlite.timeline summary FILE``: where the time went, as text.

Three tables from one trace:

- per phase: how many, total and median milliseconds.  Negotiation is counted
  per tensor (tensors negotiate side by side, so those totals overlap); the
  execution phases once per batch (a fused batch's slices repeat on each of
  its tensors' tracks);
- per tensor: total and median of each phase on that tensor's track;
- stragglers: for negotiations that went through the coordinator (rank 0's
  report instants), which ranks reported last and how long the first reporter
  waited for them.  Names decided by the response cache have no reports.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from . import schema as s
from .reader import Trace

__all__ = ["summarize", "format_summary"]


def _stats(durations_us: list[float]) -> tuple[int, float, float]:
    """(count, total ms, median ms)."""
    if not durations_us:
        return 0, 0.0, 0.0
    return (len(durations_us), sum(durations_us) / 1e3, statistics.median(durations_us) / 1e3)


def summarize(trace: Trace) -> dict:
    """The figures of the three tables, as plain data (see the module docstring)."""
    per_phase: dict[str, list[float]] = defaultdict(list)
    seen_batches = set()
    per_tensor: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for phase, event in trace.phase_slices():
        dur = float(event.get("dur", 0.0))
        per_tensor[trace.track(event)][phase].append(dur)
        if phase == s.NEGOTIATE:
            per_phase[phase].append(dur)
            continue
        batch = (event.get("args") or {}).get("batch")
        mark = (batch, phase, event.get("ts"))
        if batch is not None and mark in seen_batches:
            continue
        seen_batches.add(mark)
        row = f"{phase}: {event.get('name')}" if phase == s.COLLECTIVE else phase
        per_phase[row].append(dur)

    stragglers: dict[str, dict] = {}
    last_counts: Counter = Counter()
    waits_by_rank: dict[int, list[float]] = defaultdict(list)
    waited = 0
    for event in trace.slices.get(s.NEGOTIATE, ()):
        args = event.get("args") or {}
        if "last" not in args:
            continue
        name = trace.track(event)
        entry = stragglers.setdefault(
            name, {"negotiations": 0, "waited": 0, "last": Counter(), "waits_us": []}
        )
        entry["negotiations"] += 1
        wait = float(args.get("wait_for_last_us", 0.0))
        if wait <= 0:
            continue  # every rank reported in the same cycle: nobody was late
        waited += 1
        entry["waited"] += 1
        entry["waits_us"].append(wait)
        for rank in args["last"]:
            entry["last"][rank] += 1
            last_counts[rank] += 1
            waits_by_rank[rank].append(wait)

    batches = {(e.get("args") or {}).get("batch") for e in trace.slices.get(s.OPERATION, ())}
    times = [float(e.get("ts", 0.0)) for e in trace.events if "ts" in e and e.get("ph") != "M"]
    return {
        "span_ms": (max(times) - min(times)) / 1e3 if times else 0.0,
        "tracks": len(trace.tracks)
        - sum(t in trace.tracks for t in (s.CYCLES_TRACK, s.STEPS_TRACK)),
        "batches": len(batches - {None}),
        "cycles": len(trace.slices.get(s.CYCLE, ())),
        "phases": {row: _stats(d) for row, d in per_phase.items()},
        "tensors": {
            name: {phase: _stats(d) for phase, d in phases.items()}
            for name, phases in per_tensor.items()
        },
        "stragglers": stragglers,
        "late_ranks": {
            rank: (count, statistics.median(waits_by_rank[rank]) / 1e3)
            for rank, count in last_counts.items()
        },
        "waited": waited,
        "coordinated": sum(e["negotiations"] for e in stragglers.values()),
    }


def _phase_order(row: str) -> tuple:
    phase = row.split(":", 1)[0]
    return (s.PHASES.index(phase) if phase in s.PHASES else len(s.PHASES), row)


def format_summary(summary: dict, top: int = 30) -> str:
    lines = [
        f"{summary['span_ms']:.1f} ms traced, {summary['tracks']} tensor tracks, "
        f"{summary['batches']} batches"
        + (f", {summary['cycles']} engine cycles" if summary["cycles"] else "")
    ]

    lines += [
        "",
        "Per phase (negotiate: per tensor, they overlap; the others: per batch)",
        f"{'phase':44s}{'count':>8s}{'total ms':>12s}{'median ms':>12s}",
    ]
    for row in sorted(summary["phases"], key=_phase_order):
        n, total, median = summary["phases"][row]
        phase, _, path = row.partition(": ")
        label = s.LABELS.get(phase, phase) + (f": {path}" if path else "")
        lines.append(f"{label:44s}{n:8d}{total:12.3f}{median:12.3f}")

    tensors = summary["tensors"]
    ranked = sorted(tensors, key=lambda name: -sum(v[1] for v in tensors[name].values()))
    header = "".join(f"{s.LABELS[p]:>20s}" for p in s.PHASES)
    lines += [
        "",
        f"Per tensor: total / median ms per phase (top {min(top, len(ranked))} of "
        f"{len(ranked)} by total time)",
        f"{'tensor':32s}{'count':>6s}{header}",
    ]
    for name in ranked[:top]:
        phases = tensors[name]
        count = max((v[0] for v in phases.values()), default=0)
        cells = "".join(
            f"{phases[p][1]:11.3f} /{phases[p][2]:7.3f}" if p in phases else f"{'-':>20s}"
            for p in s.PHASES
        )
        shown = name if len(name) <= 31 else "..." + name[-28:]
        lines.append(f"{shown:32s}{count:6d}{cells}")

    lines += ["", "Stragglers (negotiations through the coordinator; rank 0's report times)"]
    if not summary["coordinated"]:
        lines.append(
            "  none recorded: every tensor was decided by the response cache. "
            "Start the job with HVDLITE_CACHE_CAPACITY=0 to send every name to the "
            "coordinator and see which ranks report last."
        )
        return "\n".join(lines)
    lines.append(
        f"  {summary['coordinated']} negotiations, {summary['waited']} of them waited "
        "for a later cycle's report"
    )
    for rank, (count, median) in sorted(summary["late_ranks"].items(), key=lambda kv: -kv[1][0]):
        lines.append(
            f"  rank {rank}: last to report {count} times, median wait for it {median:.3f} ms"
        )
    late = {n: e for n, e in summary["stragglers"].items() if e["waited"]}
    if late:
        lines.append(
            f"  {'tensor':32s}{'waited':>8s}{'median ms':>11s}  slowest ranks (times last)"
        )
        for name in sorted(late, key=lambda n: -sum(late[n]["waits_us"]))[:top]:
            e = late[name]
            slow = ", ".join(f"{r} ({c})" for r, c in e["last"].most_common(5))
            shown = name if len(name) <= 31 else "..." + name[-28:]
            lines.append(
                f"  {shown:32s}{e['waited']:5d}/{e['negotiations']:<2d}"
                f"{statistics.median(e['waits_us']) / 1e3:11.3f}  {slow}"
            )
    return "\n".join(lines)
