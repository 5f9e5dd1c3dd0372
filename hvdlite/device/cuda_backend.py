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

import contextlib
import math
import sys

import cupy
import numpy as np

from ..exceptions import ArgumentError
from .arrays import CUDA
from ..engine.fusion import BufferPool
from .backend import ArrayBackend

__all__ = ["CudaBackend", "Ready"]


class Ready:
    """Where a submission's producer streams stood: ``marks`` = [(stream, event)]."""

    __slots__ = ("device_id", "marks")

    def __init__(self, device_id: int, marks: list):
        self.device_id = device_id
        self.marks = marks


def _torch_stream_ptr(device_id: int) -> int | None:
    """torch's current stream on *device_id*, if torch has initialized CUDA here."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    return int(torch.cuda.current_stream(device_id).cuda_stream)


def _event() -> cupy.cuda.Event:
    return cupy.cuda.Event(block=False, disable_timing=True, interprocess=False)


class CudaBackend(ArrayBackend):
    """CuPy arrays on the engine's own stream per device."""

    device = CUDA

    def __init__(self):
        self._streams: dict[int, cupy.cuda.Stream] = {}
        self._pools: dict[int, BufferPool] = {}
        self._staging = BufferPool(_pinned, trim=False)
        self._current: cupy.cuda.Stream | None = None

    # ------------------------------------------------------------ arrays
    def wrap(self, x, what: str):
        if isinstance(x, cupy.ndarray):
            arr = x
        elif hasattr(x, "__cuda_array_interface__"):
            arr = _from_interface(x, what)
        else:
            arr = cupy.from_dlpack(x)
        if not arr.flags.c_contiguous:
            raise ArgumentError(
                f"{what}: the device array is not C-contiguous; pass a contiguous "
                "one (e.g. cupy.ascontiguousarray(x) or tensor.contiguous())."
            )
        return arr

    def empty(self, shape, dtype, ready=None):
        if ready is None or not ready.marks:
            return cupy.empty(shape, dtype)
        stream = ready.marks[0][0]
        with stream:
            out = cupy.empty(shape, dtype)
        # The memory is the producer stream's from now on: the engine also waits for
        # whatever that stream still does, so reuse of a just-freed block is ordered.
        event = _event()
        event.record(stream)
        ready.marks.append((stream, event))
        return out

    def buffer(self, dtype, count: int, slot: int = 0):
        device_id = cupy.cuda.Device().id
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
        cupy.multiply(src, factor, out=dst, casting="unsafe")

    def zero(self, dst) -> None:
        dst.fill(0)

    def concatenate(self, srcs, dst) -> None:
        cupy.concatenate(srcs, out=dst)

    def to_host(self, src, host: np.ndarray) -> None:
        stream = self._stream()
        src.get(stream=stream, out=host)
        stream.synchronize()

    def from_host(self, host: np.ndarray, dst) -> None:
        dst.set(host, stream=self._stream())

    # ----------------------------------------------------------- ordering
    def record_ready(self, arrays):
        devices = {a.device.id for a in arrays}
        if len(devices) > 1:
            raise ArgumentError(
                f"hvdlite: one collective's arrays sit on GPUs {sorted(devices)}; "
                "hvdlite moves one GPU per process: put them on one (e.g. "
                "torch.cuda.set_device(hvd.local_rank()) before creating them)."
            )
        device_id = devices.pop()
        with cupy.cuda.Device(device_id):
            streams = [cupy.cuda.get_current_stream()]
            torch_ptr = _torch_stream_ptr(device_id)
            if torch_ptr is not None and torch_ptr != streams[0].ptr:
                streams.append(cupy.cuda.ExternalStream(torch_ptr, device_id))
            marks = []
            for stream in streams:
                event = _event()
                event.record(stream)
                marks.append((stream, event))
        return Ready(device_id, marks)

    def wait_ready(self, tokens) -> None:
        stream = self._stream()
        for token in tokens:
            if token is not None:
                for _, event in token.marks:
                    stream.wait_event(event)

    def publish(self, tokens) -> None:
        done = _event()
        done.record(self._stream())
        seen = set()
        for token in tokens:
            if token is None:
                continue
            for producer, _ in token.marks:
                if producer.ptr not in seen:
                    seen.add(producer.ptr)
                    producer.wait_event(done)

    def synchronize(self) -> None:
        self._stream().synchronize()

    @contextlib.contextmanager
    def activate(self, arrays):
        device_id = arrays[0].device.id if arrays else cupy.cuda.Device().id
        with cupy.cuda.Device(device_id):
            stream = self._streams.get(device_id)
            if stream is None:
                stream = self._streams[device_id] = cupy.cuda.Stream(non_blocking=True)
            previous, self._current = self._current, stream
            try:
                with stream:
                    yield stream
            finally:
                self._current = previous

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
