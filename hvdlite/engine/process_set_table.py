"""The registered process sets of this process: ids, members, communicators.

The table belongs to the state ``init()`` builds (``runtime.Runtime.sets``).
Registration is collective: every rank registers the same sets in the same
order, so a set's id means the same ranks everywhere.  The values it hands out
are the public :class:`~hvdlite.process_sets.ProcessSet` objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ..process_sets import GLOBAL_SET_ID, ProcessSet, global_process_set

__all__ = ["ProcessSetTable"]


class ProcessSetTable:
    """The registered sets of this process, by id (identical on every rank).

    ``members[id]`` is the frozenset of the set's global ranks, ``ranks[id]`` the
    same as a sorted list; ``comm_of(id)`` is this rank's communicator of the set
    (None where it is not a member).  A removed set's id is given again, oldest
    first, before new ones (as in Horovod), so ids stay small in a job that adds and
    removes sets; every rank registers and removes in the same order, so they agree.
    """

    def __init__(self, world_size: int, world_rank: int, world_comm):
        self.world_size = world_size
        self.world_rank = world_rank
        self._sets: dict[int, ProcessSet] = {GLOBAL_SET_ID: global_process_set}
        self._comms: dict[int, object] = {GLOBAL_SET_ID: world_comm}
        self.members: dict[int, frozenset] = {GLOBAL_SET_ID: frozenset(range(world_size))}
        self.ranks: dict[int, list[int]] = {GLOBAL_SET_ID: list(range(world_size))}
        self._next_id = 1
        self._freed: deque[int] = deque()  # ids of removed sets, to be given again
        self._registrations = 0  # sets registered so far (the same count on every rank)
        self._registration: dict[int, int] = {GLOBAL_SET_ID: 0}

    def register(self, ps: ProcessSet, ranks: Sequence[int], comm) -> ProcessSet:
        """Give *ps* the next id; *comm*: this rank's communicator of it, or None."""
        ps._ranks = sorted(ranks)
        if self._freed:
            ps.process_set_id = self._freed.popleft()
        else:
            ps.process_set_id = self._next_id
            self._next_id += 1
        self._registrations += 1
        self._registration[ps.process_set_id] = self._registrations
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
        self._freed.append(set_id)
        return ps

    def registration_of(self, set_id: int) -> int:
        """Which registration *set_id* belongs to (its ids are given again after a
        removal): the same number on every rank."""
        return self._registration.get(set_id, 0)

    def get(self, set_id: int) -> ProcessSet | None:
        return self._sets.get(set_id)

    def comm_of(self, set_id: int):
        return self._comms.get(set_id)

    def ranks_of(self, process_set: ProcessSet) -> list[int]:
        """The ranks of a registered *process_set* (ValueError naming the fix if not)."""
        set_id = process_set.process_set_id
        if set_id is None or set_id not in self._sets:
            raise ValueError(
                f"{process_set} is not registered; pass it to "
                "hvd.init(process_sets=[...]) or hvd.add_process_set() first."
            )
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
