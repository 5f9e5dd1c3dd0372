"""Which array dtypes each collective accepts, and how reductions move them.

MPI has no portable float16 or bfloat16 reduction, so both are reduced in a
float32 buffer (more accurate too) and rounded once; across nodes large ones
cross as 16 bits (:mod:`hvdlite.engine.transports.half_wire`).  bool is moved
as bytes; it may be reduced only with Min (logical and), Max (logical or) or
Product (and), done on uint8.  Every collective that moves values (allgather,
broadcast, alltoall) moves bytes, so any dtype moves bit for bit.

numpy has no bfloat16 of its own: the engine takes ml_dtypes' (the one JAX and
TensorFlow hand out), whose casts to and from float32 are numpy casts and round
to nearest even.  Its ``dtype.str`` (``'<V2'``) does not name it, so the engine
keys it as ``"bfloat16"`` (:func:`key_of`), which ``np.dtype()`` reads back.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from ..ops import ReduceOp
from ..exceptions import ArgumentError

__all__ = [
    "BFLOAT16",
    "HALF_FLOATS",
    "SUPPORTED",
    "OWN_WIRE",
    "check_dtype",
    "key_of",
    "reduce_dtype",
]

#: numpy's bfloat16 (ml_dtypes'), and the engine's key for it.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
_BFLOAT16_KEY = "bfloat16"

SUPPORTED = frozenset(
    np.dtype(t).str
    for t in (
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.int32,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.bool_,
    )
) | {_BFLOAT16_KEY}
_NAMES = "uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool"

#: The 16-bit floats, reduced in float32: their keys.
HALF_FLOATS = frozenset({np.dtype(np.float16).str, _BFLOAT16_KEY})

# dtype -> its key, for the supported ones (a dict lookup is the cheap check on
# the submission path, which runs once per tensor).
_STR_OF = {np.dtype(s): s for s in SUPPORTED}


def key_of(dtype: np.dtype) -> str:
    """The engine's key for *dtype*: its ``str``, or ``"bfloat16"``."""
    return _STR_OF.get(dtype) or dtype.str


def check_dtype(array: np.ndarray, what: str, op: ReduceOp | None = None) -> str:
    """Return the dtype string of *array* or raise ValueError naming what is supported."""
    dt = array.dtype
    dtype_str = _STR_OF.get(dt)
    if dtype_str is None:
        raise ArgumentError(
            f"{what}: dtype {dt} is not supported. Supported dtypes: {_NAMES} "
            "(cast the array, e.g. with .astype(np.float32))."
        )
    if (
        op is not None
        and dt.kind == "b"
        and op not in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)
    ):
        raise ArgumentError(
            f"{what}: a bool array can only be reduced with op=Min (and), Max (or) or "
            f"Product (and), not {op.name.capitalize()}; cast to an integer type to sum."
        )
    return dtype_str


_WIRE: dict[str, np.dtype] = {}


def reduce_dtype(dtype_str: str) -> np.dtype:
    """The dtype a reduction buffer of this input dtype uses on the wire."""
    wire = _WIRE.get(dtype_str)
    if wire is None:
        wire = _WIRE[dtype_str] = _reduce_dtype(dtype_str)
    return wire


def _reduce_dtype(dtype_str: str) -> np.dtype:
    if dtype_str in HALF_FLOATS:
        return np.dtype(np.float32)
    dt = np.dtype(dtype_str)
    if dt == np.bool_:
        return np.dtype(np.uint8)
    return dt


#: The dtype keys a reduction moves as they are (not float16, bfloat16 or bool).
OWN_WIRE = frozenset(s for s in SUPPORTED if _reduce_dtype(s).str == s)
