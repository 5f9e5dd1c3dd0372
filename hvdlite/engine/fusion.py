"""Tensor fusion: which responses run together.

Responses of the same fusable kind, process set and wire dtype (float16 and
bfloat16 each apart from the float32 they are reduced in; and op, root)
are packed into one persistent buffer up to the fusion threshold and moved by
one collective.  The plan depends only on the response list and the threshold,
so every rank forms the same batches (the threshold is a per-process knob:
ranks must be started with the same value, which hvdrun guarantees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..ops import ReduceOp
from ..util.dtypes import HALF_FLOATS, reduce_dtype
from .messages import RESPONSE_OK, Kind, Response

__all__ = ["plan_batches", "nbytes_of"]

_ADASUM = int(ReduceOp.ADASUM)  # Adasum batches run one tensor at a time

_FUSABLE = (Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.REDUCESCATTER)


def nbytes_of(params) -> int:
    """Bytes this response moves per rank (dim 0 counted as 1 where it is negotiated late)."""
    total = 0
    for dt, shape in zip(params.dtypes, params.shapes):
        total += math.prod(shape) * np.dtype(dt).itemsize
    return total


def _fusion_key(response: Response):
    p = response.params
    if response.status != RESPONSE_OK or p.kind not in _FUSABLE:
        return None
    if p.kind in (Kind.ALLREDUCE, Kind.REDUCESCATTER):
        wires = {reduce_dtype(d).str for d in p.dtypes}
        if len(wires) != 1:
            return None
        # float16 and bfloat16 apart from float32 (one wire dtype) and from each
        # other: they may cross nodes as 16 bits
        first = p.dtypes[0]
        half = first if first in HALF_FLOATS and all(d == first for d in p.dtypes) else None
        return (p.kind, p.set_id, wires.pop(), half, p.op, p.device)
    if p.kind == Kind.BROADCAST:
        return (p.kind, p.set_id, p.root, p.device)
    return (p.kind, p.set_id, p.device)


def plan_batches(responses: Sequence[Response], threshold: int) -> list[list[Response]]:
    """Split *responses* into batches that each run as one collective.

    Fusable responses are grouped by their fusion key (first appearance order)
    and cut into batches of at most *threshold* bytes; everything else (errors,
    control messages, Adasum, alltoall) is a batch of its own, in place.
    """
    if len(responses) == 1:
        return [list(responses)]
    batches: list[list[Response]] = []
    open_batch: dict = {}
    open_bytes: dict = {}
    for response in responses:
        key = _fusion_key(response)
        if key is None or threshold <= 0 or response.params.op == _ADASUM:
            batches.append([response])
            continue
        size = nbytes_of(response.params)
        batch = open_batch.get(key)
        if batch is not None and open_bytes[key] + size <= threshold:
            batch.append(response)
            open_bytes[key] += size
            continue
        batch = [response]
        batches.append(batch)
        open_batch[key] = batch
        open_bytes[key] = size
    return batches
