"""The response cache: steady-state negotiation without the coordinator.

After a name has run once, every rank remembers its response under a bit
position.  Next time a rank submits the same name with the same parameters it
only sets that bit; one bitwise-AND allreduce per cycle tells every rank which
bits all ranks have set, and those responses run without a gather.

Cross-rank contract: every rank applies the same sequence of ``put``/``touch``/
``erase`` calls (they are driven only by the globally agreed response list and
invalidation bits), so bit positions agree on every rank without ever being
exchanged.  Eviction is least-recently-used over that same sequence.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .messages import Params, Response

__all__ = ["ResponseCache", "HIT", "MISS", "INVALID", "set_bits"]

HIT, MISS, INVALID = 0, 1, 2


#: At most this many set bits: jump from one to the next (cost per set bit).
_FEW_BITS = 8
#: Wider masks with more bits set: let numpy unpack them (cost per byte, in C).
_WIDE_MASK = 512


def set_bits(mask: int) -> list[int]:
    """The positions of the set bits of *mask*, ascending.

    A cycle may ready one bit high up in a cache of a thousand names (a
    synchronous call in a model's training loop) or hundreds at once (a step's
    gradients), so the cost must follow the bits set, not the highest one: few
    bits are found one by one, a wide mask is unpacked by numpy, and a narrow
    dense one in one pass over its binary digits.
    """
    if mask.bit_count() <= _FEW_BITS:
        bits = []
        while mask:
            low = mask & -mask
            bits.append(low.bit_length() - 1)
            mask ^= low
        return bits
    if mask.bit_length() > _WIDE_MASK:
        raw = np.frombuffer(mask.to_bytes((mask.bit_length() + 7) // 8, "little"), np.uint8)
        return np.flatnonzero(np.unpackbits(raw, bitorder="little")).tolist()
    return [i for i, digit in enumerate(reversed(bin(mask))) if digit == "1"]


class ResponseCache:
    """Maps (process set id, name) to a bit and the response that ran under it."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._bit_of: dict[tuple, int] = {}
        self._responses: list[Response | None] = []
        self._free: list[int] = []
        self._lru: OrderedDict[int, None] = OrderedDict()
        #: Changes whenever a bit that stood for a response comes to stand for another
        #: one (or none), so a caller may keep what it derived from a set of bits while
        #: this stays equal.  A name put under a bit never used before changes nothing.
        self.version = 0

    @property
    def num_bits(self) -> int:
        """Bits in use or ever used: the length of the per-cycle bit vectors."""
        return len(self._responses)

    def __len__(self) -> int:
        return len(self._bit_of)

    def lookup(self, params: Params, key: tuple | None = None) -> tuple[int, int]:
        """(HIT|MISS|INVALID, bit) for a local request (*key*: its ``params.key``)."""
        bit = self._bit_of.get(params.key if key is None else key)
        if bit is None:
            return MISS, -1
        if self._responses[bit].params == params:
            return HIT, bit
        return INVALID, bit

    def get(self, bit: int) -> Response:
        return self._responses[bit]

    def put(self, response: Response) -> int | None:
        """Remember *response*; returns the bit evicted to make room, if any."""
        if self.capacity <= 0:
            return None
        key = response.key
        if key in self._bit_of:
            self.version += 1
            bit = self._bit_of[key]
            self._responses[bit] = response
            self._lru.move_to_end(bit)
            return None
        evicted = None
        if len(self._bit_of) >= self.capacity:
            evicted, _ = self._lru.popitem(last=False)
            self._drop(evicted)
        if self._free:
            bit = self._free.pop()  # its drop changed the version
        else:
            bit = len(self._responses)
            self._responses.append(None)
        self._responses[bit] = response
        self._bit_of[key] = bit
        self._lru[bit] = None
        return evicted

    def bit_of(self, key: tuple) -> int | None:
        return self._bit_of.get(key)

    def touch(self, bit: int) -> None:
        self._lru.move_to_end(bit)

    def touch_all(self, bits) -> None:
        """Mark *bits* used, in order."""
        move = self._lru.move_to_end
        for bit in bits:
            move(bit)

    def erase(self, bit: int) -> None:
        if self._responses[bit] is not None:
            self._lru.pop(bit, None)
            self._drop(bit)

    def erase_set(self, set_id: int) -> list[int]:
        """Forget every response of a removed process set; returns the bits freed."""
        bits = [b for (sid, _), b in self._bit_of.items() if sid == set_id]
        for bit in bits:
            self.erase(bit)
        return bits

    def _drop(self, bit: int) -> None:
        self.version += 1
        response = self._responses[bit]
        del self._bit_of[response.key]
        self._responses[bit] = None
        # Reuse the lowest free bits first so vectors stay short; order is deterministic.
        self._free.append(bit)
        self._free.sort(reverse=True)
