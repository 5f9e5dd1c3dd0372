"""Which array dtypes each collective accepts, and how reductions move them.

MPI has no portable float16 reduction, so float16 is reduced in a float32
buffer (more accurate too).  bool is moved as bytes; it may be reduced only
with Min (logical and), Max (logical or) or Product (and), done on uint8.
numpy has no bfloat16: framework adapters reduce bfloat16 in float32 and move
it bit-exactly as int16 for broadcast/allgather/alltoall.
"""

from __future__ import annotations

import numpy as np

from ..ops import ReduceOp
from ..exceptions import ArgumentError

__all__ = ["SUPPORTED", "OWN_WIRE", "check_dtype", "reduce_dtype"]

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
)
_NAMES = "uint8, int8, uint16, int16, int32, int64, float16, float32, float64, bool"


# dtype -> its string, for the supported ones (a dict lookup is the cheap check
# on the submission path, which runs once per tensor).
_STR_OF = {np.dtype(s): s for s in SUPPORTED}


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
    dt = np.dtype(dtype_str)
    if dt == np.float16:
        return np.dtype(np.float32)
    if dt == np.bool_:
        return np.dtype(np.uint8)
    return dt


#: The dtype strings a reduction moves as they are (not float16 or bool).
OWN_WIRE = frozenset(s for s in SUPPORTED if _reduce_dtype(s).str == s)
