"""Which device an array lives on, without importing any GPU library.

The engine negotiates a device name per collective (``Params.device``):

- ``"cpu"``: numpy arrays and anything ``np.asarray`` takes (the host path);
- ``"cuda"``: objects exposing ``__cuda_array_interface__`` (CuPy arrays,
  torch CUDA tensors, Numba arrays) or a DLPack device of type CUDA;
- ``"host"``: :class:`HostDeviceArray`, numpy memory that takes the *device*
  path with the host backend (numpy + MPI).  CPU CI runs the device path's
  packing, scaling, ordering and transports through it; a user gains nothing
  from it over plain numpy arrays.

Cross-rank contract: every rank of a process set must pass arrays of the same
device name for a collective; otherwise every rank fails with a mismatch error
naming the devices.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HostDeviceArray", "host_device_array", "device_of", "CPU", "CUDA", "HOST"]

CPU, CUDA, HOST = "cpu", "cuda", "host"

# DLPack device types (dlpack.h): kDLCUDA, kDLCUDAManaged.
_DLPACK_CUDA = frozenset({2, 13})


class HostDeviceArray(np.ndarray):
    """A numpy array that the engine moves on the device path (host backend).

    Make one with :func:`host_device_array`.  Results of collectives on it are
    HostDeviceArrays too.
    """


def host_device_array(array) -> HostDeviceArray:
    """A C-contiguous :class:`HostDeviceArray` view (or copy) of *array*."""
    return np.ascontiguousarray(array).view(HostDeviceArray)


#: Array types whose every instance lives on one device (a CuPy ndarray is always
#: CUDA, a torch tensor is not): learnt on first sight, then found by type alone,
#: which spares building a ``__cuda_array_interface__`` per submission.
_DEVICE_OF_TYPE: dict[type, str] = {np.ndarray: CPU, HostDeviceArray: HOST}


def device_of(x) -> str:
    """The device name of *x*: ``"cpu"``, ``"cuda"`` or ``"host"`` (see the module doc)."""
    known = _DEVICE_OF_TYPE.get(type(x))
    if known is not None:
        return known
    if isinstance(x, np.ndarray):
        return HOST if isinstance(x, HostDeviceArray) else CPU
    if hasattr(x, "__cuda_array_interface__"):  # a torch CPU tensor raises AttributeError
        if type(x).__module__.startswith("cupy"):
            _DEVICE_OF_TYPE[type(x)] = CUDA
        return CUDA
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            kind = int(dlpack_device()[0])
        except Exception:  # noqa: BLE001 - not a usable DLPack producer: treat as host data
            return CPU
        if kind in _DLPACK_CUDA:
            return CUDA
    return CPU
