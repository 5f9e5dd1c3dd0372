"""The CUDA implementation of :class:`~hvdlite.device.backend.ArrayBackend`, over CuPy.

Arrays are CuPy arrays viewing the caller's memory (torch CUDA tensors and any
``__cuda_array_interface__`` object are wrapped by pointer, DLPack producers
through ``cupy.from_dlpack``): no copy, no host round trip.  The engine runs
each device's batches on one stream of its own, ordered after the producers'
streams with events (see :mod:`hvdlite.device.backend` for the model).  The
producer streams of a submission are the submitting thread's current CuPy
stream and, when torch has initialized CUDA, torch's current stream on the
array's device.

Importing this module imports CuPy: only the device registry does, when a CUDA
array arrives.
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
import weakref

import cupy
import numpy as np

from ..exceptions import ArgumentError
from .arrays import CUDA
from .buffers import BufferPool
from .packing import Copy
from .backend import ArrayBackend
from .cuda_kernels import BatchedCopies, Window

__all__ = ["CudaBackend", "Ready"]

_BYTES = np.dtype(np.uint8)


class Ready:
    """A submission's producer streams: ``marks`` = [(stream, event, seq)], *seq*
    ordering the marks of one stream (a later mark covers the earlier ones).  A
    mark whose event is None is pending: the batch that runs the submission
    records it (:meth:`CudaBackend.wait_ready`)."""

    __slots__ = ("device_id", "marks")

    def __init__(self, device_id: int, marks: list):
        self.device_id = device_id
        self.marks = marks


def _torch_stream_ptr(device_id: int) -> int | None:
    """torch's current stream on *device_id*, if torch has initialized CUDA here."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object made
    if raw is not None:
        return int(raw(device_id))
    return int(torch.cuda.current_stream(device_id).cuda_stream)


class _Events:
    """CUDA events made once and reused: a mark's event goes back here once the
    engine stream has waited for it (a wait takes the event's state at that
    moment, so recording it again later changes nothing already waited for)."""

    def __init__(self):
        self._free: dict[int, list] = {}

    def take(self, device_id: int) -> cupy.cuda.Event:
        free = self._free.get(device_id)
        if free:
            try:
                return free.pop()
            except IndexError:  # another thread took the last one
                pass
        return cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)

    def give(self, device_id: int, events) -> None:
        self._free.setdefault(device_id, []).extend(events)


class _Active:
    """The context of one batch: its device current and the engine stream CuPy's
    current stream (a plain class: this runs once per batch)."""

    __slots__ = ("backend", "device_id", "stream", "previous_device", "previous_stream")

    def __init__(self, backend, device_id: int, stream):
        self.backend, self.device_id, self.stream = backend, device_id, stream

    def __enter__(self):
        self.previous_device = cupy.cuda.runtime.getDevice()
        if self.previous_device != self.device_id:
            cupy.cuda.runtime.setDevice(self.device_id)
        self.previous_stream, self.backend._current = self.backend._current, self.stream
        self.stream.__enter__()
        return self.stream

    def __exit__(self, *exc) -> None:
        self.stream.__exit__(*exc)
        self.backend._current = self.previous_stream
        if self.previous_device != self.device_id:
            cupy.cuda.runtime.setDevice(self.previous_device)


