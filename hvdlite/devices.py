"""Capability probes for device (GPU) support.

Nothing here imports CuPy or touches CUDA unless CuPy is installed and the
caller asked; the CPU data path never calls into this module.
"""

from __future__ import annotations

import importlib.util

__all__ = ["cuda_available", "nccl_version"]


def _cupy():
    if importlib.util.find_spec("cupy") is None:
        return None
    try:
        import cupy
    except Exception:  # noqa: BLE001 - a broken CUDA install means "no CUDA"
        return None
    return cupy


def cuda_available() -> bool:
    """True when CuPy is installed and sees at least one CUDA device."""
    cupy = _cupy()
    if cupy is None:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


def nccl_version() -> int:
    """NCCL's version number as CuPy reports it, or 0 when NCCL is unavailable."""
    cupy = _cupy()
    if cupy is None:
        return 0
    try:
        from cupy.cuda import nccl

        return int(nccl.get_version())
    except Exception:  # noqa: BLE001
        return 0
