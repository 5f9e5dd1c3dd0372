"""16-bit float <-> float32 array conversions; a framework may replace float16's.

The 16-bit wire (:mod:`hvdlite.engine.transports.half_wire`) widens every float16
or bfloat16 value it receives to float32 and narrows each sum back once.  numpy
converts values that are subnormal in float16 (most gradients below 6e-5) in
software, tens of times slower than the hardware conversions a framework uses;
the torch adapter registers its own at import (:func:`register`).  bfloat16 has
float32's exponent, and ml_dtypes' casts (numpy casts) are fast: they are used
as they are.  Every implementation must round to nearest even, as numpy and
ml_dtypes do, so the results are the same bits.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["register", "widen", "narrow"]


def _numpy_cast(src: np.ndarray, out: np.ndarray) -> None:
    np.copyto(out, src, casting="unsafe")


_FLOAT16 = np.dtype(np.float16)
_widen: Callable[[np.ndarray, np.ndarray], None] = _numpy_cast
_narrow: Callable[[np.ndarray, np.ndarray], None] = _numpy_cast


def register(widen_to_float32: Callable, narrow_to_float16: Callable) -> None:
    """Use these ``(src, out)`` functions from now on: float16 *src* into float32
    *out*, and float32 *src* into float16 *out* (both 1-D, contiguous, same length)."""
    global _widen, _narrow
    _widen, _narrow = widen_to_float32, narrow_to_float16


def widen(src: np.ndarray, out: np.ndarray) -> None:
    """float16 or bfloat16 *src* into float32 *out* (exact)."""
    if src.dtype == _FLOAT16:
        _widen(src, out)
    else:
        _numpy_cast(src, out)


def narrow(src: np.ndarray, out: np.ndarray) -> None:
    """float32 *src* into float16 or bfloat16 *out*, rounded to nearest even."""
    if out.dtype == _FLOAT16:
        _narrow(src, out)
    else:
        _numpy_cast(src, out)
