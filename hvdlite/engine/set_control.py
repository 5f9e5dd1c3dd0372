"""Dynamic process sets, as the engine runs them: responses that add or remove a set.

``hvd.add_process_set()`` and ``hvd.remove_process_set()`` are control
messages of the global set: every rank submits them, and the coordinator
answers once every rank did, so every rank applies the same change in the same
cycle, and set ids stay the same everywhere.
"""

from __future__ import annotations

from collections.abc import Callable

from ..process_sets import GLOBAL_SET_ID, ProcessSet
from .messages import Response

__all__ = ["SetControl"]


class SetControl:
    """Applies the add/remove responses of a cycle to this rank's set table.

    *pending*: the engine's in-flight entries by key; *fail(entry, message)* and
    *finish(entry, value)* complete an entry's handle."""

    def __init__(
        self, sets, bits, executor, rank: int, pending: dict, fail: Callable, finish: Callable
    ):
        self._sets = sets
        self._bits = bits
        self._executor = executor
        self._rank = rank
        self._pending = pending
        self._fail = fail
        self._finish = finish

    def add(self, response: Response) -> None:
        """Collective: every rank splits the new set's communicator off the world."""
        ranks = list(response.params.extra)
        entry = self._pending.get(response.key)
        existing = self._sets.find_ranks(ranks)
        if existing is not None:
            if entry is not None:
                self._fail(
                    entry,
                    f"a process set with ranks {ranks} already exists "
                    f"(id {existing.process_set_id}).",
                )
            return
        ps = entry.payload if entry is not None else ProcessSet(ranks)
        self._sets.create(ps, ranks)
        if entry is not None:
            self._finish(entry, ps)

    def remove(self, response: Response) -> None:
        """Collective: every rank fails what is pending on the set, then frees it."""
        set_id = response.params.extra[0]
        entry = self._pending.get(response.key)
        if set_id == GLOBAL_SET_ID or self._sets.get(set_id) is None:
            if entry is not None:
                self._fail(
                    entry,
                    f"process set {set_id} cannot be removed "
                    "(it is the global set or not registered).",
                )
            return
        self._bits.erase_set(set_id)
        for key, other in list(self._pending.items()):
            if key[0] == set_id:
                self._fail(other, f"process set {set_id} was removed while {key[1]!r} was pending.")
        if self._rank in self._sets.members.get(set_id, ()):
            self._executor.forget_set(set_id)
        ps = self._sets.remove(set_id)
        if entry is not None:
            self._finish(entry, ps)
