"""The names of the paths a batch can take.

A name, not a behaviour: the peers that run each path are in
:mod:`hvdlite.engine.transports`; :mod:`hvdlite.device.selection` names the
device paths each process set's knobs and capabilities allow; timelines and
``hvdrun --check-build`` print the values.
"""

from __future__ import annotations

import enum

__all__ = ["Transport"]


class Transport(enum.Enum):
    MPI = "mpi"
    SHARED_MEMORY = "shared memory"
    HIERARCHICAL = "hierarchical"
    ADASUM = "adasum"
    HALF_WIRE = "MPI, 16-bit floats on the wire"
    HALF_TWO_LEVEL = "hierarchical, 16-bit floats across nodes"
    RING = "ring over MPI point-to-point"
    # device buffers (see hvdlite.device.selection)
    NCCL = "NCCL"
    CUDA_AWARE_MPI = "CUDA-aware MPI"
    STAGED = "staged through host memory"
