"""The live state of hvdlite in this process: the bottom of the import graph.

``init()`` builds one :class:`Runtime` (communicators, topology, process sets,
the engine) and installs it here; ``shutdown()`` clears it.  Every other
module reads it through :func:`state` (for collectives: it must be running)
or :func:`live` (for queries: it must have been initialized), so none of them
imports :mod:`hvdlite.basics`, and this module imports nothing of hvdlite but
its exceptions, automatic names and process sets (whose questions about the
running job it answers, :class:`_JobFacts`).
"""

from __future__ import annotations

from .. import process_sets
from .auto_names import AutoNames
from ..exceptions import HorovodInternalError

__all__ = [
    "Runtime",
    "state",
    "live",
    "current",
    "install",
    "clear",
    "forget_after_fork",
    "refuse_in_forked_child",
    "abort_job",
    "routes_of",
]

_NOT_INITIALIZED = "hvdlite has not been initialized; use hvd.init() first."
_FORKED = (
    "hvdlite was initialized in the parent of this process, which was created by fork(); "
    "MPI and the engine thread do not survive a fork, so this process cannot use hvdlite. "
    "Call hvdlite only in the parent (e.g. collect results from worker processes there), "
    "or start workers with multiprocessing's 'spawn' method and init() in each."
)


class Runtime:
    """Everything init() creates; replaced as a whole by the next init()."""

    def __init__(self):
        self.engine = None
        self.config = None
        self.world = None
        self.local_comm = None
        self.cross_comm = None
        self.sets = None  # process_set_table.ProcessSetTable
        self.router = None  # transports.routes.Router
        self.homogeneous = True
        self.node_ranks: frozenset[int] = frozenset()  # ranks sharing this rank's memory
        self.node_of: tuple[int, ...] = ()  # every world rank's node (its lowest rank)
        self.thread_level = 0
        self.timeline = None
        self.dynamic = False
        self.names = AutoNames()  # automatic names, counted per thread
        # Params of named allreduces on the global set, by their arguments (collectives)
        self.allreduce_params: dict = {}


_state: Runtime | None = None
_was_shut_down = False  # shutdown() ran and init() was not called again
_forked = False  # this process was forked from one that had initialized hvdlite


def current() -> Runtime | None:
    """The installed state, running or stopped, or None."""
    return _state


def state() -> Runtime:
    """The running state, for collectives.

    ValueError (Horovod's wording) before ``init()``; HorovodInternalError after
    ``shutdown()`` or once the engine stopped (a failure on some rank).
    """
    st = _state
    if st is None or st.engine is None:
        refuse_in_forked_child()
        if _was_shut_down:
            raise HorovodInternalError(
                "hvdlite has been shut down; call hvd.init() again before the next collective."
            )
        raise ValueError(_NOT_INITIALIZED)
    if st.engine.stopped:
        raise HorovodInternalError(st.engine.stop_message())
    return st


def live() -> Runtime:
    """The state for queries (rank, size, ...): initialized, stopped or not."""
    st = _state
    if st is None or st.engine is None:
        refuse_in_forked_child()
        raise ValueError(_NOT_INITIALIZED)
    return st


def is_running() -> bool:
    st = _state
    return st is not None and st.engine is not None and not st.engine.stopped


def install(new: Runtime) -> None:
    global _state, _was_shut_down
    _state = new
    _was_shut_down = False


def clear() -> None:
    """Forget the state after shutdown(): collectives now say so."""
    global _state, _was_shut_down
    _state = None
    _was_shut_down = True


def forget_after_fork() -> None:
    """In a child created by fork(): drop the parent's state, so nothing here (calls,
    exit hooks) touches the parent's MPI; every call then says why."""
    global _state, _forked
    if _state is not None:
        _state = None
        _forked = True


def refuse_in_forked_child() -> None:
    """RuntimeError naming the fix, in a process forked from an initialized one."""
    if _forked:
        raise RuntimeError(_FORKED)


def abort_job(code: int) -> None:
    """End every rank of the job (MPI_Abort), after flushing this rank's output and
    giving mpiexec a moment to forward it: the reason must reach the user."""
    import sys
    import time

    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.2)
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(code)


def routes_of(process_set):
    """The :class:`~hvdlite.engine.transports.routes.Routes` of a registered
    *process_set* in the running job (the same on every member)."""
    st = live()
    return st.router.routes(st.sets.ranks_of(process_set))


class _JobFacts:
    """What a :class:`~hvdlite.process_sets.ProcessSet` asks of the running job."""

    @staticmethod
    def global_ranks() -> list[int] | None:
        st = _state
        if st is not None and st.sets is not None and st.sets.ranks:
            return st.sets.ranks[process_sets.GLOBAL_SET_ID]
        return None

    @staticmethod
    def my_rank() -> int | None:
        # Like hvd.rank(): still answered once the engine stopped (a peer's shutdown
        # stops it here too), so a set's rank() does not turn None at a job's end.
        st = _state
        return st.world.Get_rank() if st is not None and st.engine is not None else None


process_sets.answer_from(_JobFacts)
