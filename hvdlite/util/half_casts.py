"""16-bit float <-> float32 array conversions; a framework may replace float16's.

The engine widens float16 and bfloat16 values to float32 to reduce them and
narrows each sum back once: on the 16-bit wire across nodes
(:mod:`hvdlite.engine.transports.half_wire`), and where a float16 tensor is
copied into or out of a float32 buffer on one node.  numpy's own float16 casts
convert values that are subnormal in float16 (below 6.1e-5, most gradients of a
large model) in software: widening a million of them takes about 10 ms and
narrowing 70 ms on one core, against 1-2.5 ms for normal values.  The casts here
do not depend on the values: widening looks each value's bits up in a table of
all 65,536 float16 values (numpy's own conversions, so the same bits), and
narrowing rounds float32 to float16 with integer and float32 arithmetic, both a
cache-sized chunk at a time.  A framework with hardware casts replaces the
float16 pair at import (:func:`register`; the torch adapter does).  bfloat16
has float32's exponent, and ml_dtypes' casts (numpy casts) are fast: they are
used as they are.  Every implementation rounds to nearest even, as numpy does,
so the results are the same bits whichever runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from .dtypes import BFLOAT16

__all__ = ["copy", "narrow", "narrow_with_numpy", "register", "widen", "widen_with_numpy"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)

#: Values per step of the numpy casts: their temporaries stay in the cache.
CHUNK = 1 << 15

#: Every float16 value's float32 value, indexed by its bits.
_WIDE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


class _Scratch(threading.local):
    """Chunk-sized work arrays, one set per thread, made once: fresh arrays of
    this size sit at malloc's mmap threshold, and each would be mapped and
    faulted in anew."""

    def __init__(self):
        self.index = np.empty(CHUNK, np.intp)
        self.words = [np.empty(CHUNK, np.uint32) for _ in range(3)]
        self.mask = np.empty(CHUNK, np.bool_)
        self.wide = np.empty(CHUNK, np.float32)


_SCRATCH = _Scratch()


def widen_with_numpy(src: np.ndarray, out: np.ndarray) -> None:
    """float16 *src* into float32 *out* by table (1-D, the same length)."""
    bits, index = src.view(np.uint16), _SCRATCH.index
    for lo in range(0, bits.size, CHUNK):
        part = bits[lo : lo + CHUNK]
        at = index[: part.size]
        np.copyto(at, part)  # np.take would make this intp copy itself, afresh
        np.take(_WIDE, at, out=out[lo : lo + CHUNK])


def narrow_with_numpy(src: np.ndarray, out: np.ndarray) -> None:
    """float32 *src* into float16 *out*, numpy's bits (1-D, the same length)."""
    scratch = _SCRATCH
    for lo in range(0, src.size, CHUNK):
        bits = src[lo : lo + CHUNK].view(np.uint32)
        n = bits.size
        words = [w[:n] for w in scratch.words]
        _narrow_chunk(bits, out[lo : lo + CHUNK].view(np.uint16), *words, scratch.mask[:n])


def _narrow_chunk(bits, out, magnitude, half, other, mask) -> None:
    """float32 *bits* rounded to nearest even into float16 bits *out*, as numpy
    rounds them (NaN payloads included); the rest are scratch of their size."""
    np.bitwise_and(bits, 0x7FFFFFFF, out=magnitude)
    # Normal in float16: rebias the exponent (-112 << 23, wrapping) and round at
    # bit 13; a carry out of the mantissa bumps the exponent, up to infinity.
    np.right_shift(magnitude, 13, out=half)
    np.bitwise_and(half, 1, out=half)  # ties go to the even neighbour
    np.add(half, magnitude, out=half)
    np.add(half, 0xC8000FFF, out=half)
    np.right_shift(half, 13, out=half)
    np.less(magnitude, 0x38800000, out=mask)  # under 2**-14: subnormal (or zero) in float16
    tiny = np.count_nonzero(mask)
    # Adding 0.5 in float32 rounds at 2**-24, float16's subnormal step, to nearest
    # even; the sum's low mantissa bits are the float16 bits.
    if tiny and tiny * 8 < mask.size:  # a few: only those
        at = np.flatnonzero(mask)
        shifted = magnitude[at].view(np.float32) + np.float32(0.5)
        half[at] = shifted.view(np.uint32) - np.uint32(0x3F000000)
    elif tiny:
        # Clamped first, so that no NaN meets the add (np.errstate, which would
        # silence its warning, makes numpy's loops slower); then
        # half += (sub - half) * mask, as a masked copy mispredicts where tiny
        # values are mixed with others, as in gradients, and takes ten times as long.
        np.minimum(magnitude, 0x38800000, out=other)
        shifted = other.view(np.float32)
        np.add(shifted, np.float32(0.5), out=shifted)
        np.subtract(other, 0x3F000000, out=other)
        np.subtract(other, half, out=other)
        np.multiply(other, mask, out=other)
        np.add(half, other, out=half)
    np.greater_equal(magnitude, 0x47800000, out=mask)  # 2**16 and over: infinity, or NaN
    if mask.any():
        np.copyto(half, 0x7C00, where=mask)
        np.greater(magnitude, 0x7F800000, out=mask)
        if mask.any():  # numpy keeps a NaN's top mantissa bits, and at least one
            np.bitwise_and(magnitude, 0x007FFFFF, out=other)
            np.right_shift(other, 13, out=other)
            np.maximum(other, 1, out=other)
            np.add(other, 0x7C00, out=other)
            np.copyto(half, other, where=mask)
    np.right_shift(bits, 16, out=other)
    np.bitwise_and(other, 0x8000, out=other)  # the sign
    np.bitwise_or(half, other, out=half)
    np.copyto(out, half, casting="unsafe")


