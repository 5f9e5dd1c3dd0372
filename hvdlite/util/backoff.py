"""One waiting policy for every place a thread of hvdlite polls.

A :class:`Backoff` answers "how long to sleep before looking again" from the
time already waited: a fraction (``ratio``) of it, kept between ``floor`` and
``cap``.  Waiting briefly costs little latency; waiting long costs little CPU.
:meth:`Backoff.wait_for` adds an optional first phase that only yields the core
(``sched_yield``) between looks, for waits that usually end within
microseconds.  Pure Python, no MPI: the clock, sleep and yield are injectable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Sleep ``ratio`` times the time already waited, within [floor, cap] seconds."""

    __slots__ = ("floor", "cap", "ratio", "spin")

    def __init__(self, floor: float, cap: float, ratio: float = 1.0, spin: float = 0.0):
        if not 0 < floor <= cap:
            raise ValueError(f"Backoff needs 0 < floor <= cap, got {floor} and {cap}.")
        self.floor = floor
        self.cap = cap
        self.ratio = ratio
        self.spin = spin

    def delay(self, waited: float) -> float:
        """The pause before the next look, after *waited* seconds of waiting."""
        return min(self.cap, max(self.floor, waited * self.ratio))

    def wait_for(
        self,
        test: Callable[[], bool],
        clock=time.perf_counter,
        sleep=time.sleep,
        yield_core=os.sched_yield,
        timeout: float | None = None,
    ) -> bool:
        """Return True once ``test()`` is true: first look in a loop that yields the
        core for ``spin`` seconds, then sleep between looks as :meth:`delay` says.
        With *timeout* (seconds), return False once that much time passed first."""
        if test():
            return True
        now = clock()
        give_up = None if timeout is None else now + timeout
        spin_until = now + self.spin
        while now < spin_until:
            if test():
                return True
            yield_core()
            now = clock()
        sleeping_since = now
        while not test():
            now = clock()
            pause = self.delay(now - sleeping_since)
            if give_up is not None:
                if now >= give_up:
                    return False
                pause = min(pause, give_up - now)
            sleep(pause)
        return True