class CudaBackend(ArrayBackend):
    """CuPy arrays on the engine's own stream per device."""

    device = CUDA

    def __init__(self):
        self._streams: dict[int, cupy.cuda.Stream] = {}
        self._external: dict[tuple[int, int], cupy.cuda.ExternalStream] = {}
        self._pools: dict[int, BufferPool] = {}
        self._staging = BufferPool(_pinned, trim=False)
        self._current: cupy.cuda.Stream | None = None
        self._events = _Events()
        self._marking = threading.Lock()  # a mark's event record and its seq, together
        self._seq = itertools.count(1)
        self.copies = BatchedCopies()
        self._held: dict[int, tuple] = {}  # wrap_held's views, by data pointer

    # ------------------------------------------------------------ arrays
    def wrap(self, x, what: str):
        if x.__class__ is cupy.ndarray:
            arr = x
        elif _is_torch_tensor(x):
            return _from_torch(x, what)  # contiguity checked there, on the tensor
        elif hasattr(x, "__cuda_array_interface__"):
            arr = _from_interface(x, what)
        else:
            arr = cupy.from_dlpack(x)
        if not arr._c_contiguous:  # cupy's own flag: .flags makes an object per call
            raise ArgumentError(
                f"{what}: the device array is not C-contiguous; pass a contiguous "
                "one (e.g. cupy.ascontiguousarray(x) or tensor.contiguous())."
            )
        return arr

    def wrap_held(self, tensor, what: str):
        """:meth:`wrap` for a torch CUDA tensor that the caller holds until its
        collective completes (a gradient of a bucket): the view, which then need
        not hold the tensor, is made once per tensor and reused while the
        tensor keeps its memory, shape and dtype."""
        ptr = tensor.data_ptr()
        held = self._held.get(ptr)
        if (
            held is not None
            and held[0]() is tensor
            and held[1] == tensor.shape
            and held[2] is tensor.dtype
        ):
            return held[3]
        arr = _from_torch(tensor, what, owner=None)
        if len(self._held) >= _HELD_VIEWS:
            self._held.clear()  # dead tensors' entries go; live ones come back on next use
        self._held[ptr] = (weakref.ref(tensor), tensor.shape, tensor.dtype, arr)
        return arr

    def empty(self, shape, dtype, ready=None):
        if ready is None or not ready.marks:
            return cupy.empty(shape, dtype)
        stream = ready.marks[0][0]
        with stream:
            out = cupy.empty(shape, dtype)
        # The memory is the producer stream's from now on: the engine also waits for
        # whatever that stream still does, so reuse of a just-freed block is ordered
        # (a pending mark, recorded when the batch runs, already covers it).
        if ready.marks[0][1] is not None:
            ready.marks.append(self._mark(stream, ready.device_id))
        return out

    def buffer(self, dtype, count: int, slot: int = 0):
        device_id = cupy.cuda.runtime.getDevice()
        pool = self._pools.get(device_id)
        if pool is None:
            pool = self._pools[device_id] = BufferPool(lambda n, dt: cupy.empty(n, dt), trim=False)
        return pool.get(dtype, count, slot)

    def staging(self, dtype, count: int, slot: int = 0) -> np.ndarray:
        return self._staging.get(dtype, count, slot)

    # ------------------------------------------------- copies and scaling
    def copy(self, dst, src) -> None:
        cupy.copyto(dst, src, casting="unsafe")

    def scale(self, dst, src, factor: float) -> None:
        self.copies.run([Copy(dst, src, factor)], self._stream())

    def zero(self, dst) -> None:
        dst.fill(0)

    def concatenate(self, srcs, dst) -> None:
        sizes = [src.nbytes for src in srcs]
        starts = list(itertools.accumulate(sizes, initial=dst.data.ptr))[:-1]
        self.copies.run_bytes([src.data.ptr for src in srcs], starts, sizes, self._stream())

    def split(self, src, dsts) -> None:
        sizes = [dst.nbytes for dst in dsts]
        starts = list(itertools.accumulate(sizes, initial=src.data.ptr))[:-1]
        self.copies.run_bytes(starts, [dst.data.ptr for dst in dsts], sizes, self._stream())

    # Views for copy_many: bare pointer records, no CuPy array made.
    def flat(self, x):
        return x

    def as_bytes(self, x):
        return Window.of(x, dtype=_BYTES)

    def window(self, flat, start: int, count: int):
        return Window.of(flat, start, count)

    def copy_many(self, copies) -> None:
        self.copies.run(copies, self._stream())

    def to_host(self, src, host: np.ndarray) -> None:
        stream = self._stream()
        src.get(stream=stream, out=host)
        stream.synchronize()

    def from_host(self, host: np.ndarray, dst) -> None:
        dst.set(host, stream=self._stream())

    # ----------------------------------------------------------- ordering
    def record_ready(self, arrays):
        device_id = arrays[0].data.device_id
        if len(arrays) > 1:
            devices = {a.data.device_id for a in arrays}
            if len(devices) > 1:
                raise ArgumentError(
                    f"hvdlite: one collective's arrays sit on GPUs {sorted(devices)}; "
                    "hvdlite moves one GPU per process: put them on one (e.g. "
                    "torch.cuda.set_device(hvd.local_rank()) before creating them)."
                )
        if cupy.cuda.runtime.getDevice() == device_id:
            return Ready(device_id, self._producer_marks(device_id))
        with cupy.cuda.Device(device_id):
            return Ready(device_id, self._producer_marks(device_id))

    def _producer_marks(self, device_id: int) -> list:
        """Pending marks on the submitting thread's CuPy stream and torch's current
        stream (no event recorded here: see :meth:`wait_ready`)."""
        stream = cupy.cuda.get_current_stream()
        marks = [(stream, None, 0)]
        torch_ptr = _torch_stream_ptr(device_id)
        if torch_ptr is not None and torch_ptr != stream.ptr:
            key = (device_id, torch_ptr)
            external = self._external.get(key)
            if external is None:
                external = self._external[key] = cupy.cuda.ExternalStream(torch_ptr, device_id)
            marks.append((external, None, 0))
        return marks

    def _mark(self, stream, device_id: int) -> tuple:
        event = self._events.take(device_id)
        with self._marking:
            event.record(stream)
            return (stream, event, next(self._seq))

    def wait_ready(self, tokens) -> None:
        """One wait per producer stream: a pending mark is recorded now, once per
        stream for the whole batch (it covers the submissions, and whatever came
        after them on that stream); else the stream's latest mark covers the rest."""
        latest: dict[int, tuple] = {}
        pending: dict[int, object] = {}
        for token in tokens:
            if token is not None:
                for mark in token.marks:
                    ptr = mark[0].ptr
                    if mark[1] is None:
                        pending[ptr] = mark[0]
                        continue
                    seen = latest.get(ptr)
                    if seen is None or seen[2] < mark[2]:
                        latest[ptr] = mark
        fresh = []
        if pending:
            device_id = cupy.cuda.runtime.getDevice()
            for ptr, producer in pending.items():
                latest[ptr] = mark = self._mark(producer, device_id)
                fresh.append(mark[1])
        stream = self._stream()
        for _, event, _ in latest.values():
            stream.wait_event(event)
        if fresh:  # a wait takes the event's state when made: the events are free again
            self._events.give(device_id, fresh)

    def publish(self, tokens) -> None:
        device_id = cupy.cuda.runtime.getDevice()
        done = self._events.take(device_id)
        done.record(self._stream())
        seen = set()
        used = [done]
        for token in tokens:
            if token is None:
                continue
            for producer, event, _ in token.marks:
                if event is not None:
                    used.append(event)
                if producer.ptr not in seen:
                    seen.add(producer.ptr)
                    producer.wait_event(done)
            token.marks = []  # its events are reused from here on
        self._events.give(device_id, used)

    def synchronize(self) -> None:
        self._stream().synchronize()

    def activate(self, arrays):
        device_id = arrays[0].data.device_id if arrays else cupy.cuda.runtime.getDevice()
        stream = self._streams.get(device_id)
        if stream is None:
            with cupy.cuda.Device(device_id):
                stream = self._streams[device_id] = cupy.cuda.Stream(non_blocking=True)
        return _Active(self, device_id, stream)

    def _stream(self) -> cupy.cuda.Stream:
        if self._current is None:
            raise RuntimeError("CudaBackend: device work outside activate()")
        return self._current


