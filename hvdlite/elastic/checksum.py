"""The commit file's checksum (format 2): two 64-bit sums over the state's 8-byte words.

For the words ``w_0, w_1, ...`` (little-endian, each part of the payload padded
with zero bytes to a multiple of 8, the parts one after the other):
``A = sum(w_i)`` and ``B = sum((2*i + 1) * w_i)``, both modulo 2**64, written
as 32 hex digits.  numpy computes both at memory speed (one ``add.reduce`` and
one ``dot`` per 64 Ki words): 1.4 ms for a 15 MB state on the 2-core machine of
``benchmarks/bench_elastic.py``, where ``zlib.crc32`` takes 3.5-6.5 ms and
``zlib.adler32`` 4.2 ms -- the largest share of a commit.

What it catches: any change confined to one 8-byte word (``A``; ``B`` as well,
its weights being odd), any change of a word's position (``B``), any
truncation (with the length in the header), and random damage but for a chance
of about 2**-128.  What CRC-32 (format 1) also caught and this may miss: some
changes to two or more words that cancel modulo 2**64, such as the top bit
flipped in two words.  A crash cannot tear a commit (the write is atomic, see
:mod:`.persistence`), so what is left to catch is damage at rest or in a copy.
"""

from __future__ import annotations

__all__ = ["state_sum"]

_CHUNK = 1 << 16  # words per dot product: the weights stay in cache
_MASK = (1 << 64) - 1
_weights = None


def _odd_weights():
    global _weights
    if _weights is None:
        import numpy as np

        _weights = np.arange(1, 2 * _CHUNK, 2, dtype=np.uint64)
    return _weights


def state_sum(parts) -> str:
    """The checksum of *parts* (bytes-like objects, in file order) as 32 hex digits."""
    import numpy as np

    weights = _odd_weights()
    total = weighted = 0
    index = 0  # of the next word, over all parts
    for part in parts:
        view = memoryview(part).cast("B")
        whole = view.nbytes - view.nbytes % 8
        words = np.frombuffer(view[:whole], dtype="<u8")
        if whole < view.nbytes:
            tail = np.zeros(1, dtype="<u8")
            tail.view(np.uint8)[: view.nbytes - whole] = view[whole:]
            words = (words, tail)
        else:
            words = (words,)
        for block in words:
            for start in range(0, len(block), _CHUNK):
                chunk = block[start : start + _CHUNK]
                plain = int(np.add.reduce(chunk, dtype=np.uint64))
                # weight of word index+k is (2k + 1) + 2*index
                here = int(np.dot(chunk, weights[: len(chunk)]))
                total = (total + plain) & _MASK
                weighted = (weighted + here + 2 * index * plain) & _MASK
                index += len(chunk)
    return f"{total:016x}{weighted:016x}"
