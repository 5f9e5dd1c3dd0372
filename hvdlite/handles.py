"""Handles: what every asynchronous collective returns.

A :class:`Handle` is a :class:`concurrent.futures.Future`: ``poll(h)`` is
``h.done()`` and ``synchronize(h)`` is ``h.result()``.  It holds references to
the input and output buffers until the collective completed, so a caller may
drop its own references right after submitting.

A handle cannot be cancelled: once submitted, the other ranks count on this
rank's part in the collective.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

__all__ = ["Handle", "poll", "synchronize"]

_PENDING = concurrent.futures._base.PENDING
_FINISHED = concurrent.futures._base.FINISHED
_making_conditions = threading.Lock()


class Handle(concurrent.futures.Future):
    """The pending result of one collective (or one group of them).

    A training step makes hundreds of handles, and most are never waited on by
    a second thread, so a handle makes its lock only when something needs it:
    a thread that waits, a done-callback, ``concurrent.futures.wait``.  The
    engine completes it with :meth:`_complete`, which needs no lock until then.
    """

    # Until the condition is made, nothing can wait or register a callback (Future
    # does both under the condition), so these empty class defaults stand in for
    # the lists: fewer objects per handle for the garbage collector to track.
    _waiters: list | tuple = ()
    _done_callbacks: list | tuple = ()

    def __init__(self, name: str, keepalive=None, convert=None):
        # Future.__init__ is not called: it would make the lock right away.
        self._state = _PENDING
        self._result = None
        self._exception = None
        self._lock_made = None
        self.name = name
        self._keepalive = keepalive
        # Optional post-processing run in the caller's thread by synchronize().
        self._convert = convert
        self._engine = None  # set at submission; result() helps the engine make progress

    @property
    def _condition(self) -> threading.Condition:
        """The Future's condition, made on first use (exactly once, whichever thread
        asks), together with the lists it guards."""
        condition = self._lock_made
        if condition is None:
            with _making_conditions:
                condition = self._lock_made
                if condition is None:
                    self._waiters = []
                    self._done_callbacks = []
                    condition = self._lock_made = threading.Condition()
        return condition

    def _complete(self, result=None, exception: BaseException | None = None) -> None:
        """Engine side: finish the handle with *result* or *exception* (once).

        The state is set before the condition is looked at: a thread that makes
        the condition afterwards finds the handle finished under it, and one that
        made it before is woken (and its callbacks run) through it here.
        """
        if self._state != _PENDING:
            return
        self._result = result
        self._exception = exception
        self._state = _FINISHED
        if self._lock_made is None:
            return
        with self._lock_made:
            for waiter in self._waiters:
                if exception is None:
                    waiter.add_result(self)
                else:
                    waiter.add_exception(self)
            self._lock_made.notify_all()
        self._invoke_callbacks()

    def done(self) -> bool:
        return self._state == _FINISHED  # a plain read: handles are never cancelled

    def running(self) -> bool:
        return self._state == _PENDING

    def cancel(self) -> bool:
        """Always False: the other ranks count on this rank's part in the collective."""
        return False

    def result(self, timeout=None):
        if self._state != _FINISHED:
            timeout = self._drive(timeout)
        if self._state == _FINISHED and self._exception is None:
            # A finished handle never changes again, so this needs no lock (nor the
            # condition, which a handle that was driven to completion never made).
            return self._result
        return super().result(timeout)

    def exception(self, timeout=None):
        return super().exception(self._drive(timeout))

    def _drive(self, timeout):
        """Let the engine progress in this thread; returns the timeout left for the wait."""
        engine = self._engine
        if engine is None or self._state == _FINISHED:
            return timeout
        if timeout is None:
            engine.drive(self)
            return None
        deadline = time.monotonic() + timeout
        engine.drive(self, timeout)
        return max(0.0, deadline - time.monotonic())

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<hvdlite.Handle {self.name!r} {state}>"


def poll(handle: Handle) -> bool:
    """True when the collective behind *handle* has finished (successfully or not)."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for *handle* and return its output; raises HorovodInternalError if it failed."""
    if not isinstance(handle, concurrent.futures.Future):
        raise ValueError(
            f"synchronize() takes a handle returned by an *_async op, not {type(handle).__name__}."
        )
    result = handle.result()
    convert = getattr(handle, "_convert", None)
    return convert(result) if convert is not None else result