def _pinned(count: int, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    memory = cupy.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
    return np.frombuffer(memory, dtype, count)


def _from_interface(x, what: str):
    """A CuPy array over the memory an ``__cuda_array_interface__`` describes."""
    cai = x.__cuda_array_interface__
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None:
        expected, step = [], dtype.itemsize
        for dim in reversed(shape):
            expected.append(step)
            step *= dim
        if tuple(strides) != tuple(reversed(expected)) and math.prod(shape) > 1:
            raise ArgumentError(
                f"{what}: the device array is not C-contiguous (strides "
                f"{tuple(strides)}); pass a contiguous one."
            )
    nbytes = math.prod(shape) * dtype.itemsize
    ptr = int(cai["data"][0])
    if nbytes == 0 or ptr == 0:
        return cupy.empty(shape, dtype)
    device_id = cupy.cuda.runtime.pointerGetAttributes(ptr).device
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, x, device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


_TORCH_DTYPES: dict = {}
_SELF = object()  # _from_torch's default owner: the tensor itself


def _is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


#: Views wrap_held keeps (a few per gradient of the largest model step).
_HELD_VIEWS = 8192


def _from_torch(x, what: str, owner=_SELF):
    """A CuPy array over a torch CUDA tensor's memory, read from the tensor directly
    (cheaper than building its ``__cuda_array_interface__``); it holds *x* alive
    unless *owner* is given (None: the caller holds *x*)."""
    if not x.is_contiguous():
        raise ArgumentError(
            f"{what}: the device array is not C-contiguous; pass a contiguous "
            "one (e.g. tensor.contiguous())."
        )
    dtype = _TORCH_DTYPES.get(x.dtype)
    if dtype is None:
        typestr = x.detach().__cuda_array_interface__["typestr"]
        dtype = _TORCH_DTYPES[x.dtype] = np.dtype(typestr)
    shape = tuple(x.shape)
    nbytes = x.numel() * dtype.itemsize
    ptr = x.data_ptr()
    if nbytes == 0 or ptr == 0:
        return cupy.empty(shape, dtype)
    memory = cupy.cuda.UnownedMemory(ptr, nbytes, x if owner is _SELF else owner, x.get_device())
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))
