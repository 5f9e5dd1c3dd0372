"""The device path's batched copy kernels: one launch packs or unpacks a whole batch.

A batch of copies (:class:`~hvdlite.device.packing.Copy`) becomes a table of
``(src, dst, count, factor)`` rows in device memory, uploaded with one
asynchronous copy from pinned memory, and one kernel launch per kind of copy
(usually one):

- ``copy_bytes``: copies that change no value (same dtype, or bool and uint8,
  unscaled), moved as 16-, 4- or 1-byte words as the row's alignment allows;
- ``copy_scaled<Src, Dst, S>``: casts and scaling.  A scaled value is rounded
  to the caller's tensor dtype *S* (the narrower of the two): the factor is
  rounded to *S* and the product computed exactly and rounded once for
  float16, in float32 for float32, and in float64 then truncated for integers.
  That is Horovod's CUDA rule, which its test suite checks bit for bit.

A null ``src`` writes zeros (a joined rank's share of a fused buffer).  The
kernels use no CUDA headers (float16 conversions are PTX ``cvt``), so they
compile with NVRTC wherever CuPy runs.
"""

from __future__ import annotations

import threading

import cupy
import numpy as np

__all__ = ["BatchedCopies", "Window"]

_SOURCE = r"""
struct Half { unsigned short bits; };
struct Item { const char* src; char* dst; long long count; double factor; };

__device__ __forceinline__ float half_to_float(Half h) {
    float f;
    asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ Half float_to_half(float f) {
    Half h;
    asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h.bits) : "f"(f));
    return h;
}

template <typename To> struct Cvt {
    template <typename From> __device__ static To from(From x) { return static_cast<To>(x); }
    __device__ static To from(Half x) { return static_cast<To>(half_to_float(x)); }
};
template <> struct Cvt<Half> {
    template <typename From> __device__ static Half from(From x) {
        return float_to_half(static_cast<float>(x));
    }
    __device__ static Half from(Half x) { return x; }
};

// The precision a scaled value of tensor dtype S is computed in, and its factor.
template <typename S> struct Math {  // integers: float64, as Horovod scales them
    typedef double M;
    __device__ static M factor(double f) { return f; }
};
template <> struct Math<float> {
    typedef float M;
    __device__ static M factor(double f) { return static_cast<float>(f); }
};
template <> struct Math<Half> {  // float16 times float16, exact, rounded once
    typedef float M;
    __device__ static M factor(double f) { return half_to_float(float_to_half((float)f)); }
};

template <typename Src, typename Dst, typename S>
__global__ void copy_scaled(const Item* items, int n) {
    typedef typename Math<S>::M M;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const Item it = items[t];
        Dst* dst = reinterpret_cast<Dst*>(it.dst);
        const Src* src = reinterpret_cast<const Src*>(it.src);
        if (src == 0) {
            for (long long i = first; i < it.count; i += step) dst[i] = Cvt<Dst>::from(0);
        } else if (it.factor == 1.0) {
            for (long long i = first; i < it.count; i += step) dst[i] = Cvt<Dst>::from(src[i]);
        } else {
            const M f = Math<S>::factor(it.factor);
            for (long long i = first; i < it.count; i += step) {
                const M v = Cvt<M>::from(Cvt<S>::from(src[i]));
                dst[i] = Cvt<Dst>::from(Cvt<S>::from(v * f));
            }
        }
    }
}

template <typename W>
__device__ __forceinline__ void move_words(const Item& it, long long first, long long step) {
    W* dst = reinterpret_cast<W*>(it.dst);
    const long long words = it.count / (long long)sizeof(W);
    if (it.src == 0) {
        const W zero = W();
        for (long long i = first; i < words; i += step) dst[i] = zero;
    } else {
        const W* src = reinterpret_cast<const W*>(it.src);
        for (long long i = first; i < words; i += step) dst[i] = src[i];
    }
}

extern "C" __global__ void copy_bytes(const Item* items, int n) {
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (int t = blockIdx.y; t < n; t += gridDim.y) {
        const Item it = items[t];
        const unsigned long long bits =
            (unsigned long long)it.src | (unsigned long long)it.dst | (unsigned long long)it.count;
        if ((bits & 15) == 0) move_words<uint4>(it, first, step);
        else if ((bits & 3) == 0) move_words<unsigned int>(it, first, step);
        else move_words<unsigned char>(it, first, step);
    }
}
"""

_C_TYPES = {
    np.dtype(np.bool_): "bool",
    np.dtype(np.uint8): "unsigned char",
    np.dtype(np.int8): "signed char",
    np.dtype(np.uint16): "unsigned short",
    np.dtype(np.int16): "short",
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
    np.dtype(np.float16): "Half",
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
}
_THREADS = 256
_ROW = 4  # int64 words per table row: src, dst, count, factor (float64 bits)


def _moves_bytes(src_dtype, dst_dtype) -> bool:
    return src_dtype == dst_dtype or (
        src_dtype.itemsize == dst_dtype.itemsize == 1
        and {src_dtype.kind, dst_dtype.kind} <= {"b", "u"}
    )


