"""Reduction operations, with Horovod's names and values."""

import enum

from .exceptions import ArgumentError

#: Horovod's reduce-op handles (``hvd.Average`` ...), as every framework module exports them.
HANDLES = ("Average", "Sum", "Adasum", "Min", "Max", "Product")

__all__ = ["ReduceOp", *HANDLES, "resolve_op"]


class ReduceOp(enum.IntEnum):
    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Adasum = ReduceOp.ADASUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT


def resolve_op(op, average, default=Average) -> ReduceOp:
    """Horovod's rule: ``average=`` is the deprecated spelling of ``op=``; both is an error."""
    if op is not None and average is not None:
        raise ArgumentError(
            "allreduce got both op= and the deprecated average=; pass only op= "
            "(op=hvd.Average or op=hvd.Sum)."
        )
    if op is None:
        if average is None:
            return ReduceOp(default)
        return Average if average else Sum
    if type(op) is ReduceOp:  # the common case, checked first: once per submission
        return op
    try:
        return ReduceOp(int(op))
    except (ValueError, TypeError):
        raise ArgumentError(
            f"op={op!r} is not a reduction op: use hvd.Average, hvd.Sum, hvd.Adasum, "
            "hvd.Min, hvd.Max or hvd.Product."
        ) from None
