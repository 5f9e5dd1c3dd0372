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

from collections.abc import Callable

import numpy as np

__all__ = ["copy", "narrow", "narrow_with_numpy", "register", "widen", "widen_with_numpy"]

_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)

#: Values per step of the numpy casts: their temporaries stay in the cache.
CHUNK = 1 << 15

#: Every float16 value's float32 value, indexed by its bits.
_WIDE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def widen_with_numpy(src: np.ndarray, out: np.ndarray) -> None:
    """float16 *src* into float32 *out* by table (1-D, the same length)."""
    bits = src.view(np.uint16)
    for lo in range(0, bits.size, CHUNK):
        np.take(_WIDE, bits[lo : lo + CHUNK], out=out[lo : lo + CHUNK])


def narrow_with_numpy(src: np.ndarray, out: np.ndarray) -> None:
    """float32 *src* into float16 *out*, numpy's bits (1-D, contiguous, the same length)."""
    with np.errstate(all="ignore"):  # NaN bits meet float32 adds that are discarded
        for lo in range(0, src.size, CHUNK):
            _narrow_chunk(
                src[lo : lo + CHUNK].view(np.uint32), out[lo : lo + CHUNK].view(np.uint16)
            )


def _narrow_chunk(bits: np.ndarray, out: np.ndarray) -> None:
    """float32 *bits* rounded to nearest even into float16 bits *out*, as numpy
    rounds them (NaN payloads included)."""
    magnitude = np.bitwise_and(bits, 0x7FFFFFFF)
    # Normal in float16: rebias the exponent (-112 << 23, wrapping) and round at
    # bit 13; a carry out of the mantissa bumps the exponent, up to infinity.
    half = np.right_shift(magnitude, 13)
    np.bitwise_and(half, 1, out=half)  # ties go to the even neighbour
    np.add(half, magnitude, out=half)
    np.add(half, 0xC8000FFF, out=half)
    np.right_shift(half, 13, out=half)
    tiny = magnitude < 0x38800000  # under 2**-14: subnormal (or zero) in float16
    if tiny.any():
        # Adding 0.5 in float32 rounds at 2**-24, float16's subnormal step, to
        # nearest even; the sum's low mantissa bits are the float16 bits.
        shifted = magnitude.view(np.float32) + np.float32(0.5)
        sub = shifted.view(np.uint32)
        np.subtract(sub, 0x3F000000, out=sub)
        np.copyto(half, sub, where=tiny)
    huge = magnitude >= 0x47800000  # 2**16 and over: infinity, or NaN
    if huge.any():
        np.copyto(half, 0x7C00, where=huge)
        nan = magnitude > 0x7F800000
        if nan.any():  # numpy keeps a NaN's top mantissa bits, and at least one
            payload = np.right_shift(np.bitwise_and(magnitude, 0x007FFFFF), 13)
            np.maximum(payload, 1, out=payload)
            np.add(payload, 0x7C00, out=payload)
            np.copyto(half, payload, where=nan)
    sign = np.right_shift(bits, 16)
    np.bitwise_and(sign, 0x8000, out=sign)
    np.bitwise_or(half, sign, out=half)
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
    """``dst[...] = src * factor`` cast to *dst*'s dtype, as
    ``np.multiply(src, factor, out=dst, casting="unsafe")`` (or ``np.copyto``)
    gives it, float16 <-> float32 through the casts above: a float32 *src* is
    scaled in float32, then narrowed.  Arrays of the same shape; a float16
    *src* with a *factor* goes through numpy (its float16 product)."""
    pair = (src.dtype, dst.dtype)
    flat = src.size == dst.size and src.flags.c_contiguous and dst.flags.c_contiguous
    if flat and pair == (_FLOAT16, _FLOAT32) and factor == 1.0:
        widen(src.reshape(-1), dst.reshape(-1))
    elif flat and pair == (_FLOAT32, _FLOAT16):
        # a float64 factor makes a float64 product, which narrow() leaves to numpy
        wide = src.reshape(-1) if factor == 1.0 else np.multiply(src.reshape(-1), factor)
        narrow(wide, dst.reshape(-1))
    elif factor != 1.0:
        np.multiply(src, factor, out=dst, casting="unsafe")
    else:
        np.copyto(dst, src, casting="unsafe")
