"""The settings autotune may try, and how the optimiser sees them.

The search space is a grid: fusion thresholds from 64 KiB to 256 MiB in powers
of two, cycle times from 0.5 to 50 ms, and each on/off switch that this job can
change at run time (see :func:`hvdlite.autotune.tuning_for`).  The starting
setting (the knobs the job was started with) is always one of the candidates,
even when it lies off the grid.  The optimiser sees each candidate as a row of
features in [0, 1]: the threshold and cycle time on a log scale, switches as 0
or 1.  Pure logic (numpy only): every rank could build it, only rank 0 does.
"""

from __future__ import annotations

import math

import numpy as np

from .setting import Setting

__all__ = ["SearchSpace", "THRESHOLDS", "CYCLE_TIMES_MS", "two_levels_worth_trying"]

THRESHOLDS = tuple(1 << k for k in range(16, 29))  # 64 KiB .. 256 MiB
CYCLE_TIMES_MS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)


def two_levels_worth_trying(node_sizes) -> bool:
    """Whether hierarchical allreduce belongs in the search space of a job whose
    nodes hold *node_sizes* ranks: it spans several nodes and some node has more
    than one rank, so the two levels can send a node's values across once (for
    float16 and bfloat16 batches, from 16-bit compression, as 16-bit node
    partial sums).  On one node, or with one rank per node, the two levels run as
    one flat collective and the switch would only add noise to the search."""
    sizes = list(node_sizes)
    return len(sizes) > 1 and max(sizes) > 1


def _scaled(value: float, low: float, high: float) -> float:
    """*value* on a log scale where *low* is 0 and *high* is 1 (clipped)."""
    if value <= low:
        return 0.0
    return min(1.0, math.log(value / low) / math.log(high / low))


class SearchSpace:
    """Candidate settings around *start*.

    *shared_memory*, *hierarchical*: whether that switch is tuned (else every
    candidate keeps *start*'s value).
    """

    def __init__(self, start: Setting, shared_memory: bool = False, hierarchical: bool = False):
        self.start = start
        self.switches = tuple(
            name
            for name, tuned in (
                ("shared_memory_allreduce", shared_memory),
                ("hierarchical_allreduce", hierarchical),
            )
            if tuned
        )
        shm_values = (False, True) if shared_memory else (start.shared_memory_allreduce,)
        hier_values = (False, True) if hierarchical else (start.hierarchical_allreduce,)
        grid = [
            Setting(t, c, s, h)
            for t in THRESHOLDS
            for c in CYCLE_TIMES_MS
            for s in shm_values
            for h in hier_values
        ]
        if start not in grid:
            grid.insert(0, start)
        self.settings: list[Setting] = grid
        self._index = {setting: i for i, setting in enumerate(grid)}
        self.features = np.array([self.features_of(s) for s in grid], dtype=float)

    def __len__(self) -> int:
        return len(self.settings)

    def index(self, setting: Setting) -> int:
        return self._index[setting]

    def features_of(self, setting: Setting) -> list[float]:
        row = [
            _scaled(setting.fusion_threshold, THRESHOLDS[0], THRESHOLDS[-1]),
            _scaled(setting.cycle_time_ms, CYCLE_TIMES_MS[0], CYCLE_TIMES_MS[-1]),
        ]
        return row + [float(getattr(setting, name)) for name in self.switches]

    def spread(self, count: int) -> list[int]:
        """*count* candidates far apart, the start first: each next one is the
        candidate farthest from those already chosen (ties: the lowest index),
        so the first samples see the whole space.  Deterministic."""
        chosen = [self.index(self.start)]
        nearest = np.linalg.norm(self.features - self.features[chosen[0]], axis=1)
        while len(chosen) < min(count, len(self)):
            pick = int(np.argmax(nearest))
            chosen.append(pick)
            nearest = np.minimum(
                nearest, np.linalg.norm(self.features - self.features[pick], axis=1)
            )
        return chosen
