"""The array-backend interface of the device path, and its host implementation.

The device executor (:mod:`hvdlite.engine.transports.device`) packs, scales, moves and
orders device buffers only through an :class:`ArrayBackend`, so the same code
runs on CUDA (:class:`~hvdlite.device.cuda_backend.CudaBackend`, CuPy) and on
the host (:class:`HostBackend`, numpy), which is how CPU CI exercises it.

Ordering model (CUDA terms; the host backend follows the same calls in program
order and can keep a journal of them for tests):

1. at submission, on the caller's thread, :meth:`ArrayBackend.record_ready`
   notes the producer streams (the submitting thread's current streams); it
   records nothing, so a submission costs no driver call;
2. the engine runs a batch on its own stream: :meth:`~ArrayBackend.wait_ready`
   records one event on each producer stream of the batch and makes the engine
   stream wait for it (the host never blocks).  That event covers everything
   enqueued there before the batch runs, so all the work before each
   submission too: the engine may wait for a little more than it must, never
   for less, and a batch costs one record per producer stream, not one per
   tensor.  Then the copies, scaling and collective are enqueued on it;
3. :meth:`~ArrayBackend.publish` makes each producer stream wait for the
   engine stream's work so far, so whatever the caller enqueues after the
   handle completes sees the results; nothing blocks the training stream on
   the host.

Host-side MPI on device memory (CUDA-aware MPI, staging) first calls
:meth:`~ArrayBackend.synchronize`: the engine thread, never the training
thread, waits for the engine stream.

Cost model: the executor issues a constant number of backend calls per batch,
whatever its number of tensors (one :meth:`~ArrayBackend.copy_many` per pack or
unpack, one record and wait per producer stream, one publish); the CUDA backend runs each
as a constant number of launches.  The host backend's journal counts the calls,
which is how CPU CI holds the GPU path's cost per batch flat.

Scaling rule (Horovod's on CUDA, checked bit for bit by its suite): a scaled
value is rounded to the caller's tensor dtype, the narrower of a copy's two
dtypes: float16 as float16 times the factor rounded to float16, float32 in
float32, float64 in float64, integers in float64 then truncated.  The host
backend applies the same rule, so CPU CI checks it.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import threading

import numpy as np

from ..util import half_casts
from .buffers import BufferPool
from .packing import NUMPY, Copy
from .arrays import HOST, HostDeviceArray

__all__ = ["ArrayBackend", "HostBackend", "HostEvent"]


class ArrayBackend(abc.ABC):
    """What the device path needs from a device: memory, copies, ordering.

    Arrays are the backend's own (numpy for the host, CuPy for CUDA): flat
    slicing, ``reshape(-1)``, ``view(dtype)``, ``.size``, ``.nbytes``,
    ``.dtype`` and ``.shape`` behave as numpy's.  Every copy/scale call is
    enqueued on the engine's stream in call order.
    """

    device: str

    # ------------------------------------------------------------ arrays
    @abc.abstractmethod
    def wrap(self, x, what: str):
        """The backend array viewing *x*'s memory (no copy); ArgumentError if unusable."""

    @abc.abstractmethod
    def empty(self, shape, dtype, ready=None):
        """A new array for a result handed to the caller, allocated so that reusing
        its memory is ordered on the caller's streams (*ready*: its token)."""

    @abc.abstractmethod
    def buffer(self, dtype, count: int, slot: int = 0):
        """The engine's persistent device buffer (*slot* tells concurrent ones apart)."""

    @abc.abstractmethod
    def staging(self, dtype, count: int, slot: int = 0) -> np.ndarray:
        """The engine's persistent host buffer for staging (pinned memory on CUDA)."""

    # ------------------------------------------------- copies and scaling
    @abc.abstractmethod
    def copy(self, dst, src) -> None:
        """``dst[...] = src``, cast to dst's dtype."""

    @abc.abstractmethod
    def scale(self, dst, src, factor: float) -> None:
        """``dst[...] = src * factor``, cast to dst's dtype (the scaling rule above)."""

    def flat(self, x):
        """*x* as a flat array (or a record only :meth:`copy_many` reads)."""
        return x.reshape(-1)

    def as_bytes(self, x):
        """*x*'s bytes, flat (or a record only :meth:`copy_many` reads)."""
        return x.reshape(-1).view(np.uint8)

    def window(self, flat, start: int, count: int):
        """Elements start..start+count of *flat* (or a record only :meth:`copy_many` reads)."""
        return flat[start : start + count]

    @abc.abstractmethod
    def copy_many(self, copies) -> None:
        """Every :class:`~hvdlite.device.packing.Copy` of a batch (the scaling rule
        above), as a constant number of device operations."""

    @abc.abstractmethod
    def zero(self, dst) -> None:
        """``dst[...] = 0``."""

    @abc.abstractmethod
    def concatenate(self, srcs, dst) -> None:
        """Pack flat *srcs* (all of dst's dtype) back to back into *dst*."""

    @abc.abstractmethod
    def split(self, src, dsts) -> None:
        """Unpack flat *src* back to back into flat *dsts* (all of src's dtype)."""

    @abc.abstractmethod
    def to_host(self, src, host: np.ndarray) -> None:
        """Copy device *src* into *host*; complete when this returns."""

    @abc.abstractmethod
    def from_host(self, host: np.ndarray, dst) -> None:
        """Copy *host* into device *dst* (enqueued; *host* must stay untouched until
        the next :meth:`synchronize` or a later :meth:`to_host`)."""

    # ----------------------------------------------------------- ordering
    @abc.abstractmethod
    def record_ready(self, arrays):
        """Caller thread, at submission: a token naming the streams that produced
        *arrays* (the submitting thread's current ones); no device call."""

    @abc.abstractmethod
    def wait_ready(self, tokens) -> None:
        """Engine stream: wait (on the device) for the producer streams of *tokens*
        (None skipped) as they stand now: one record and one wait per stream."""

    @abc.abstractmethod
    def publish(self, tokens) -> None:
        """Make the producers' streams of *tokens* wait for the engine's work so far."""

    @abc.abstractmethod
    def synchronize(self) -> None:
        """Host: wait until the engine stream's work so far is done."""

    @abc.abstractmethod
    def activate(self, arrays):
        """Context manager for running one batch on *arrays*' device and the engine stream."""


