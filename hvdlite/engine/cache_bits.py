"""This rank's side of the response cache: which cached names it is ready to run.

:class:`CacheBits` wraps the :class:`~hvdlite.engine.response_cache.ResponseCache` and
keeps, per cycle, the bit masks this rank puts into the status vector:

- ``hit_mask``: bits of entries submitted here whose parameters match the cache;
- ``foreign_mask``: bits of process sets this rank is not a member of, which
  count as ready so the AND over ranks runs over the members only;
- ``invalid_mask``: bits whose name came back with changed parameters.

Cross-rank contract: :meth:`put`, :meth:`erase` and :meth:`erase_set` are driven
only by globally agreed facts (the response list, the invalid bits of the
status vector), so every rank applies the same sequence and bits mean the same
everywhere.  Pure Python, no MPI.
"""

from __future__ import annotations

from .response_cache import HIT, INVALID, ResponseCache, set_bits

__all__ = ["CacheBits"]


class CacheBits:
    """Bit masks over the response cache, and the entries waiting on their bits."""

    def __init__(self, cache: ResponseCache, rank: int):
        self.cache = cache
        self.rank = rank
        self.hits: dict = {}  # bit -> entry waiting on it
        self.hit_mask = 0
        self.foreign_mask = 0
        self.invalid_mask = 0

    def admit(self, entry) -> bool:
        """Look *entry* up; True when it waits on a cache bit, False when it must go
        to the coordinator (a miss, or changed parameters: then its bit is invalid)."""
        state, bit = self.cache.lookup(entry.params, entry.key)
        if state == HIT:
            entry.bit = bit
            self.hits[bit] = entry
            self.hit_mask |= 1 << bit
            return True
        if state == INVALID:
            self.invalid_mask |= 1 << bit
        return False

    def status_masks(self, joined: bool, full: int) -> tuple[int, int]:
        """(hit_and, hit_or) for the status vector: a joined rank is ready for
        everything but counts as ready for nothing."""
        if joined:
            return full, 0
        return self.hit_mask | self.foreign_mask, self.hit_mask

    def unhit(self, bit: int):
        """Stop waiting on *bit*; returns the entry that waited on it, if any."""
        entry = self.hits.pop(bit, None)
        self.hit_mask &= ~(1 << bit)
        if entry is not None:
            entry.bit = -1
        return entry

    def forget(self, entry) -> None:
        """*entry* failed or finished elsewhere: drop its bit, if it had one."""
        if entry.bit >= 0:
            self.unhit(entry.bit)

    def unhit_all(self) -> list:
        """Stop waiting on every bit (a rank joined); returns the entries that waited."""
        entries = [self.unhit(bit) for bit in set_bits(self.hit_mask)]
        return [e for e in entries if e is not None]

    def invalidate(self, invalid: int) -> list:
        """Erase the agreed *invalid* bits; returns the entries that waited on them."""
        self.invalid_mask = 0
        entries = []
        for bit in set_bits(invalid):
            entry = self.unhit(bit)
            if entry is not None:
                entries.append(entry)
            self.erase(bit)
        return entries

    def take_ready(self, ready: int) -> list[int]:
        """The bits of *ready* (ascending), marked used; their entries stop waiting."""
        bits = set_bits(ready)
        self.cache.touch_all(bits)
        hits = self.hits
        for bit in bits:
            entry = hits.pop(bit, None)
            if entry is not None:
                entry.bit = -1
        self.hit_mask &= ~ready
        return bits

    def put(self, response, members) -> object | None:
        """Remember an agreed *response* of a set with *members*; returns the entry
        that waited on a bit evicted to make room (it must go to the coordinator)."""
        evicted = self.cache.put(response)
        entry = None
        if evicted is not None:
            entry = self.unhit(evicted)
            self.foreign_mask &= ~(1 << evicted)
        bit = self.cache.bit_of(response.key)
        if bit is not None:
            if self.rank in members:
                self.foreign_mask &= ~(1 << bit)
            else:
                self.foreign_mask |= 1 << bit
        return entry

    def erase(self, bit: int) -> None:
        self.cache.erase(bit)
        self.foreign_mask &= ~(1 << bit)

    def erase_set(self, set_id: int) -> None:
        """Forget every bit of a removed process set (its entries fail separately)."""
        for bit in self.cache.erase_set(set_id):
            self.unhit(bit)
            self.foreign_mask &= ~(1 << bit)