_widen: Callable[[np.ndarray, np.ndarray], None] = widen_with_numpy
_narrow: Callable[[np.ndarray, np.ndarray], None] = narrow_with_numpy


def register(widen_to_float32: Callable, narrow_to_float16: Callable) -> tuple:
    """Use these ``(src, out)`` functions from now on: float16 *src* into float32
    *out*, and float32 *src* into float16 *out* (both 1-D, contiguous, the same
    length; *src* writable).  Returns the pair they replace."""
    global _widen, _narrow
    replaced = _widen, _narrow
    _widen, _narrow = widen_to_float32, narrow_to_float16
    return replaced


def widen(src: np.ndarray, out: np.ndarray) -> None:
    """float16 or bfloat16 *src* into float32 *out* (exact; 1-D, contiguous)."""
    if src.dtype != _FLOAT16 or out.dtype != _FLOAT32:
        np.copyto(out, src, casting="unsafe")
    elif src.flags.writeable:
        _widen(src, out)
    else:
        widen_with_numpy(src, out)


def narrow(src: np.ndarray, out: np.ndarray) -> None:
    """float32 *src* into float16 or bfloat16 *out*, rounded to nearest even
    (1-D, contiguous)."""
    if out.dtype != _FLOAT16 or src.dtype != _FLOAT32:
        np.copyto(out, src, casting="unsafe")
    elif src.flags.writeable:
        _narrow(src, out)
    else:
        narrow_with_numpy(src, out)


def copy(dst: np.ndarray, src: np.ndarray, factor: float = 1.0) -> None:
    """``dst[...] = src * factor`` cast to *dst*'s dtype, float16 <-> float32
    through the casts above.  A float *src* narrower than a float *dst* (float16
    or bfloat16 into float32, the engine's wire) is widened first and scaled in
    *dst*'s dtype: its products are exact there, and the sum they join is
    rounded once (numpy's ``np.multiply`` would round each product to *src*'s
    dtype first).  Otherwise as ``np.multiply(src, factor, out=dst,
    casting="unsafe")``: a float32 *src* is scaled in float32, then narrowed.
    Arrays of the same size."""
    widening = _is_float(src.dtype) and dst.dtype.kind == "f" and src.itemsize < dst.itemsize
    if widening and factor != 1.0:
        copy(dst, src)
        np.multiply(dst, dst.dtype.type(factor), out=dst)
        return
    pair = (src.dtype, dst.dtype)
    if src.size == dst.size and src.flags.c_contiguous and dst.flags.c_contiguous:
        if pair == (_FLOAT16, _FLOAT32):
            widen(src.reshape(-1), dst.reshape(-1))
            return
        if pair == (_FLOAT32, _FLOAT16) and factor == 1.0:
            narrow(src.reshape(-1), dst.reshape(-1))
            return
        if pair == (_FLOAT32, _FLOAT16) and type(factor) is float:
            _scaled_narrow(src.reshape(-1), factor, dst.reshape(-1))
            return
    if factor != 1.0:
        np.multiply(src, factor, out=dst, casting="unsafe")
    else:
        np.copyto(dst, src, casting="unsafe")


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype == BFLOAT16  # ml_dtypes' kind is "V"


def _scaled_narrow(src: np.ndarray, factor: float, out: np.ndarray) -> None:
    """float32 *src* times *factor* (in float32, as numpy multiplies by a Python
    float), narrowed into float16 *out*."""
    wide = _SCRATCH.wide
    for lo in range(0, src.size, CHUNK):
        part = src[lo : lo + CHUNK]
        np.multiply(part, factor, out=wide[: part.size])
        narrow(wide[: part.size], out[lo : lo + CHUNK])
