"""Device memory: array backends, kernels, packing, fusion buffers, and the registry.

Below the engine, which it imports nothing of (``tools/import_graph.py`` checks
it); the engine's transports (:mod:`hvdlite.engine.transports.device`: NCCL,
CUDA-aware MPI, staging through host memory) move device batches with it.

- :mod:`~hvdlite.device.submission` (caller threads): turns a device array
  (``__cuda_array_interface__`` / DLPack: CuPy arrays, torch CUDA tensors) into
  the engine's array for its backend, and records where its producer's stream
  stood, so the engine's stream can wait for it without blocking the host;
- :mod:`~hvdlite.device.backend` (numpy + MPI, the host backend) and
  :mod:`~hvdlite.device.cuda_backend` (CuPy, with :mod:`~hvdlite.device.cuda_kernels`):
  allocation, copies, scaling, stream/event ordering; :mod:`~hvdlite.device.registry`
  finds the backend of a device;
- :mod:`~hvdlite.device.packing` and :mod:`~hvdlite.device.buffers`: a batch laid
  out in one fusion buffer and back, written once for host and device arrays;
- :mod:`~hvdlite.device.selection` and :mod:`~hvdlite.device.capabilities`:
  which transport each process set's device collectives may use, decided at
  ``init`` from the knobs and from what every rank can do.

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
