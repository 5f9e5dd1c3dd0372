"""Handles: what every asynchronous collective returns.

A :class:`Handle` is a :class:`concurrent.futures.Future`: ``poll(h)`` is
``h.done()`` and ``synchronize(h)`` is ``h.result()`` passed through the
conversions attached with :meth:`Handle.add_conversion`.  It holds references
to the input and output buffers until the collective completed, so a caller
may drop its own references right after submitting.

A handle cannot be cancelled: once submitted, the other ranks count on this
rank's part in the collective.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable

__all__ = ["Handle", "poll", "synchronize"]

_Future = concurrent.futures.Future
_making_futures = threading.Lock()


class Handle(_Future):
    """The pending result of one collective (or one group of them).

    The engine finishes a handle with the public :meth:`set_result` /
    :meth:`set_exception`.  A training step makes hundreds of handles and most
    are never waited on by a second thread, so a handle keeps its outcome in
    three plain fields and sets up its Future part (a condition variable and
    its lists) only when something first needs it: a thread that waits, a
    done-callback, ``concurrent.futures.wait``.  Setting up runs the Future's
    own constructor, then replays an outcome that arrived before, so the
    Future part sees exactly one completion either way.
    """

    def __init__(self, name: str, keepalive=None):
        # Future.__init__ runs later, in _future_part(), if it is ever needed.
        self._finished = False
        self._value = None
        self._error: BaseException | None = None
        self._future_ready = False
        self.name = name
        self._keepalive = keepalive
        self._conversion: Callable | None = None
        self.engine = None  # set at submission: result() lets the engine progress

    # ----------------------------------------------------- the Future part
    def __getattr__(self, attribute):
        # Only attributes the Future part defines can be missing here: every one
        # of Handle's own is set in __init__.  Set the part up, then look again.
        if attribute.startswith("__") or self.__dict__.get("_future_ready", True):
            raise AttributeError(attribute)
        self._future_part()
        return object.__getattribute__(self, attribute)

    def _future_part(self) -> None:
        """Run the Future's constructor once (whichever thread asks first), then
        hand it the outcome if the engine delivered one meanwhile.

        The engine publishes ``_finished`` before it looks at ``_future_ready``,
        and this sets ``_future_ready`` before it looks at ``_finished``: so at
        least one side passes the outcome on, and a second delivery is ignored.
        """
        with _making_futures:
            if self._future_ready:
                return
            _Future.__init__(self)
            _Future.set_running_or_notify_cancel(self)  # never cancellable from here on
            self._future_ready = True
        if self._finished:
            self._deliver()

    def _deliver(self) -> None:
        try:
            if self._error is None:
                _Future.set_result(self, self._value)
            else:
                _Future.set_exception(self, self._error)
        except concurrent.futures.InvalidStateError:
            pass  # the other side delivered it first

    # ------------------------------------------------------ engine side
    def set_result(self, result) -> None:
        """Finish the handle with *result* (the first outcome wins)."""
        if self._finished:
            return
        self._value = result
        self._finished = True
        if self._future_ready:
            self._deliver()

    def set_exception(self, exception: BaseException) -> None:
        """Finish the handle with *exception* (the first outcome wins)."""
        if self._finished:
            return
        self._error = exception
        self._finished = True
        if self._future_ready:
            self._deliver()

    # ------------------------------------------------------ caller side
    def done(self) -> bool:
        return self._finished

    def running(self) -> bool:
        return not self._finished

    def cancel(self) -> bool:
        """Always False: the other ranks count on this rank's part in the collective."""
        return False

    def cancelled(self) -> bool:
        return False

    def set_running_or_notify_cancel(self) -> bool:
        return True  # a handle runs from its submission on

    def result(self, timeout=None):
        if not self._finished:
            timeout = self._drive(timeout)
        if self._finished and self._error is None:
            return self._value  # a finished handle never changes: no lock needed
        if self._finished:
            raise self._error
        self._future_part()
        return _Future.result(self, timeout)

    def exception(self, timeout=None):
        if not self._finished:
            timeout = self._drive(timeout)
        if self._finished:
            return self._error
        self._future_part()
        return _Future.exception(self, timeout)

    def wait(self, timeout: float) -> bool:
        """Block up to *timeout* seconds for the outcome, without driving the engine;
        True when the handle is done."""
        if not self._finished:
            concurrent.futures.wait((self,), timeout)
        return self._finished

    def _drive(self, timeout):
        """Let the engine progress in this thread; returns the timeout left for the wait."""
        engine = self.engine
        if engine is None:
            return timeout
        if timeout is None:
            engine.drive(self)
            return None
        deadline = time.monotonic() + timeout
        engine.drive(self, timeout)
        return max(0.0, deadline - time.monotonic())

    # ------------------------------------------------------ conversions
    def add_conversion(self, convert: Callable) -> Handle:
        """Make :func:`synchronize` return ``convert(result)``, applied in the waiting
        thread after the conversions added before (framework adapters use it to
        turn engine arrays back into tensors).  Returns the handle."""
        inner = self._conversion
        self._conversion = convert if inner is None else (lambda value: convert(inner(value)))
        return self

    def converted_result(self):
        """:meth:`result`, passed through the conversions."""
        value = self.result()
        convert = self._conversion
        return value if convert is None else convert(value)

    def __repr__(self) -> str:
        state = "done" if self._finished else "pending"
        return f"<hvdlite.Handle {self.name!r} {state}>"


def poll(handle: Handle) -> bool:
    """True when the collective behind *handle* has finished (successfully or not)."""
    return handle.done()


def synchronize(handle: Handle):
    """Wait for *handle* and return its output; raises HorovodInternalError if it failed."""
    if isinstance(handle, Handle):
        return handle.converted_result()
    if isinstance(handle, _Future):
        return handle.result()
    raise ValueError(
        f"synchronize() takes a handle returned by an *_async op, not {type(handle).__name__}."
    )
