"""Rank 0's side of autotune: measure each setting, score it, choose the next.

The :class:`Tuner` watches what the engine executes (the names and bytes of
every batch, :meth:`Tuner.observe`) and counts *steps*: a step ends when a
name executed in it comes round again, as in a training loop.  Every
``steps_per_sample`` steps make one *sample*, scored as bytes reduced per
second of wall-clock time over those steps.  The first ``warmup_samples``
samples are not scored (start-up, caches, first allocations).  After a change
of setting the first step is not counted either: it may have started under the
old setting.

The first scored samples try the starting setting and settings spread over
the space; then the :class:`~hvdlite.autotune.optimizer.BayesianOptimizer`
proposes each next setting.  After ``max_samples`` scored samples the tuner
settles on the best one (:attr:`Tuner.finished`) and stops measuring.

Only rank 0 holds a Tuner; its :attr:`Tuner.setting` is what every rank runs,
carried by :mod:`hvdlite.autotune.link`.  Pure logic with an injectable clock.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Callable, Iterable

from ..util.safe_files import open_for_writing
from .setting import Setting
from .space import SearchSpace

__all__ = ["Tuner", "SampleLog", "INITIAL_SAMPLES"]

log = logging.getLogger("hvdlite")

#: Scored samples spent on spread-out settings (the start first) before the optimiser leads.
INITIAL_SAMPLES = 4
_COLUMNS = (
    "sample",
    "phase",
    "fusion_threshold_bytes",
    "cycle_time_ms",
    "shared_memory_allreduce",
    "hierarchical_allreduce",
    "steps",
    "seconds",
    "score_bytes_per_second",
)


def _announce(message: str) -> None:
    """Log *message* at INFO level even where the level shown is WARNING (the
    default): the setting autotune keeps is worth one line.  Not shown when the
    user asked for errors only."""
    if log.isEnabledFor(logging.WARNING):
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, (), None))


class SampleLog:
    """The CSV file of ``HVDLITE_AUTOTUNE_LOG``: a header, then one row per sample
    (``phase`` warmup or sample) and a last row (``best``) with the setting kept and,
    as its score, the mean of the samples measured with it (the setting is chosen by
    the model's prediction from every sample, so a single sample of another setting
    may have scored higher: noise).

    Opened at ``init()`` on rank 0 (a bad path fails ``init()`` on every rank);
    a write that fails later warns once and stops the log, never the job.
    """

    def __init__(self, path: str):
        self.path = path
        self._file = open_for_writing(path, newline="", encoding="utf-8")
        self._writer = csv.writer(self._file)
        self._row(_COLUMNS)

    def _row(self, values) -> None:
        if self._file is None:
            return
        try:
            self._writer.writerow(values)
            self._file.flush()
        except OSError as exc:
            log.warning("autotune log %s cannot be written (%s); it stops here", self.path, exc)
            self.close()

    def write(
        self, sample: int, phase: str, setting: Setting, steps: int, seconds: float, score: float
    ) -> None:
        self._row(
            (
                sample,
                phase,
                setting.fusion_threshold,
                f"{setting.cycle_time_ms:g}",
                int(setting.shared_memory_allreduce),
                int(setting.hierarchical_allreduce),
                steps,
                f"{seconds:.6f}",
                f"{score:.1f}",
            )
        )

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


class Tuner:
    """Chooses settings for every rank from measured throughput (see the module docstring)."""

    def __init__(
        self,
        space: SearchSpace,
        optimizer,
        *,
        warmup_samples: int = 3,
        steps_per_sample: int = 10,
        max_samples: int = 20,
        sample_log: SampleLog | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.space = space
        self.optimizer = optimizer  # add(index, score), propose() -> index, best() -> index
        self.steps_per_sample = steps_per_sample
        self.max_samples = max_samples
        self.sample_log = sample_log
        self._clock = clock
        self._warmup_left = warmup_samples
        self._initial = space.spread(min(INITIAL_SAMPLES, max_samples))
        self._current = self._initial[0]
        self.setting: Setting = space.settings[self._current]
        self.finished = False
        self.samples = 0  # scored samples so far
        self.warmups = 0  # warmup samples so far
        self._seen: set = set()  # names executed in the current step
        self._sample_start: float | None = None  # None: wait for the next step boundary
        self._steps = 0
        self._bytes = 0
        self._settle = False  # the next step may have begun under the previous setting

    # -------------------------------------------------------------- measuring
    def observe(self, keys: Iterable, nbytes: int) -> None:
        """The engine executed batches of these *keys*, moving *nbytes* per rank."""
        if self.finished:
            return
        seen = self._seen
        if seen.isdisjoint(keys):
            seen.update(keys)
        else:  # a name came round again: the previous step ended
            self._step_ended()
            self._seen = set(keys)
        self._bytes += nbytes

    def _step_ended(self) -> None:
        now = self._clock()
        if self._sample_start is None or self._settle:
            self._settle = False
            self._restart(now)
            return
        self._steps += 1
        if self._steps >= self.steps_per_sample:
            seconds = now - self._sample_start
            score = self._bytes / seconds if seconds > 0 else 0.0
            self._sample_done(score, self._steps, seconds)
            self._restart(now)

    def _restart(self, now: float) -> None:
        self._sample_start = now
        self._steps = 0
        self._bytes = 0

    # --------------------------------------------------------------- deciding
    def _sample_done(self, score: float, steps: int, seconds: float) -> None:
        if self._warmup_left > 0:
            self._warmup_left -= 1
            self.warmups += 1
            self._log(self.warmups, "warmup", steps, seconds, score)
            return
        self.samples += 1
        self.optimizer.add(self._current, score)
        self._log(self.samples, "sample", steps, seconds, score)
        log.info(
            "autotune sample %d/%d: %s: %.3g bytes/s",
            self.samples,
            self.max_samples,
            self.setting.describe(),
            score,
        )
        if self.samples >= self.max_samples:
            self._choose(self.optimizer.best())
            self.finished = True
            if self.sample_log is not None:
                self.sample_log.write(
                    self.samples, "best", self.setting, 0, 0.0, self._best_score()
                )
                self.sample_log.close()
            _announce(self.settled_line())
            return
        if self.samples < len(self._initial):
            self._choose(self._initial[self.samples])
        else:
            self._choose(self.optimizer.propose())

    def _choose(self, index: int) -> None:
        if index != self._current:
            self._settle = True
        self._current = index
        self.setting = self.space.settings[index]

    def _scores_of_current(self) -> list[float]:
        return [
            s for i, s in zip(self.optimizer.tried, self.optimizer.scores) if i == self._current
        ]

    def _best_score(self) -> float:
        """The ``best`` row's score: the mean of the samples measured with the setting
        kept.  The setting is the one whose score the model predicts highest from
        every sample, so one lucky sample of another setting can score above it."""
        scores = self._scores_of_current()
        return sum(scores) / len(scores) if scores else 0.0

    def settled_line(self) -> str:
        """The one line rank 0 prints when tuning ends."""
        scores = self._scores_of_current()
        top = max(self.optimizer.scores, default=0.0)
        return (
            f"autotune settled after {self.samples} samples: {self.setting.describe()}. "
            f"Kept for the highest throughput the model predicts from all samples (it "
            f"discounts one lucky measurement): {self._best_score() / 1e6:.4g} MB/s on "
            f"average over its {len(scores)} sample(s); the best single sample of any "
            f"setting measured {top / 1e6:.4g} MB/s."
        )

    def _log(self, number: int, phase: str, steps: int, seconds: float, score: float) -> None:
        if self.sample_log is not None:
            self.sample_log.write(number, phase, self.setting, steps, seconds, score)
