"""What callers hand the engine: entries, and the queue they wait in.

An :class:`Entry` is one submitted collective (a single tensor or a group);
the :class:`Inbox` takes entries from any thread and gives them to the engine
thread in submission order.  It also keeps the names in flight on this rank,
so a second collective under a name that has not completed is refused at
submission.  Pure Python, no MPI.
"""

from __future__ import annotations

import collections
import threading
import time

from ..exceptions import HorovodInternalError
from .messages import Params

__all__ = ["Entry", "Inbox"]


class Entry:
    """One submitted collective, owned by the engine thread once queued."""

    __slots__ = (
        "params",
        "key",
        "inputs",
        "outputs",
        "handle",
        "submitted",
        "grouped",
        "splits",
        "payload",
        "bit",
        "sent",
        "ready",
        "thread",
    )

    def __init__(
        self, params: Params, inputs, outputs, handle, grouped=False, splits=None, payload=None
    ):
        self.params = params
        self.key = (params.set_id, params.name)  # params.key, computed once
        self.inputs = inputs
        self.outputs = outputs
        self.handle = handle
        self.submitted = time.monotonic()
        self.grouped = grouped
        self.splits = splits
        self.payload = payload
        self.bit = -1  # the response-cache bit it waits on, or -1
        self.sent = False  # its request went to the coordinator
        self.ready = None  # device path: where the producers' streams stood at submission
        self.thread = threading.get_ident()  # the submitting thread (stall reports)

    def result(self, value):
        """What the handle returns: *value*, or (None) the outputs; a single tensor's
        entry returns its one output, not a sequence."""
        if value is None:
            value = self.outputs
            if not self.grouped:
                return value[0] if value else None
        elif isinstance(value, list) and not self.grouped:
            return value[0] if value else None
        return value


class Inbox:
    """Entries submitted and not yet taken by the engine, plus every name in flight."""

    def __init__(self):
        self._queue: collections.deque = collections.deque()
        self._inflight: set = set()
        self._lock = threading.Lock()
        self._closed_reason: str | None = None

    def put(self, entry: Entry) -> None:
        """Queue *entry*; ValueError if its name is already in flight on this rank,
        HorovodInternalError once the inbox is closed."""
        key = entry.key
        with self._lock:
            if self._closed_reason is not None:
                raise HorovodInternalError(self._closed_reason)
            if key in self._inflight:
                raise ValueError(
                    f"A collective named {key[1]!r} is already in flight on this rank; "
                    "names must be unique until their handle completes (wait for it with "
                    "synchronize(), or pass a different name=)."
                )
            self._inflight.add(key)
            self._queue.append(entry)

    def __bool__(self) -> bool:
        return bool(self._queue)

    def oldest(self) -> float | None:
        """When the oldest queued entry was submitted (None: nothing queued)."""
        try:
            return self._queue[0].submitted
        except IndexError:
            return None

    def take_all(self) -> list[Entry]:
        """Every queued entry, oldest first (engine thread)."""
        queue = self._queue
        taken = []
        while queue:
            taken.append(queue.popleft())
        return taken

    def release(self, keys) -> None:
        """The collectives of *keys* completed: their names may be used again."""
        with self._lock:
            discard = self._inflight.discard
            for key in keys:
                discard(key)

    @property
    def closed(self) -> bool:
        return self._closed_reason is not None

    def close(self, reason: str) -> list[Entry]:
        """Refuse further submissions (with *reason*); returns what was still queued."""
        with self._lock:
            self._closed_reason = reason
            return self.take_all()
