"""One point of autotune's search: the engine parameters it tunes, and their wire form.

A :class:`Setting` is what every rank runs with while autotune is on.  Rank 0
decides it; the other ranks learn it from three 64-bit words that rank 0 puts
into the engine's status vector (:mod:`hvdlite.engine.status`, the ``root`` field),
so every rank receives the same setting in the same cycle.  :func:`to_words`
and :func:`from_words` are that wire form: exact for every value (the cycle
time travels as the bits of a float64), with one more bit saying that tuning
has ended and this is the setting to keep.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

__all__ = ["Setting", "WORDS", "to_words", "from_words"]

#: How many 64-bit words a setting takes in the status vector.
WORDS = 3
_WORD = 64
_MASK = (1 << _WORD) - 1
_SHARED_MEMORY, _HIERARCHICAL, _FINAL = 1, 2, 4


class Setting(NamedTuple):
    """The engine parameters autotune chooses (the same on every rank)."""

    fusion_threshold: int  # bytes
    cycle_time_ms: float
    shared_memory_allreduce: bool  # sets of 2-4 ranks on one node reduce through /dev/shm
    hierarchical_allreduce: bool  # the whole job reduces inside nodes, then across

    def describe(self) -> str:
        mib = self.fusion_threshold / (1 << 20)
        text = f"fusion threshold {mib:g} MiB, cycle time {self.cycle_time_ms:g} ms"
        text += ", shared-memory allreduce " + ("on" if self.shared_memory_allreduce else "off")
        return text + ", hierarchical allreduce " + ("on" if self.hierarchical_allreduce else "off")


def to_words(setting: Setting, final: bool) -> int:
    """*setting* as :data:`WORDS` little-endian words in one int (*final*: tuning ended)."""
    cycle_bits = struct.unpack("<Q", struct.pack("<d", float(setting.cycle_time_ms)))[0]
    switches = (
        (_SHARED_MEMORY if setting.shared_memory_allreduce else 0)
        | (_HIERARCHICAL if setting.hierarchical_allreduce else 0)
        | (_FINAL if final else 0)
    )
    return (
        (int(setting.fusion_threshold) & _MASK) | (cycle_bits << _WORD) | (switches << (2 * _WORD))
    )


def from_words(value: int) -> tuple[Setting, bool]:
    """The (setting, final) that :func:`to_words` made *value* from."""
    cycle = struct.unpack("<d", struct.pack("<Q", (value >> _WORD) & _MASK))[0]
    switches = (value >> (2 * _WORD)) & _MASK
    setting = Setting(
        value & _MASK, cycle, bool(switches & _SHARED_MEMORY), bool(switches & _HIERARCHICAL)
    )
    return setting, bool(switches & _FINAL)
