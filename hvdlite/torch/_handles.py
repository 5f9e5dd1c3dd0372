"""Tensor <-> engine-array conversion and torch-aware handles.

The engine moves numpy arrays; this module turns CPU tensors into zero-copy
numpy views (bfloat16 as its int16 bits) after checking them, and attaches to
each engine :class:`hvdlite.handles.Handle` the conversion that turns its
result into torch output (:meth:`~hvdlite.handles.Handle.add_conversion`),
which :func:`synchronize` applies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np
import torch

from hvdlite import handles as _handles
from hvdlite.exceptions import ArgumentError
from hvdlite.torch import _device

__all__ = ["poll", "synchronize"]

# dtypes whose .numpy() view the engine takes as is; bfloat16 is handled here.
_NUMPY_DTYPES = frozenset(
    {
        torch.uint8,
        torch.int8,
        torch.uint16,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.bool,
    }
)
_ACCEPTED = _NUMPY_DTYPES | {torch.bfloat16}
_SUPPORTED = "uint8, int8, uint16, int16, int32, int64, float16, bfloat16, float32, float64, bool"


# --------------------------------------------------------------------------- checks


def _check(tensor, what: str) -> bool:
    """The one validation of a tensor (TypeError, or ArgumentError naming the fix):
    a strided torch.Tensor of a dtype the engine moves, on the CPU or a CUDA
    device.  Returns whether it is on a CUDA device, which the allreduces carry
    on (to the engine too) instead of asking again."""
    if (
        tensor.__class__ is torch.Tensor
        and tensor.is_cpu
        and tensor.layout is torch.strided
        and tensor.dtype in _ACCEPTED
    ):
        return False  # the common case, in a few attribute reads
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"hvdlite.torch.{what}: expected a torch.Tensor, got {type(tensor).__name__}"
        )
    cuda = tensor.device.type != "cpu"
    if cuda:
        _device.check(tensor, what)
    if tensor.layout != torch.strided:
        raise ArgumentError(
            f"hvdlite.torch.{what}: {tensor.layout} tensors are not supported; "
            f"use sparse_allreduce_async for sparse COO tensors"
        )
    if tensor.dtype not in _NUMPY_DTYPES and tensor.dtype != torch.bfloat16:
        raise ArgumentError(
            f"hvdlite.torch.{what}: unsupported dtype {tensor.dtype}; supported: {_SUPPORTED} "
            f"({_cast_hint(tensor.dtype)})"
        )
    return cuda


def _cast_hint(dtype: torch.dtype) -> str:
    """How to get a supported dtype from *dtype*, as a short phrase."""
    if dtype.is_complex:
        return (
            "reduce torch.view_as_real(tensor), which holds the real and imaginary parts "
            "as float, and view the result back with torch.view_as_complex"
        )
    if dtype.is_floating_point:  # float8 kinds and the like
        return "cast it first, e.g. tensor.float() or tensor.to(torch.bfloat16)"
    if str(dtype).startswith(("torch.qint", "torch.quint")):
        return "dequantize it first: tensor.dequantize()"
    if dtype in (torch.uint32, torch.uint64):
        return "cast it first, e.g. tensor.to(torch.int64)"
    return "cast it first, e.g. tensor.float() or tensor.to(torch.int32)"


def _source(tensor, what: str) -> torch.Tensor:
    """A detached, contiguous tensor sharing *tensor*'s memory when it can."""
    _check(tensor, what)
    return _contiguous(tensor)


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    """:func:`_source` of a tensor :func:`_check` has passed."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _target(tensor, what: str) -> torch.Tensor:
    """A detached view of *tensor* for in-place ops, which need it contiguous."""
    _check(tensor, what)
    return _in_place(tensor, what)


def _in_place(tensor: torch.Tensor, what: str) -> torch.Tensor:
    """:func:`_target` of a tensor :func:`_check` has passed."""
    if not tensor.is_contiguous():
        raise ArgumentError(
            f"hvdlite.torch.{what}: in-place ops need a contiguous tensor "
            f"(got strides {tuple(tensor.stride())} for shape "
            f"{tuple(tensor.shape)}); use the out-of-place spelling or "
            f"call .contiguous() first"
        )
    return tensor.detach() if tensor.requires_grad else tensor


def _array(tensor: torch.Tensor) -> np.ndarray:
    """The numpy view of a contiguous CPU tensor (a CUDA tensor: the engine's
    device view of it); bfloat16 as its int16 bits."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    if tensor.is_cpu:
        return tensor.numpy()
    return _device.engine_view(tensor)


def _tensor(array, dtype: torch.dtype) -> torch.Tensor:
    """A torch view of an engine-allocated array, read back as *dtype*'s bits."""
    if _device.is_device_result(array):
        out = _device.to_torch(array)
    else:
        out = torch.from_numpy(np.asarray(array))
    return out.view(torch.bfloat16) if dtype == torch.bfloat16 else out


def _attach(handle: _handles.Handle, convert: Callable) -> _handles.Handle:
    """Make ``synchronize(handle)`` return ``convert(result)``."""
    return handle.add_conversion(convert)


def _named(op: str, name):
    """Horovod's names: an explicit name is qualified by its op, so that e.g.
    ``allreduce(x, name="w")`` and ``broadcast(y, 0, name="w")`` never collide."""
    return None if name is None else f"{op}.{name}"


# ----------------------------------------------------------------------- handles


def poll(handle: Future) -> bool:
    """Whether the collective behind *handle* (from an ``*_async`` op) has
    finished, successfully or not; never blocks.

    Returns:
        True once :func:`synchronize` would return (or raise) without waiting.
    """
    return handle.done()


def synchronize(handle: Future | Callable[[], Any]) -> Any:
    """Wait for *handle* (from an ``*_async`` op) and return its torch output.

    Raises :class:`hvdlite.HorovodInternalError` when the collective failed on
    any rank (mismatched arguments, stall shutdown, shutdown).

    Returns:
        What the op's docstring names: a tensor, a list of tensors or a tuple
        (alltoall); for an in-place op, its input tensor(s) themselves.
    """
    if callable(handle) and not isinstance(handle, Future):
        return handle()  # Horovod's sparse handles were plain callables
    return _handles.synchronize(handle)


class _AllOf(_handles.Handle):
    """Finishes when every part has; waiting on it waits on each part, so a
    caller-driven engine is driven by the wait as for a plain Handle."""

    def __init__(self, parts: Sequence[Future]):
        super().__init__("all_of")
        self._parts = list(parts)
        self._remaining = len(self._parts)
        self._lock = threading.Lock()
        for part in self._parts:
            part.add_done_callback(self._part_done)

    def _part_done(self, _part) -> None:
        with self._lock:
            self._remaining -= 1
            if self._remaining:
                return
        # every part is done here, so asking for their exceptions never waits
        errors = [e for e in (p.exception() for p in self._parts) if e is not None]
        if errors:
            self.set_exception(errors[0])
        else:
            self.set_result(None)

    def result(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        for part in self._parts:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                part.exception(left)
            except FutureTimeout:
                break
        return super().result(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def __call__(self):
        """Wait and return the converted result: Horovod's sparse handles are called
        (``handle()``) rather than synchronized."""
        return self.converted_result()


def _all_of(handles: Sequence[Future], convert: Callable[[], object]) -> _handles.Handle:
    """A handle that finishes when every one of *handles* has; converts via *convert*."""
    return _attach(_AllOf(handles), lambda _result: convert())
