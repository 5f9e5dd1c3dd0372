"""``python -m hvdlite.timeline plot FILE -o step.png``: one or more steps, drawn.

A step is found from the name submitted most often (in a training loop, each
gradient once per step): step *k* runs from that name's *k*-th negotiation to
its next.  Each tensor is a row, each phase a colour; ticks on a row are the
coordinator's report instants, and with cycle marks a top row shows the
engine's cycles.  Needs matplotlib (``pip install 'hvdlite[plot]'``).
"""

from __future__ import annotations

from collections import Counter

from . import schema as s
from .reader import Trace

__all__ = ["plot_steps", "draw_steps", "step_starts", "MAX_ROWS_DRAWN", "MissingMatplotlib"]

#: Tensor rows in one picture at most (the first to start in the window).
MAX_ROWS_DRAWN = 60
_COLOURS = {
    s.NEGOTIATE: "#c9c9c9",
    s.QUEUE: "#f2c14e",
    s.COPY_IN: "#5b9bd5",
    s.COLLECTIVE: "#d1495b",
    s.COPY_OUT: "#66a182",
    s.CALLBACKS: "#8d6cab",
}


class MissingMatplotlib(RuntimeError):
    """Plotting was asked for without matplotlib installed."""


def step_starts(trace: Trace) -> list[float]:
    """Start times (us) of the steps: the negotiations of the most frequent name."""
    slices = trace.slices.get(s.NEGOTIATE) or trace.slices.get(s.OPERATION) or []
    if not slices:
        return []
    counts = Counter(e.get("tid") for e in slices)
    first_seen: dict = {}
    for e in slices:
        first_seen.setdefault(e.get("tid"), float(e["ts"]))
    best = max(counts, key=lambda tid: (counts[tid], -first_seen[tid]))
    return sorted(float(e["ts"]) for e in slices if e.get("tid") == best)


def _window(trace: Trace, first: int, count: int) -> tuple[float, float, int, int]:
    starts = step_starts(trace)
    if not starts:
        raise ValueError("the trace has no tensor slices to draw")
    first = min(max(first, 1), len(starts))
    last = min(first + count - 1, len(starts))
    end_times = [
        float(e["ts"]) + float(e.get("dur", 0)) for e in trace.events if e.get("ph") == "X"
    ]
    lo = starts[first - 1]
    hi = starts[last] if last < len(starts) else max(end_times)
    return lo, hi, first, last


def plot_steps(
    trace: Trace, out: str, first: int = 2, count: int = 1, title: str = ""
) -> tuple[int, int]:
    """Draw steps *first* .. *first* + *count* - 1 (1-based, clamped to the trace)
    into the image *out*; returns the steps drawn."""
    fig, first, last = draw_steps(trace, first, count, title)
    fig.savefig(out, dpi=110)
    return first, last


# The figure's layout, in inches: it grows with its rows, and its margins are fixed
# (the title above, the time axis and the legend below, the labels on the left), so
# one row or sixty, nothing is cut off and no layout engine has to guess.
_WIDTH = 12.0
_ROW = 0.28
_TOP = 0.45
_BOTTOM = 0.85  # tick labels, the axis label, then the legend
_RIGHT = 0.25
_LABEL_CHAR = 0.06  # the width of a 7-point character, about


def draw_steps(trace: Trace, first: int = 2, count: int = 1, title: str = ""):
    """The figure :func:`plot_steps` saves: ``(figure, first, last)``."""
    try:
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise MissingMatplotlib(
            "plotting a timeline needs matplotlib: pip install 'hvdlite[plot]' "
            "(or pip install matplotlib)"
        ) from exc
    lo, hi, first, last = _window(trace, first, count)

    def inside(e) -> bool:
        return float(e["ts"]) < hi and float(e["ts"]) + float(e.get("dur", 0)) > lo

    rows: dict[int, list] = {}
    for phase, event in trace.phase_slices():
        if inside(event):
            rows.setdefault(event.get("tid"), []).append((phase, event))
    order = sorted(rows, key=lambda tid: min(float(e["ts"]) for _, e in rows[tid]))
    order = order[:MAX_ROWS_DRAWN]
    cycles = [e for e in trace.slices.get(s.CYCLE, ()) if inside(e)]
    labels = (["engine cycles"] if cycles else []) + [trace.tracks.get(t, str(t)) for t in order]
    left = min(max(1.0, 0.3 + _LABEL_CHAR * max((len(x) for x in labels), default=0)), 5.0)
    height = _TOP + _ROW * max(len(labels), 1) + _BOTTOM
    fig = Figure(figsize=(_WIDTH, height))
    fig.subplots_adjust(
        left=left / _WIDTH,
        right=1 - _RIGHT / _WIDTH,
        top=1 - _TOP / height,
        bottom=_BOTTOM / height,
    )
    ax = fig.add_subplot()

    def ms(t: float) -> float:
        return (t - lo) / 1e3

    y0 = 0
    if cycles:
        bars = [(ms(float(e["ts"])), max(float(e.get("dur", 0)) / 1e3, 1e-3)) for e in cycles]
        ax.broken_barh(bars, (0.15, 0.7), facecolors=["#999999", "#cccccc"] * len(bars))
        y0 = 1
    row_of = {tid: y0 + i for i, tid in enumerate(order)}
    for tid in order:
        y = row_of[tid]
        by_phase: dict[str, list] = {}
        for phase, e in rows[tid]:
            by_phase.setdefault(phase, []).append(
                (ms(float(e["ts"])), max(float(e.get("dur", 0)) / 1e3, 1e-3))
            )
        for phase, bars in by_phase.items():
            ax.broken_barh(bars, (y + 0.15, 0.7), facecolors=_COLOURS[phase])
    ticks = [
        (ms(float(e["ts"])), row_of[e.get("tid")])
        for e in trace.reports
        if e.get("tid") in row_of and lo <= float(e["ts"]) < hi
    ]
    if ticks:
        ax.plot([x for x, _ in ticks], [y + 0.5 for _, y in ticks], "k|", markersize=9)
    ax.set_yticks([i + 0.5 for i in range(len(labels))], labels, fontsize=7)
    ax.set_ylim(len(labels), 0)
    ax.set_xlim(0, ms(hi))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("ms from the start of the step", fontsize=8)
    steps = f"step {first}" if first == last else f"steps {first}-{last}"
    ax.set_title(f"{title}: {steps}" if title else steps, fontsize=9)
    legend = [Patch(color=c, label=s.LABELS[p]) for p, c in _COLOURS.items()]
    if ticks:
        legend.append(
            Line2D(
                [],
                [],
                color="black",
                marker="|",
                linestyle="None",
                label="a rank reported (coordinator)",
            )
        )
    fig.legend(
        handles=legend,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.05 / height),
        ncol=len(legend),
        fontsize=7,
        frameon=False,
    )
    return fig, first, last
