"""Shared by the GPU test modules (not a test module)."""

from __future__ import annotations

from hvdlite.engine.transports.routes import Transport

_LINK_NAMES = {
    Transport.NCCL: "NCCL",
    Transport.CUDA_AWARE_MPI: "CUDA-aware MPI",
    Transport.STAGED: "staged through host memory",
}


def expected_link_names(plan, size: int) -> set[str]:
    """The link names the device executor may report for *plan* at *size* ranks on
    one GPU (NCCL refuses two ranks on one GPU: the set then takes the fallback)."""
    names = set()
    for transport in (
        plan.allreduce,
        plan.allgather,
        plan.broadcast,
        plan.alltoall,
        plan.reducescatter,
    ):
        if transport is Transport.NCCL and size > 1:
            transport = plan.fallback
        names.add(_LINK_NAMES[transport])
    return names
