"""The device (GPU) data path: device buffers through NCCL, CUDA-aware MPI or staging.

Layers, from the outside in (imports point inward only):

- :mod:`~hvdlite.device.submission` (caller threads): turns a device array
  (``__cuda_array_interface__`` / DLPack: CuPy arrays, torch CUDA tensors) into
  the engine's array for its backend, and records where its producer's stream
  stood, so the engine's stream can wait for it without blocking the host;
- :mod:`~hvdlite.engine.transports.device` (the engine thread): runs a batch of agreed
  device responses: pack into a device fusion buffer, one collective, unpack,
  scale; written once against :class:`~hvdlite.device.backend.ArrayBackend`;
- :mod:`~hvdlite.engine.transports.links`, :mod:`~hvdlite.engine.transports.nccl_link`: the
  collective transports (MPI on device pointers, staging through host memory,
  NCCL, and the two-level composition of them);
- :mod:`~hvdlite.device.backend` (numpy + MPI, the host backend) and
  :mod:`~hvdlite.device.cuda_backend` (CuPy): allocation, copies, scaling,
  stream/event ordering;
- :mod:`~hvdlite.device.selection` and :mod:`~hvdlite.device.capabilities`:
  which transport each process set uses, decided at ``init`` from the knobs and
  from what every rank can do.

Nothing here imports CuPy unless a CUDA array reaches it or CuPy is installed
and ``init`` asks what this process can do; the CPU path never does.
"""

__all__ = ["HostDeviceArray", "device_of", "host_device_array"]


def __getattr__(name: str):
    # Lazily: ``hvdlite.basics`` imports the selection module at import time, and
    # importing hvdlite (e.g. for hvdrun) must not import numpy.
    if name in __all__:
        from . import arrays

        return getattr(arrays, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
