"""A training step on rank 0's timeline: the backward pass and the wait for its gradients.

A framework's distributed optimizer owns one :class:`StepSpans` and tells it
three things: the first gradient of a step was accumulated
(:meth:`~StepSpans.backward_began`, from its gradient hooks while
:attr:`~StepSpans.idle`), ``synchronize()`` began, and ``synchronize()`` ended.
Where a timeline is being written (rank 0, between ``start_timeline`` and
``stop_timeline`` or with ``HVDLITE_TIMELINE``) the two spans that makes, the
``backward`` and the ``synchronize`` phase of :mod:`~hvdlite.timeline.schema`,
go to the timeline's queue; the engine's own records show which collectives ran
inside each.

Off, it costs one look at the running state per step (at the step's first
gradient) and one attribute test per gradient hook; nothing is read from the
clock.  Cross-rank contract: none (a rank without a timeline, every rank but 0,
records nothing).
"""

from __future__ import annotations

from ..engine import runtime
from . import schema
from .recorder import Timeline, clock

__all__ = ["StepSpans", "active_timeline"]


def active_timeline() -> Timeline | None:
    """The timeline this process writes now (only rank 0 has one), or None."""
    st = runtime.current()
    return None if st is None else st.timeline


class StepSpans:
    """One optimizer's steps, drawn on the timeline while one is written.

    Used from the training thread only; the timeline's queue takes the spans.
    """

    __slots__ = ("idle", "step", "_timeline", "_began", "_waiting")

    def __init__(self):
        #: No gradient of the current step seen yet (the hooks test this).
        self.idle = True
        #: The step being recorded, counted from 1 (the optimizer's synchronize calls + 1).
        self.step = 1
        self._timeline: Timeline | None = None
        self._began = 0.0
        self._waiting: float | None = None

    def backward_began(self) -> None:
        """The step's first gradient was accumulated: its backward pass is under way."""
        self.idle = False
        timeline = self._timeline = active_timeline()
        if timeline is not None:
            self._began = clock()

    def synchronize_began(self) -> None:
        """``synchronize()`` starts: backward (as far as the optimizer can tell) is over."""
        timeline = self._timeline
        if timeline is not None:
            self._waiting = now = clock()
            timeline.span(schema.BACKWARD, self._began, now, self.step)

    def synchronize_ended(self) -> None:
        """``synchronize()`` returned (or raised): the step's gradients are reduced."""
        timeline, waiting = self._timeline, self._waiting
        if timeline is not None and waiting is not None:
            timeline.span(schema.SYNCHRONIZE, waiting, clock(), self.step)
        self._timeline = self._waiting = None
        self.idle = True
        self.step += 1