class Window:
    """A flat run of device memory that only :class:`BatchedCopies` reads: a
    pointer, a count and a dtype (cheaper to make than a CuPy view)."""

    __slots__ = ("ptr", "size", "dtype", "nbytes")

    def __init__(self, ptr: int, size: int, dtype: np.dtype):
        self.ptr, self.size, self.dtype = ptr, size, dtype
        self.nbytes = size * dtype.itemsize

    @classmethod
    def of(cls, array, start: int = 0, count: int | None = None, dtype=None) -> Window:
        """Elements start..start+count of a flat CuPy array or Window, as *dtype*
        (default: its own; start and count count elements of that dtype)."""
        dtype = array.dtype if dtype is None else dtype
        base = array.ptr if array.__class__ is Window else array.data.ptr
        size = array.nbytes // dtype.itemsize if count is None else count
        return cls(base + start * dtype.itemsize, size, dtype)


def _ptr(x) -> int:
    return x.ptr if x.__class__ is Window else x.data.ptr


class BatchedCopies:
    """Runs :meth:`ArrayBackend.copy_many` on the current (engine) stream."""

    def __init__(self, slots: int = 16):
        self._kernels: dict = {}
        self._lock = threading.Lock()
        self._host = [np.empty(0, np.int64)] * slots  # pinned table slots, reused in turn
        self._memory = [None] * slots
        self._uploaded = [None] * slots  # event after each slot's last upload
        self._next = 0
        #: launches issued (uploads and kernels), for the benchmarks and tests
        self.launches = 0

    def run(self, copies, stream) -> None:
        if not copies:
            return
        groups: dict = {}
        if all(
            c.factor == 1.0 and c.src is not None and c.src.dtype == c.dst.dtype for c in copies
        ):
            groups["bytes"] = copies  # the common case: plain copies, one launch
            copies = ()
        for copy in copies:
            dst, src, factor = copy
            key = (
                "bytes"
                if factor == 1.0 and (src is None or _moves_bytes(src.dtype, dst.dtype))
                else (
                    src.dtype if src is not None else dst.dtype,
                    dst.dtype,
                    dst.dtype
                    if src is None or src.dtype.itemsize > dst.dtype.itemsize
                    else src.dtype,
                )
            )
            groups.setdefault(key, []).append(copy)
        srcs, dsts, counts, factors, launches = [], [], [], [], []
        for key, group in groups.items():
            unit = "nbytes" if key == "bytes" else "size"
            sizes = [getattr(dst, unit) for dst, _, _ in group]
            launches.append((key, len(srcs), len(group), max(sizes)))
            srcs += [0 if src is None else _ptr(src) for _, src, _ in group]
            dsts += [_ptr(dst) for dst, _, _ in group]
            counts += sizes
            factors += [factor for _, _, factor in group]
        self._launch(srcs, dsts, counts, factors, launches, stream)

    def run_bytes(self, srcs, dsts, nbytes, stream) -> None:
        """Plain copies given as device pointers: ``nbytes[i]`` bytes from
        ``srcs[i]`` to ``dsts[i]`` (sequences of ints), in one launch."""
        if len(srcs):
            self._launch(srcs, dsts, nbytes, None, [("bytes", 0, len(srcs), max(nbytes))], stream)

    def _launch(self, srcs, dsts, counts, factors, launches, stream) -> None:
        """Upload the rows (factors None: all 1.0) and run each launch, a
        ``(kernel key, first row, rows, longest count)``."""
        rows = len(srcs)
        slot, host = self._slot(rows)
        table = host[: rows * _ROW].reshape(rows, _ROW)
        table[:, 0], table[:, 1], table[:, 2] = srcs, dsts, counts
        table.view(np.float64)[:, 3] = 1.0 if factors is None else factors
        device_table = cupy.empty(rows * _ROW, np.int64)
        cupy.cuda.runtime.memcpyAsync(
            device_table.data.ptr,
            host.ctypes.data,
            rows * _ROW * 8,
            cupy.cuda.runtime.memcpyHostToDevice,
            stream.ptr,
        )
        self._mark_uploaded(slot, stream)
        for key, first, count, longest in launches:
            kernel = self._kernel(key)
            by = min(count, 65535)
            longest //= 16 if key == "bytes" else 1
            bx = max(1, min(-(-longest // (_THREADS * 4)), max(1, 4096 // by)))
            kernel(
                (bx, by),
                (_THREADS,),
                (device_table[first * _ROW :], np.int32(count)),
                stream=stream,
            )
        self.launches += 1 + len(launches)

    def _slot(self, rows: int) -> tuple[int, np.ndarray]:
        """(slot, its pinned host table of at least *rows* rows, whose last upload is done)."""
        with self._lock:
            slot = self._next
            self._next = (slot + 1) % len(self._host)
        event = self._uploaded[slot]
        if event is not None:
            event.synchronize()  # almost always done long ago
        host = self._host[slot]
        if host.size < rows * _ROW:
            memory = cupy.cuda.alloc_pinned_memory(max(rows, 64) * _ROW * 8)
            host = np.frombuffer(memory, np.int64, max(rows, 64) * _ROW)
            self._host[slot], self._memory[slot] = host, memory
        return slot, host

    def _mark_uploaded(self, slot: int, stream) -> None:
        event = self._uploaded[slot]
        if event is None:
            event = self._uploaded[slot] = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)

    def _kernel(self, key):
        kernel = self._kernels.get(key)
        if kernel is None:
            if key == "bytes":
                module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",))
                kernel = module.get_function("copy_bytes")
            else:
                src, dst, scale = (_C_TYPES[np.dtype(d)] for d in key)
                name = f"copy_scaled<{src}, {dst}, {scale}>"
                module = cupy.RawModule(
                    code=_SOURCE, options=("--std=c++14",), name_expressions=(name,)
                )
                kernel = module.get_function(name)
            self._kernels[key] = kernel
        return kernel
