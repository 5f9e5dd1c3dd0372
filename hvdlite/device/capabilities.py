"""Capability probes for device (GPU) support: what this process can actually do.

Nothing here imports CuPy or touches CUDA unless CuPy is installed and the
caller asked; the CPU data path never calls into this module.  The answers
are truthful: CUDA needs CuPy *and* a visible device, NCCL needs that and the
NCCL library loading through CuPy, CUDA-aware MPI needs the MPI library to say
so (or ``HVDLITE_CUDA_AWARE_MPI=1``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys

__all__ = ["cuda_available", "nccl_version", "cuda_aware_mpi"]


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
    """NCCL's version number as CuPy reports it, or 0 when NCCL cannot be used here
    (no CuPy, no CUDA device, or CuPy without a loadable NCCL)."""
    if not cuda_available():
        return 0
    try:
        from cupy.cuda import nccl

        if not getattr(nccl, "available", True):
            return 0
        return int(nccl.get_version())
    except Exception:  # noqa: BLE001
        return 0


_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}
#: MPIX_GPU_query_support's code for CUDA (MPICH's mpi_proto.h).
_MPICH_GPU_SUPPORT_CUDA = 0


def cuda_aware_mpi(environ=None) -> tuple[bool, str]:
    """Whether MPI may be handed CUDA device pointers, and why.

    ``HVDLITE_CUDA_AWARE_MPI=1`` / ``0`` decides; otherwise the running MPI
    library is asked: the MPI-4.1 info key ``mpi_memory_alloc_kinds`` naming
    ``cuda``, Open MPI's ``MPIX_Query_cuda_support()``, MPICH's
    ``MPIX_GPU_query_support``, MVAPICH2's ``MV2_USE_CUDA=1``.  Needs MPI
    initialized for the library queries (before that, only the variables count).
    """
    environ = os.environ if environ is None else environ
    forced = environ.get("HVDLITE_CUDA_AWARE_MPI", "").strip().lower()
    if forced in _TRUE:
        return True, "HVDLITE_CUDA_AWARE_MPI=1"
    if forced in _FALSE:
        return False, "HVDLITE_CUDA_AWARE_MPI=0"
    if environ.get("MV2_USE_CUDA", "").strip() == "1":
        return True, "MVAPICH2 with MV2_USE_CUDA=1"
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return False, "MPI not initialized: not asked"
    try:
        kinds = mpi.COMM_WORLD.Get_info().Get("mpi_memory_alloc_kinds") or ""
    except Exception:  # noqa: BLE001 - an MPI before 4.1
        kinds = ""
    if "cuda" in kinds.lower():
        return True, f"MPI memory kinds: {kinds}"
    lib = _loaded_libmpi()
    if lib is not None:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is not None:
            try:
                if int(query()) == 1:
                    return True, "Open MPI: MPIX_Query_cuda_support() = 1"
            except Exception:  # noqa: BLE001
                pass
        query = getattr(lib, "MPIX_GPU_query_support", None)
        if query is not None:
            flag = ctypes.c_int(0)
            try:
                if query(_MPICH_GPU_SUPPORT_CUDA, ctypes.byref(flag)) == 0 and flag.value:
                    return True, "MPICH: MPIX_GPU_query_support(CUDA) = 1"
            except Exception:  # noqa: BLE001
                pass
    return False, "the MPI library does not report CUDA support"


def _loaded_libmpi():
    """The MPI library this process has loaded (Linux: from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and ".so" in line}
    except OSError:
        return None
    for path in sorted(paths, key=len):
        name = os.path.basename(path)
        if name.startswith(("libmpi.so", "libmpi_", "libmpich")) or name.startswith("libmpi."):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None
