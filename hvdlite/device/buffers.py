"""The memory a batch is moved through: its tensors' layout and the fusion buffers.

:class:`Reduction` lists the tensors of one reduction batch (what
:mod:`~hvdlite.device.packing` copies in and out); :class:`BufferPool` keeps
the persistent flat buffers they are copied through, for host memory (numpy)
or, given an allocator, a device's.  Local to a process: nothing here talks to
another rank.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BufferPool", "Reduction"]


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
