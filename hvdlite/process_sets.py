"""Process sets: subsets of ranks that run collectives among themselves.

A :class:`ProcessSet` is a value: the ranks it names and, once registered, its
id.  ``global_process_set`` (id 0) names every rank of the running job.  The
live registry, :class:`ProcessSetTable`, belongs to the state that ``init()``
builds: it maps ids to ranks and to this rank's communicator of each set.
Sets are registered at ``init(process_sets=[...])`` or, in dynamic mode, by
``add_process_set()``; both are collective: every rank registers the same sets
in the same order, so ids agree everywhere.  A rank outside a set may hold the
ProcessSet but cannot submit collectives to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import runtime

__all__ = ["ProcessSet", "global_process_set", "ProcessSetTable", "GLOBAL_SET_ID"]

GLOBAL_SET_ID = 0


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
            st = runtime.current()
            if st is not None and st.sets is not None and st.sets.ranks:
                return st.sets.ranks[GLOBAL_SET_ID]
        return self._ranks

    # -- Horovod's accessors -------------------------------------------------
    def size(self) -> int | None:
        ranks = self.ranks
        return None if ranks is None else len(ranks)

    def rank(self) -> int | None:
        """This process's rank inside the set (None when not included or not registered)."""
        ranks, me = self.ranks, _my_rank()
        if ranks is None or me is None:
            return None
        return ranks.index(me) if me in ranks else None

    def included(self) -> bool | None:
        ranks, me = self.ranks, _my_rank()
        if ranks is None or me is None:
            return None
        return me in ranks

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id
                and self.ranks == other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self._ranks or ())))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _my_rank() -> int | None:
    return runtime.live().world.Get_rank() if runtime.is_running() else None


global_process_set = ProcessSet()
global_process_set.process_set_id = GLOBAL_SET_ID


class ProcessSetTable:
    """The registered sets of this process, by id (identical on every rank).

    ``members[id]`` is the frozenset of the set's global ranks, ``ranks[id]`` the
    same as a sorted list; ``comm_of(id)`` is this rank's communicator of the set
    (None where it is not a member).
    """

    def __init__(self, world_size: int, world_rank: int, world_comm):
        self.world_size = world_size
        self.world_rank = world_rank
        self._sets: dict[int, ProcessSet] = {GLOBAL_SET_ID: global_process_set}
        self._comms: dict[int, object] = {GLOBAL_SET_ID: world_comm}
        self.members: dict[int, frozenset] = {GLOBAL_SET_ID: frozenset(range(world_size))}
        self.ranks: dict[int, list[int]] = {GLOBAL_SET_ID: list(range(world_size))}
        self._next_id = 1

    def register(self, ps: ProcessSet, ranks: Sequence[int], comm) -> ProcessSet:
        """Give *ps* the next id; *comm*: this rank's communicator of it, or None."""
        ps._ranks = sorted(ranks)
        ps.process_set_id = self._next_id
        self._next_id += 1
        self._sets[ps.process_set_id] = ps
        self._comms[ps.process_set_id] = comm
        self.members[ps.process_set_id] = frozenset(ps._ranks)
        self.ranks[ps.process_set_id] = ps._ranks
        return ps

    def create(self, ps: ProcessSet, ranks: Sequence[int]) -> ProcessSet:
        """Collective over the whole job: split a communicator for *ranks* off the
        global set's and register *ps* with it."""
        from mpi4py import MPI

        color = 0 if self.world_rank in ranks else MPI.UNDEFINED
        comm = self._comms[GLOBAL_SET_ID].Split(color, self.world_rank)
        return self.register(ps, ranks, None if comm == MPI.COMM_NULL else comm)

    def remove(self, set_id: int) -> ProcessSet:
        ps = self._sets.pop(set_id)
        del self.members[set_id]
        del self.ranks[set_id]
        comm = self._comms.pop(set_id)
        if comm is not None:
            comm.Free()
        ps.process_set_id = None
        return ps

    def get(self, set_id: int) -> ProcessSet | None:
        return self._sets.get(set_id)

    def comm_of(self, set_id: int):
        return self._comms.get(set_id)

    def ranks_of(self, process_set: ProcessSet) -> list[int]:
        """The ranks of a registered *process_set* (ValueError naming the fix if not)."""
        set_id = process_set.process_set_id
        if set_id is None or set_id not in self._sets:
            raise ValueError(f"{process_set} is not registered; pass it to "
                             "hvd.init(process_sets=[...]) or hvd.add_process_set() first.")
        return self.ranks[set_id]

    def find_ranks(self, ranks: Sequence[int]) -> ProcessSet | None:
        wanted = frozenset(ranks)
        for set_id, members in self.members.items():
            if members == wanted:
                return self._sets[set_id]
        return None

    def all(self) -> list[ProcessSet]:
        return [self._sets[k] for k in sorted(self._sets)]

    def validate_ranks(self, ranks: Sequence[int]) -> list[int]:
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(
                f"ProcessSet ranks {bad} are outside the world of {self.world_size} ranks "
                f"(valid: 0..{self.world_size - 1})."
            )
        if not ranks:
            raise ValueError("A ProcessSet needs at least one rank.")
        return sorted(ranks)

    def free_all(self) -> None:
        """Release every communicator (shutdown); sets other than the global one
        lose their ids."""
        for set_id, comm in self._comms.items():
            if comm is not None:
                try:
                    comm.Free()
                except Exception:  # noqa: BLE001 - best effort at teardown
                    pass
            if set_id != GLOBAL_SET_ID:
                self._sets[set_id].process_set_id = None
        self._comms.clear()
        self._sets.clear()
        self.members.clear()
        self.ranks.clear()
