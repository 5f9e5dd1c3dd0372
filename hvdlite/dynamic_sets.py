"""Adding and removing process sets while the job runs (dynamic mode).

Cross-rank contract: both calls are collective over the whole job: every rank
calls them in the same order with the same ranks, and each is negotiated like
a collective, so ids agree on every rank.
"""

from __future__ import annotations

from .collectives import submit_control
from .engine.messages import Kind
from .process_sets import ProcessSet, global_process_set
from .engine.runtime import state

__all__ = ["add_process_set", "remove_process_set"]


def add_process_set(process_set) -> ProcessSet:
    """Register a new process set on every rank (collective: all ranks call it, same ranks)."""
    st = state()
    if not st.dynamic:
        raise ValueError(
            "add_process_set() needs dynamic process sets: call hvd.init(process_sets="
            "'dynamic') or set HVDLITE_DYNAMIC_PROCESS_SETS=1."
        )
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered.")
    ranks = st.sets.validate_ranks(ps.ranks or [])
    existing = st.sets.find_ranks(ranks)
    if existing is not None:
        raise ValueError(
            f"A process set with ranks {ranks} is already registered "
            f"(id {existing.process_set_id}); reuse it instead of adding it again."
        )
    n = st.names.suffix("add_process_set")
    return submit_control(
        Kind.ADD_PROCESS_SET, f"__add_process_set__.{n}", tuple(ranks), payload=ps
    ).result()


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister *process_set* on every rank (collective). Returns True when removed,
    False (on every rank, without a collective) for the global set or a set without
    an id, as Horovod does."""
    st = state()
    if not st.dynamic:
        raise ValueError(
            "remove_process_set() needs dynamic process sets: call hvd.init(process_sets="
            "'dynamic') or set HVDLITE_DYNAMIC_PROCESS_SETS=1."
        )
    if process_set is global_process_set or process_set.process_set_id in (None, 0):
        return False  # the global set is never removed; a set without an id is not there
    n = st.names.suffix("remove_process_set")
    submit_control(
        Kind.REMOVE_PROCESS_SET, f"__remove_process_set__.{n}", (process_set.process_set_id,)
    ).result()
    return True
