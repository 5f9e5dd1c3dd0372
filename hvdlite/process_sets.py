"""Process sets: subsets of ranks that run collectives among themselves.

``global_process_set`` (id 0) holds every rank.  Other sets are registered at
``init(process_sets=[...])`` or, in dynamic mode, by ``add_process_set()``;
both are collective: every rank registers the same sets in the same order, so
ids agree everywhere.  A rank outside a set may hold the ProcessSet object but
cannot submit collectives to it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ProcessSet", "global_process_set", "ProcessSetTable"]


class ProcessSet:
    """A set of global ranks; usable as ``process_set=`` once registered."""

    def __init__(self, ranks_or_comm=None):
        self.process_set_id: int | None = None
        self.comm = None  # data communicator of this set (None where this rank is not a member)
        self._mpi_comm = None
        if ranks_or_comm is None:
            self.ranks: list[int] | None = None
        elif hasattr(ranks_or_comm, "Get_group"):
            self._mpi_comm = ranks_or_comm
            self.ranks = None  # resolved against the world at registration
        else:
            ranks = [int(r) for r in ranks_or_comm]
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"ProcessSet ranks must be distinct, got {ranks}.")
            self.ranks = sorted(ranks)

    # -- Horovod's accessors -------------------------------------------------
    def size(self) -> int | None:
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank inside the set (None when not included or not registered)."""
        from . import basics

        if self.ranks is None or not basics.is_initialized():
            return None
        me = basics.rank()
        return self.ranks.index(me) if me in self.ranks else None

    def included(self) -> bool | None:
        from . import basics

        if self.ranks is None or not basics.is_initialized():
            return None
        return basics.rank() in self.ranks

    def __eq__(self, other) -> bool:
        return (isinstance(other, ProcessSet) and self.process_set_id == other.process_set_id
                and self.ranks == other.ranks)

    def __hash__(self) -> int:
        return hash((self.process_set_id, tuple(self.ranks or ())))

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet()
global_process_set.process_set_id = 0


class ProcessSetTable:
    """The registered sets of this process, indexed by id (identical on every rank)."""

    def __init__(self, world_size: int, world_rank: int):
        self.world_size = world_size
        self.world_rank = world_rank
        self._sets: dict[int, ProcessSet] = {}
        self._next_id = 1
        self.members: dict[int, frozenset] = {}

    def register_global(self, comm) -> None:
        global_process_set.ranks = list(range(self.world_size))
        global_process_set.comm = comm
        self._sets[0] = global_process_set
        self.members[0] = frozenset(global_process_set.ranks)

    def register(self, ps: ProcessSet, ranks: Sequence[int], comm) -> ProcessSet:
        ps.ranks = sorted(ranks)
        ps.process_set_id = self._next_id
        ps.comm = comm
        self._next_id += 1
        self._sets[ps.process_set_id] = ps
        self.members[ps.process_set_id] = frozenset(ps.ranks)
        return ps

    def remove(self, set_id: int) -> ProcessSet:
        ps = self._sets.pop(set_id)
        del self.members[set_id]
        if ps.comm is not None:
            ps.comm.Free()
        ps.comm = None
        ps.process_set_id = None
        return ps

    def get(self, set_id: int) -> ProcessSet | None:
        return self._sets.get(set_id)

    def find_ranks(self, ranks: Sequence[int]) -> ProcessSet | None:
        wanted = sorted(ranks)
        for ps in self._sets.values():
            if ps.ranks == wanted:
                return ps
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
        for set_id in list(self._sets):
            ps = self._sets.pop(set_id)
            if ps.comm is not None:
                try:
                    ps.comm.Free()
                except Exception:  # noqa: BLE001 - best effort at teardown
                    pass
            ps.comm = None
            if set_id != 0:
                ps.process_set_id = None
        self.members.clear()
