"""One backend per device name, made on first use (CuPy is imported only for "cuda")."""

from __future__ import annotations

import threading

from ..exceptions import ArgumentError
from .arrays import CUDA, HOST
from .backend import ArrayBackend, HostBackend

__all__ = ["backend", "DeviceUnavailable"]

_backends: dict[str, ArrayBackend] = {}
_lock = threading.Lock()


class DeviceUnavailable(ArgumentError):
    """A device array arrived but this process cannot move it (e.g. no CuPy)."""


def backend(device: str) -> ArrayBackend:
    """The backend of *device* ("host" or "cuda"); DeviceUnavailable naming the fix."""
    found = _backends.get(device)
    if found is not None:
        return found
    with _lock:
        found = _backends.get(device)
        if found is None:
            found = _backends[device] = _make(device)
    return found


def _make(device: str) -> ArrayBackend:
    if device == HOST:
        return HostBackend()
    if device == CUDA:
        try:
            from .cuda_backend import CudaBackend
        except ImportError as exc:
            raise DeviceUnavailable(
                f"hvdlite got a CUDA array but cannot move it: CuPy is not usable here ({exc}). "
                "Install it with `pip install hvdlite[cuda12]` (CUDA 12) or "
                "`pip install hvdlite[cuda13]` (CUDA 13), or move the tensor to the CPU first."
            ) from exc
        return CudaBackend()
    raise DeviceUnavailable(f"hvdlite cannot move arrays on device {device!r}; use CPU or CUDA.")
