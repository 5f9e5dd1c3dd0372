"""The process sets of ``init(process_sets=[...])``: which sets the job registers, in
which order, and which ProcessSet objects get which id.

Each rank lists its sets.  A set given as ranks must be listed the same on every
rank; a set given as a communicator is this rank's view of it (a communicator split
off COMM_WORLD shows each rank its own part), so there the lists may differ, as long
as every member of a set lists that same set at that place.  The job registers the
union of the lists, in one order that every rank computes from the gathered lists:
place by place, and at each place the sets in the order of the lowest rank listing
them; a set registered already, or one of every rank (the global set), is skipped.
Ids follow that order from 1, so they mean the same ranks everywhere.

An entry of a rank's list that repeats an earlier one (or the global set) is a
duplicate.  As in Horovod, the job starts anyway, with the distinct sets; the
duplicate entry gets no id, and ``init()`` raises ValueError on every rank.  The job
stays initialized: a later ``init(process_sets=[...])`` registers nothing, it only
gives its ProcessSet objects the ids of the registered sets with the same ranks
(:func:`match_registered`, local to each rank).

Cross-rank contract: :func:`resolve` and :func:`match_registered` are local;
:func:`union` and :func:`duplicates` are pure functions of lists every rank holds
alike after the agreement (:mod:`~hvdlite.engine.init_agreement`).
"""

from __future__ import annotations

from ..process_sets import GLOBAL_SET_ID, ProcessSet
from .rank_ranges import describe_ranks

__all__ = [
    "Entry",
    "resolve",
    "inconsistency",
    "union",
    "duplicates",
    "duplicates_message",
    "match_registered",
]

#: One entry of a rank's list: (given as a communicator, its sorted global ranks).
Entry = tuple[bool, list[int]]


def resolve(process_sets, world, MPI) -> list[tuple[ProcessSet, Entry]]:
    """Each ProcessSet of *process_sets* with its entry (local: ValueError for a set
    naming ranks outside *world*, before any rank enters a collective)."""
    if process_sets in (None, "dynamic"):
        return []
    size = world.Get_size()
    resolved = []
    for ps in process_sets:
        if not isinstance(ps, ProcessSet):
            ps = ProcessSet(ps)
        from_comm = ps.mpi_comm is not None and ps._ranks is None
        if from_comm:
            group, world_group = ps.mpi_comm.Get_group(), world.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world_group)
            group.Free()
            world_group.Free()
        else:
            ranks = ps.ranks
        ranks = sorted(int(r) for r in ranks or ())
        bad = [r for r in ranks if not 0 <= r < size]
        if bad or not ranks:
            raise ValueError(
                f"init(process_sets=...): {ps} names ranks {bad or 'none'} "
                f"outside the world of {size} ranks (valid: 0..{size - 1})."
            )
        resolved.append((ps, (from_comm, ranks)))
    return resolved


def inconsistency(per_rank: list[list[Entry]]) -> str | None:
    """None when the lists of every rank (indexed by rank) can be registered
    together, else what differs."""
    lengths = {len(entries) for entries in per_rank}
    if len(lengths) > 1:
        return _differ(per_rank)
    for place in range(lengths.pop() if lengths else 0):
        column = [entries[place] for entries in per_rank]
        if not all(from_comm for from_comm, _ in column):
            if any(entry != column[0] for entry in column):
                return _differ(per_rank)
            continue
        for rank, (_, ranks) in enumerate(column):
            strays = [m for m in ranks if column[m][1] != ranks]
            if rank not in ranks or strays:
                return (
                    f"entry {place} of init(process_sets=...) is a communicator whose "
                    f"members do not agree on it: rank {rank} sees ranks {ranks}, but "
                    + "; ".join(f"rank {m} sees {column[m][1]}" for m in (strays or [rank]))
                    + ". Give each rank the communicator it belongs to, split off the "
                    "same communicator on every rank."
                )
    return None


def _differ(per_rank: list[list[Entry]]) -> str:
    lists: dict[str, list[int]] = {}
    for rank, entries in enumerate(per_rank):
        lists.setdefault(repr([ranks for _, ranks in entries]), []).append(rank)
    parts = "; ".join(f"{describe_ranks(r)}: {v}" for v, r in lists.items())
    return (
        "hvdlite.init(process_sets=...) must list the same sets, in the same order, "
        f"on every rank, but they differ ({parts})."
    )


def union(per_rank: list[list[Entry]], world_size: int) -> list[list[int]]:
    """The distinct sets of every rank's list, in registration order (see above)."""
    seen = {tuple(range(world_size))}
    order: list[list[int]] = []
    for place in range(max((len(entries) for entries in per_rank), default=0)):
        for entries in per_rank:
            ranks = tuple(entries[place][1])
            if ranks not in seen:
                seen.add(ranks)
                order.append(list(ranks))
    return order


def duplicates(entries: list[Entry], world_size: int) -> list[int]:
    """The places in one rank's list whose set names every rank or repeats an
    earlier entry."""
    seen = {tuple(range(world_size))}
    repeated = []
    for place, (_, ranks) in enumerate(entries):
        if tuple(ranks) in seen:
            repeated.append(place)
        seen.add(tuple(ranks))
    return repeated


def duplicates_message(per_rank: list[list[Entry]], world_size: int) -> str | None:
    """The ValueError every rank raises after an ``init()`` whose lists have
    duplicates (None: none have)."""
    found: dict[str, list[int]] = {}
    for rank, entries in enumerate(per_rank):
        places = duplicates(entries, world_size)
        if places:
            said = ", ".join(f"entry {p} (ranks {entries[p][1]})" for p in places)
            found.setdefault(said, []).append(rank)
    if not found:
        return None
    where = "; ".join(f"{describe_ranks(ranks)}: {said}" for said, ranks in found.items())
    return (
        "hvdlite.init(process_sets=...) lists a set twice, or a set of every rank "
        f"(that is hvd.global_process_set) ({where}). hvdlite is initialized with the "
        "distinct sets, and those entries have no process_set_id; call "
        "hvd.init(process_sets=[...]) again with each set once to give your "
        "ProcessSet objects their ids."
    )


def match_registered(process_sets, table, world, MPI) -> None:
    """A later ``init(process_sets=[...])`` while the job runs: give each ProcessSet
    the id of the registered set with its ranks (local; registers nothing).  A set
    that is not registered, or an entry that repeats another, raises ValueError
    after every other entry got its id; a repeated entry is left without one."""
    if process_sets in (None, "dynamic"):
        return
    used = {GLOBAL_SET_ID}
    repeated, unknown = [], []
    for ps, (_, ranks) in resolve(process_sets, world, MPI):
        registered = table.find_ranks(ranks)
        if registered is None:
            unknown.append(f"{ps} (ranks {ranks})")
            continue
        set_id = registered.process_set_id
        ps._ranks = list(ranks)
        ps.process_set_id = None if set_id in used else set_id
        if set_id in used:
            repeated.append(f"ranks {ranks}")
        used.add(set_id)
    if unknown:
        raise ValueError(
            "hvdlite is initialized already, and init(process_sets=...) names sets it "
            f"did not register: {', '.join(unknown)}. A running job adds sets with "
            "hvd.add_process_set() (dynamic mode), or call hvd.shutdown() first."
        )
    if repeated:
        raise ValueError(
            "hvdlite.init(process_sets=...) lists a set twice, or a set of every rank "
            f"(that is hvd.global_process_set): {', '.join(repeated)}; those entries "
            "have no process_set_id."
        )