class HostEvent:
    """A producer mark of the host backend: its "stream" is the submitting thread,
    as a CUDA producer stream would be; *seq* orders the marks (a batch's
    :meth:`HostBackend.wait_ready` gives its tokens a newer one, as the CUDA
    backend records a new event there)."""

    __slots__ = ("seq", "stream")
    _counter = itertools.count(1)

    def __init__(self):
        self.seq = next(self._counter)
        self.stream = threading.get_ident()


def scaled_as_on_device(src: np.ndarray, factor: float, dtype: np.dtype) -> np.ndarray:
    """``src * factor`` rounded to *dtype* by the device scaling rule (module doc)."""
    value = src.astype(dtype, copy=False)
    if dtype.kind == "f":
        # float16 x float16: numpy multiplies exactly in float32 and rounds once.
        factor = np.float16(np.float32(factor)) if dtype == np.float16 else dtype.type(factor)
        return np.multiply(value, factor)
    return np.multiply(value, np.float64(factor)).astype(dtype)  # truncates, as C does


class HostBackend(ArrayBackend):
    """The device path on host memory: numpy copies, MPI on the buffers.

    Its "stream" is the engine thread's program order, so ordering calls have
    nothing to wait for; when *journal* is a list they append what they did
    (``("ready", seq)``, ``("wait", seq)``, ``("publish", seq)``, ``("sync",)``,
    and the data calls ``("copies", n)``, ``("copy",)``, ``("zero",)``) so tests
    can check that the executor orders a batch correctly and how many calls a
    batch costs.
    """

    device = HOST

    def __init__(self, journal: list | None = None):
        self.journal = journal
        self._pool = BufferPool(trim=False)
        self._staging = BufferPool(trim=False)

    def _note(self, *item) -> None:
        if self.journal is not None:
            self.journal.append(item)

    def wrap(self, x, what: str):
        return x if isinstance(x, HostDeviceArray) else np.asarray(x).view(HostDeviceArray)

    def empty(self, shape, dtype, ready=None):
        return np.empty(shape, dtype).view(HostDeviceArray)

    def buffer(self, dtype, count: int, slot: int = 0):
        return self._pool.get(dtype, count, slot)

    def staging(self, dtype, count: int, slot: int = 0) -> np.ndarray:
        return self._staging.get(dtype, count, slot)

    def copy(self, dst, src) -> None:
        self._note("copy")
        half_casts.copy(dst, src)

    def scale(self, dst, src, factor: float) -> None:
        self.copy_many([Copy(dst, src, factor)])

    def zero(self, dst) -> None:
        self._note("zero")
        dst.fill(0)

    def concatenate(self, srcs, dst) -> None:
        self._note("copies", len(srcs))
        np.concatenate(srcs, out=dst)

    def split(self, src, dsts) -> None:
        self._note("copies", len(dsts))
        NUMPY.split(src, dsts)

    def copy_many(self, copies) -> None:
        self._note("copies", len(copies))
        for dst, src, factor in copies:
            if src is None:
                dst.fill(0)
            elif factor == 1.0:
                half_casts.copy(dst, src)
            else:
                narrow = dst.dtype if src.dtype.itemsize > dst.dtype.itemsize else src.dtype
                np.copyto(dst, scaled_as_on_device(src, factor, narrow), casting="unsafe")

    def to_host(self, src, host: np.ndarray) -> None:
        self._note("sync")
        np.copyto(host, src)

    def from_host(self, host: np.ndarray, dst) -> None:
        np.copyto(dst, host)

    def record_ready(self, arrays):
        event = HostEvent()
        self._note("ready", event.seq)
        return event

    def wait_ready(self, tokens) -> None:
        if self.journal is None:
            return  # the host has nothing to wait for: the journal is all there is
        recorded: dict[int, HostEvent] = {}  # one record per producer stream of the batch
        for token in tokens:
            if token is not None:
                event = recorded.get(token.stream)
                if event is None:
                    event = recorded[token.stream] = HostEvent()
                    self._note("record", event.seq)
                token.seq = event.seq
        for seq in self._latest(tokens):
            self._note("wait", seq)

    def publish(self, tokens) -> None:
        if self.journal is not None:
            for seq in self._latest(tokens):
                self._note("publish", seq)

    @staticmethod
    def _latest(tokens) -> list[int]:
        """The latest mark of each producer "stream" among *tokens* (it covers the
        earlier ones), as the CUDA backend waits once per stream."""
        latest: dict[int, int] = {}
        for token in tokens:
            if token is not None:
                latest[token.stream] = max(latest.get(token.stream, 0), token.seq)
        return sorted(latest.values())

    def synchronize(self) -> None:
        self._note("sync")

    def activate(self, arrays):
        return contextlib.nullcontext()
