"""The status vector: what every rank tells every other rank once per cycle.

Each cycle every rank contributes one vector to a bitwise-AND allreduce, so
the encoding stores what must be OR-ed across ranks inverted (the AND of
inverted bits is the inverted OR).  Layout, as little-endian 64-bit words:

====================  =================================================
``~flags``            one word: :class:`Flag` bits (OR over ranks)
``hit_and``           cache bits this rank is ready for (AND over ranks)
``~hit_or``           the same bits, to learn whether *any* rank is ready
``~invalid``          cache bits some rank saw with changed parameters
``~ringers``          after a wait only: which ranks rang the doorbell
``root``              with autotune only: rank 0's words (the others send
                      all ones, so the AND is rank 0's value)
====================  =================================================

The three cache-bit fields are ``bit_words`` words each (enough for every bit
the response cache has used); the ringer field is there only when every rank
agreed to include it (they all waited), and the root field only while every
rank runs autotune (``HVDLITE_AUTOTUNE`` must agree, and every rank learns in
the same cycle when it ends), so every rank's vector has the same length.
Pure Python and numpy, no MPI: :func:`combine` is what the allreduce computes,
for tests.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Flag", "Layout", "Status", "Codec", "encode", "decode", "alone", "combine"]

_WORD = 64
_ALL_ONES = (1 << _WORD) - 1


class Flag:
    """Facts that are true when at least one rank says so (plain int bits: the
    cycle tests them several times, and int operations are cheapest)."""

    NEW = 1  # a rank drained new entries this cycle
    UNCACHED = 2  # a rank has requests for the coordinator
    SHUTDOWN = 4  # a rank asked to shut down
    JOINED = 8  # a rank has joined: everything goes through the coordinator
    STALL = 16  # a rank wants a stall check
    INVALID = 32  # a rank saw changed parameters under a cached name
    UNSTAGED = 64  # a rank staged no cached plan's first batch this cycle (see Engine._stage)


class Layout(NamedTuple):
    """How long each field is, in 64-bit words (the same on every rank)."""

    bit_words: int
    ringer_words: int
    root_words: int = 0

    @classmethod
    def of(cls, num_bits: int, world_size: int, after_wait: bool, root_words: int = 0) -> Layout:
        ringers = (world_size + _WORD - 1) // _WORD if after_wait else 0
        return cls((num_bits + _WORD - 1) // _WORD, ringers, root_words)

    @property
    def nbytes(self) -> int:
        return 8 * (1 + 3 * self.bit_words + self.ringer_words + self.root_words)

    @property
    def root_shift(self) -> int:
        return _WORD * (1 + 3 * self.bit_words + self.ringer_words)


class Status(NamedTuple):
    """The combined vector, decoded: what all ranks said together."""

    flags: int
    all_hit: int  # bits every rank is ready for (or does not take part in)
    any_hit: int  # bits at least one rank is ready for
    invalid: int  # bits some rank saw with changed parameters
    ringers: int  # how many ranks rang the doorbell (0 without the ringer field)
    root: int = 0  # rank 0's words, as one int (0 without the root field)


def encode(
    layout: Layout,
    flags: int,
    hit_and: int,
    hit_or: int,
    invalid: int,
    ringer_rank: int | None = None,
    root: int | None = None,
) -> np.ndarray:
    """This rank's vector (a fresh uint64 array to allreduce in place).

    *hit_and* may have bits set beyond this rank's hits (bits of process sets it
    is not in), so that the AND runs over the members only; *ringer_rank* is
    this rank when it rang the doorbell before the cycle; *root* is rank 0's
    value for the root field (None on every other rank).
    """
    width = layout.bit_words * _WORD
    full = (1 << width) - 1
    value = (
        (~flags & _ALL_ONES)
        | (hit_and << _WORD)
        | ((~hit_or & full) << (_WORD + width))
        | ((~invalid & full) << (_WORD + 2 * width))
    )
    if layout.ringer_words:
        ringer_full = (1 << (layout.ringer_words * _WORD)) - 1
        mine = 0 if ringer_rank is None else 1 << ringer_rank
        value |= (~mine & ringer_full) << (_WORD + 3 * width)
    if layout.root_words:
        root_full = (1 << (layout.root_words * _WORD)) - 1
        value |= (root_full if root is None else root & root_full) << layout.root_shift
    return np.frombuffer(bytearray(value.to_bytes(layout.nbytes, "little")), dtype="<u8")


def decode(layout: Layout, vector: np.ndarray) -> Status:
    """The combined vector (after the AND-allreduce), as a :class:`Status`."""
    value = int.from_bytes(vector.data, "little")
    flags = ~value & _ALL_ONES
    width = layout.bit_words * _WORD
    full = (1 << width) - 1
    all_hit = any_hit = invalid = ringers = 0
    if width:
        all_hit = (value >> _WORD) & full
        any_hit = ~(value >> (_WORD + width)) & full
        invalid = ~(value >> (_WORD + 2 * width)) & full
    if layout.ringer_words:
        ringer_full = (1 << (layout.ringer_words * _WORD)) - 1
        ringers = bin(~(value >> (_WORD + 3 * width)) & ringer_full).count("1")
    root = 0
    if layout.root_words:
        root = (value >> layout.root_shift) & ((1 << (layout.root_words * _WORD)) - 1)
    return Status(flags, all_hit, any_hit, invalid, ringers, root)


def alone(
    layout: Layout,
    flags: int,
    hit_and: int,
    hit_or: int,
    invalid: int,
    rang: bool,
    root: int | None = None,
) -> Status:
    """What :func:`decode` makes of the vector of a job of one rank, without one."""
    full = (1 << (layout.bit_words * _WORD)) - 1
    root_value = 0
    if layout.root_words and root is not None:
        root_value = root & ((1 << (layout.root_words * _WORD)) - 1)
    return Status(
        flags, hit_and & full, hit_or, invalid, int(rang) if layout.ringer_words else 0, root_value
    )


class Codec:
    """:func:`encode` and :func:`decode` with their answers remembered.

    A training loop sends the same few vectors and gets back the same few
    combinations every step, and the big-integer arithmetic of encoding and
    decoding costs more than looking the answer up.  Each side remembers at most
    ``limit`` answers, then starts afresh.
    """

    __slots__ = ("limit", "_vectors", "_statuses")

    def __init__(self, limit: int = 256):
        self.limit = limit
        self._vectors: dict[tuple, bytes] = {}
        self._statuses: dict[tuple, Status] = {}

    def encode(
        self,
        layout: Layout,
        flags: int,
        hit_and: int,
        hit_or: int,
        invalid: int,
        ringer_rank: int | None = None,
        root: int | None = None,
    ) -> np.ndarray:
        """As :func:`encode`: a fresh vector, the caller's to allreduce in place."""
        key = (layout, flags, hit_and, hit_or, invalid, ringer_rank, root)
        raw = self._vectors.get(key)
        if raw is None:
            if len(self._vectors) >= self.limit:
                self._vectors.clear()
            raw = self._vectors[key] = encode(
                layout, flags, hit_and, hit_or, invalid, ringer_rank, root
            ).tobytes()
        return np.frombuffer(bytearray(raw), dtype="<u8")

    def decode(self, layout: Layout, vector: np.ndarray) -> Status:
        """As :func:`decode`."""
        key = (layout, vector.tobytes())
        status = self._statuses.get(key)
        if status is None:
            if len(self._statuses) >= self.limit:
                self._statuses.clear()
            status = self._statuses[key] = decode(layout, vector)
        return status


def combine(vectors) -> np.ndarray:
    """What the bitwise-AND allreduce makes of the ranks' *vectors*."""
    return np.bitwise_and.reduce(np.stack(list(vectors)), axis=0)
