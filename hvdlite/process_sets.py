"""Process sets: subsets of ranks that run collectives among themselves.

A :class:`ProcessSet` is a value: the ranks it names and, once registered, its
id.  ``global_process_set`` (id ``GLOBAL_SET_ID``, 0) names every rank of the
running job.  The live registry of sets, the engine's
:class:`~hvdlite.engine.process_set_table.ProcessSetTable`, belongs to the state
that ``init()`` builds: it maps ids to ranks and to this rank's communicator of
each set.
Sets are registered at ``init(process_sets=[...])`` or, in dynamic mode, by
``add_process_set()``; both are collective: every rank registers the same sets
in the same order, so ids agree everywhere.  A rank outside a set may hold the
ProcessSet but cannot submit collectives to it.
"""

from __future__ import annotations

__all__ = ["ProcessSet", "global_process_set", "GLOBAL_SET_ID", "answer_from"]

GLOBAL_SET_ID = 0


class _NoJob:
    """The running job's answers while none was ever started in this process."""

    @staticmethod
    def global_ranks() -> list[int] | None:
        return None

    @staticmethod
    def my_rank() -> int | None:
        return None


#: Who answers a ProcessSet's questions about the running job (every rank, this
#: rank).  This module sits below the engine and imports nothing of it: the
#: engine's :mod:`~hvdlite.engine.runtime` puts its own answers here when loaded.
_job = _NoJob


def answer_from(job) -> None:
    """Take the job's facts from *job*: ``global_ranks()`` (the ranks of the global
    set, None before ``init()``) and ``my_rank()`` (None before ``init()`` and after this rank's
    ``shutdown()``; still answered once the engine stopped)."""
    global _job
    _job = job


class ProcessSet:
    """A set of global ranks; usable as ``process_set=`` once registered."""

    def __init__(self, ranks_or_comm=None):
        self.process_set_id: int | None = None
        self._ranks: list[int] | None = None
        self.mpi_comm = None  # a communicator the set was given as, resolved at registration
        if ranks_or_comm is None:
            return
        if hasattr(ranks_or_comm, "Get_group"):
            self.mpi_comm = ranks_or_comm
            return
        ranks = [int(r) for r in ranks_or_comm]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}.")
        self._ranks = sorted(ranks)

    @property
    def ranks(self) -> list[int] | None:
        """The global ranks (None while unknown: a set given as a communicator before
        registration, or the global set before ``init()``)."""
        if self._ranks is None and self.process_set_id == GLOBAL_SET_ID:
            ranks = _job.global_ranks()
            if ranks is not None:
                return ranks
        return self._ranks

    # -- Horovod's accessors -------------------------------------------------
    def size(self) -> int | None:
        ranks = self.ranks
        return None if ranks is None else len(ranks)

    def rank(self) -> int | None:
        """This process's rank inside the set (None when not included or not registered)."""
        ranks, me = self.ranks, _job.my_rank()
        if ranks is None or me is None:
            return None
        return ranks.index(me) if me in ranks else None

    def included(self) -> bool | None:
        ranks, me = self.ranks, _job.my_rank()
        if ranks is None or me is None:
            return None
        return me in ranks

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, ProcessSet)
            and self.process_set_id == other.process_set_id
            and self.ranks == other.ranks
        )

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self._ranks or ())))

    def __repr__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
            f"mpi_comm={self.mpi_comm})"
        )


global_process_set = ProcessSet()
global_process_set.process_set_id = GLOBAL_SET_ID
