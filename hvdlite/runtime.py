"""The live state of hvdlite in this process: the bottom of the import graph.

``init()`` builds one :class:`State` (communicators, topology, process sets,
the engine) and installs it here; ``shutdown()`` clears it.  Every other
module reads it through :func:`state` (for collectives: it must be running)
or :func:`live` (for queries: it must have been initialized), so none of them
imports :mod:`hvdlite.basics`, and this module imports nothing of hvdlite but
its exceptions.
"""

from __future__ import annotations

from .exceptions import HorovodInternalError

__all__ = ["State", "state", "live", "current", "install", "clear"]

_NOT_INITIALIZED = "hvdlite has not been initialized; use hvd.init() first."


class State:
    """Everything init() creates; replaced as a whole by the next init()."""

    def __init__(self):
        self.engine = None
        self.config = None
        self.world = None
        self.local_comm = None
        self.cross_comm = None
        self.sets = None  # process_sets.ProcessSetTable
        self.planner = None  # transport.Planner
        self.homogeneous = True
        self.node_ranks: frozenset[int] = frozenset()  # ranks sharing this rank's memory
        self.thread_level = 0
        self.timeline = None
        self.dynamic = False
        self.counters: dict = {}


_state: State | None = None
_was_shut_down = False  # shutdown() ran and init() was not called again


def current() -> State | None:
    """The installed state, running or stopped, or None."""
    return _state


def state() -> State:
    """The running state, for collectives.

    ValueError (Horovod's wording) before ``init()``; HorovodInternalError after
    ``shutdown()`` or once the engine stopped (a failure on some rank).
    """
    st = _state
    if st is None or st.engine is None:
        if _was_shut_down:
            raise HorovodInternalError(
                "hvdlite has been shut down; call hvd.init() again before the next collective."
            )
        raise ValueError(_NOT_INITIALIZED)
    if st.engine.stopped:
        raise HorovodInternalError(st.engine.stop_message())
    return st


def live() -> State:
    """The state for queries (rank, size, ...): initialized, stopped or not."""
    st = _state
    if st is None or st.engine is None:
        raise ValueError(_NOT_INITIALIZED)
    return st


def is_running() -> bool:
    st = _state
    return st is not None and st.engine is not None and not st.engine.stopped


def install(new: State) -> None:
    global _state, _was_shut_down
    _state = new
    _was_shut_down = False


def clear() -> None:
    """Forget the state after shutdown(): collectives now say so."""
    global _state, _was_shut_down
    _state = None
    _was_shut_down = True
