"""Tensor fusion: which responses run together, and the buffers they share.

Responses of the same fusable kind, process set and wire dtype (and op, root)
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
from .dtypes import reduce_dtype
from .messages import RESPONSE_OK, Kind, Response

__all__ = ["plan_batches", "BufferPool", "nbytes_of", "Reduction"]

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
        return (p.kind, p.set_id, wires.pop(), p.op, p.device)
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


class Reduction:
    """The tensors of one reduction batch, as parallel lists (one position per tensor).

    ``entries[i]`` is the local entry (None on a rank that joined), ``inputs[i]`` /
    ``outputs[i]`` its arrays (None when joined), ``counts[i]`` its element count,
    ``prescales[i]`` / ``postscales[i]`` the factors applied on the way in and out
    (an Average's division by the set size is folded into the postscale).  A batch
    holds hundreds of tensors, so lists per field cost far less than a record per
    tensor.
    """

    __slots__ = ("entries", "inputs", "outputs", "counts", "prescales", "postscales")

    def __init__(self):
        self.entries: list = []
        self.inputs: list = []
        self.outputs: list = []
        self.counts: list[int] = []
        self.prescales: list[float] = []
        self.postscales: list[float] = []

    def __len__(self) -> int:
        return len(self.counts)

    def add(self, entry, inp, out, count: int, prescale: float, postscale: float) -> None:
        self.entries.append(entry)
        self.inputs.append(inp)
        self.outputs.append(out)
        self.counts.append(count)
        self.prescales.append(prescale)
        self.postscales.append(postscale)

    def extend(self, entry, inputs, outputs, counts, prescale: float, postscale: float) -> None:
        """Add the tensors of one entry (*inputs*/*outputs* None on a joined
        rank), all with the same factors."""
        n = len(counts)
        self.entries.extend([entry] * n)
        self.inputs.extend(inputs if inputs is not None else [None] * n)
        self.outputs.extend(outputs if outputs is not None else [None] * n)
        self.counts.extend(counts)
        self.prescales.extend([prescale] * n)
        self.postscales.extend([postscale] * n)

    def subset(self, indices) -> Reduction:
        """The tensors at *indices*, in that order."""
        part = Reduction()
        for i in indices:
            part.add(
                self.entries[i],
                self.inputs[i],
                self.outputs[i],
                self.counts[i],
                self.prescales[i],
                self.postscales[i],
            )
        return part

    def total(self) -> int:
        """Elements over every tensor."""
        return sum(self.counts)


class BufferPool:
    """Persistent flat buffers, one per dtype and slot, grown on demand and reused.

    Reusing the same memory avoids a page fault per step for every freshly
    allocated fusion buffer (a measurable cost on small machines).  A buffer
    does not keep the size of a past peak forever: every :data:`WINDOW` calls,
    one larger than :data:`KEEP_BYTES` that is over twice the largest request
    of the window shrinks to that request, and one the window did not use is
    freed.

    *allocate(count, dtype)* makes a buffer (numpy's by default; the device
    backends pass theirs).  *trim*: False keeps every buffer for the pool's life
    (device buffers, which a stream may still be using when the window ends).
    """

    WINDOW = 1000
    KEEP_BYTES = 1 << 20

    def __init__(self, allocate=None, trim: bool = True):
        self._allocate = allocate or (lambda count, dtype: np.empty(count, dtype=dtype))
        self._trims = trim
        self._buffers: dict[tuple[str, int], np.ndarray] = {}
        self._peaks: dict[tuple[str, int], int] = {}  # largest request in this window
        self._calls = 0

    def get(self, dtype, count: int, slot: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        key = (dtype.str, slot)
        buf = self._buffers.get(key)
        if buf is None or buf.size < count:
            # Grow geometrically so a slowly growing workload does not reallocate each cycle.
            size = max(count, int(buf.size * 1.5) if buf is not None else 0, 1)
            buf = self._allocate(size, dtype)
            self._buffers[key] = buf
        if not self._trims:
            return buf[:count]
        if count > self._peaks.get(key, -1):
            self._peaks[key] = count
        self._calls += 1
        if self._calls >= self.WINDOW:
            self._trim()
        return buf[:count]

    def _trim(self) -> None:
        """End of a window: free what it did not use, shrink what it used little of."""
        for key, buf in list(self._buffers.items()):
            peak = self._peaks.get(key)
            if peak is None:
                del self._buffers[key]
            elif buf.nbytes > self.KEEP_BYTES and buf.size > 2 * peak:
                self._buffers[key] = self._allocate(peak, buf.dtype)
        self._peaks.clear()
        self._calls = 0

    def nbytes(self) -> int:
        """Bytes held now."""
        return sum(buf.nbytes for buf in self._buffers.values())

    def clear(self) -> None:
        self._buffers.clear()
        self._peaks.clear()
