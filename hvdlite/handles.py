"""Handles: what every asynchronous collective returns.

A :class:`Handle` is a :class:`concurrent.futures.Future`: ``poll(h)`` is
``h.done()`` and ``synchronize(h)`` is ``h.result()``.  It holds references to
the input and output buffers until the collective completed, so a caller may
drop its own references right after submitting.
"""

from __future__ import annotations

import concurrent.futures
import time

__all__ = ["Handle", "poll", "synchronize"]

_FINISHED = concurrent.futures._base.FINISHED


class Handle(concurrent.futures.Future):
    """The pending result of one collective (or one group of them)."""

    def __init__(self, name: str, keepalive=None, convert=None):
        super().__init__()
        self.name = name
        self._keepalive = keepalive
        # Optional post-processing run in the caller's thread by synchronize().
        self._convert = convert
        self._engine = None  # set at submission; result() helps the engine make progress

    def result(self, timeout=None):
        if self._state == _FINISHED and self._exception is None:
            # A finished future never changes again, so this needs no lock; waiting
            # on a burst of handles, all but the first usually are finished.
            return self._result
        return super().result(self._drive(timeout))

    def exception(self, timeout=None):
        return super().exception(self._drive(timeout))

    def _drive(self, timeout):
        """Let the engine progress in this thread; returns the timeout left for the wait."""
        engine = self._engine
        if engine is None or self.done():
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
