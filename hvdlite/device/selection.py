"""Which transport device (GPU) collectives take, per process set, decided at ``init``.

Knobs (read once at ``init``; the ``HOROVOD_`` spellings are accepted, the
``HVDLITE_`` ones win):

- ``HVDLITE_GPU_OPERATIONS=NCCL|MPI`` (Horovod: ``HOROVOD_GPU_OPERATIONS``) for
  every collective, and per collective ``HVDLITE_GPU_ALLREDUCE``,
  ``_ALLGATHER``, ``_BROADCAST``, ``_ALLTOALL``, ``_REDUCESCATTER`` (Horovod's
  ``HOROVOD_GPU_ALLREDUCE`` ...), which win over the first;
- ``HVDLITE_CUDA_AWARE_MPI=1|0``: force or deny MPI on device pointers;
- ``HVDLITE_HIERARCHICAL_ALLREDUCE=1``: two-level allreduce for the set of
  every rank when every node has the same number of ranks.

Rules, per collective: asked for MPI, or NCCL is not usable on every rank: MPI
on device pointers where every rank's MPI is CUDA-aware, else staging through
pinned host memory; otherwise (NCCL asked, or nothing asked) NCCL.  Ranks
agree first (:func:`agree`): the knobs must be equal on every rank, and a
capability counts only when every rank has it, so every member of a set
decides alike without further communication.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import NamedTuple

from ..util.paths import Transport

__all__ = [
    "OPERATIONS",
    "Capabilities",
    "DeviceChoice",
    "DeviceRoutes",
    "read_request",
    "local_capabilities",
    "agree",
]

log = logging.getLogger("hvdlite")

#: The device collectives a transport is chosen for, as named in the knobs.
OPERATIONS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
_VALUES = ("NCCL", "MPI")


class Capabilities(NamedTuple):
    """What a process (or, after :func:`agree`, every rank) can use."""

    cuda: bool = False  # CuPy imports and sees a CUDA device
    nccl: bool = False  # NCCL loads through CuPy
    cuda_aware_mpi: bool = False  # MPI takes device pointers
    reason: str = ""  # why cuda_aware_mpi is what it is

    def __and__(self, other: Capabilities) -> Capabilities:
        return Capabilities(
            self.cuda and other.cuda,
            self.nccl and other.nccl,
            self.cuda_aware_mpi and other.cuda_aware_mpi,
            self.reason if self.reason == other.reason else "not on every rank",
        )


class DeviceRoutes(NamedTuple):
    """One process set's device transports."""

    allreduce: Transport
    allgather: Transport
    broadcast: Transport
    alltoall: Transport
    reducescatter: Transport
    fallback: Transport  # the MPI path, where NCCL cannot serve a set after all
    hierarchical: bool = False  # allreduce: NCCL/MPI in the node, MPI across nodes

    def describe(self) -> str:
        """One line for ``hvdrun --check-build`` and logs."""
        paths = {op: getattr(self, op).value for op in OPERATIONS}
        if len(set(paths.values())) == 1:
            text = next(iter(paths.values()))
        else:
            text = ", ".join(f"{op}: {path}" for op, path in paths.items())
        if self.hierarchical:
            text += "; allreduce hierarchical (in the node, then across nodes)"
        return text


class DeviceChoice(NamedTuple):
    """The agreed knobs and capabilities; :meth:`routes` gives a set's routes."""

    capabilities: Capabilities
    request: tuple  # ((operation, "NCCL" | "MPI" | ""), ...)
    hierarchical_allreduce: bool = False
    homogeneous: bool = True

    def routes(self, whole_job: bool = True) -> DeviceRoutes:
        caps = self.capabilities
        fallback = Transport.CUDA_AWARE_MPI if caps.cuda_aware_mpi else Transport.STAGED
        chosen = {}
        for op, asked in self.request:
            chosen[op] = Transport.NCCL if caps.nccl and asked != "MPI" else fallback
        hierarchical = self.hierarchical_allreduce and whole_job and self.homogeneous
        return DeviceRoutes(fallback=fallback, hierarchical=hierarchical, **chosen)


def _env(environ: Mapping[str, str], suffix: str) -> str:
    for prefix in ("HVDLITE_", "HOROVOD_"):
        value = environ.get(prefix + suffix)
        if value is not None and value.strip():
            return value.strip()
    return ""


def read_request(environ: Mapping[str, str] | None = None) -> tuple:
    """The transports asked for by the knobs: ((operation, "NCCL"|"MPI"|""), ...).

    ValueError naming the variable and the valid values for anything else.
    """
    environ = os.environ if environ is None else environ
    every = _env(environ, "GPU_OPERATIONS")
    request = []
    for op in OPERATIONS:
        suffix = f"GPU_{op.upper()}"
        raw = _env(environ, suffix) or every
        value = raw.upper()
        if value and value not in _VALUES:
            name = f"HVDLITE_{suffix}" if _env(environ, suffix) else "HVDLITE_GPU_OPERATIONS"
            raise ValueError(
                f"{name}={raw!r} (or its HOROVOD_ spelling) is not valid: use NCCL "
                "or MPI (hvdlite moves GPU tensors with NCCL, or with MPI on "
                "device pointers or staged through host memory)."
            )
        request.append((op, value))
    return tuple(request)


def local_capabilities(environ: Mapping[str, str] | None = None) -> Capabilities:
    """What this process can use (imports CuPy only where it is installed)."""
    from .capabilities import cuda_available, cuda_aware_mpi, nccl_version

    cuda = cuda_available()
    aware, reason = cuda_aware_mpi(environ)
    return Capabilities(cuda, cuda and nccl_version() > 0, aware, reason)


def agree(
    world, hierarchical_allreduce: bool, homogeneous: bool, environ: Mapping[str, str] | None = None
) -> DeviceChoice:
    """Collective over *world* (every rank, during ``init``): the agreed choice.

    Raises ValueError on every rank alike when a rank's knobs are invalid or
    the ranks' knobs differ.
    """
    error, request = "", ()
    try:
        request = read_request(environ)
    except ValueError as exc:
        error = str(exc)
    caps = local_capabilities(environ)
    everyone = world.allgather((error, request, caps))
    for rank, (err, _, _) in enumerate(everyone):
        if err:
            raise ValueError(f"rank {rank}: {err}")
    requests = {req for _, req, _ in everyone}
    if len(requests) > 1:
        parts = "; ".join(f"rank {r}: {dict(req)}" for r, (_, req, _) in enumerate(everyone))
        raise ValueError(
            "The GPU transport knobs (HVDLITE_GPU_OPERATIONS, HVDLITE_GPU_<OP>) "
            f"differ between ranks ({parts}); start every rank with the same "
            "values (hvdrun passes its environment to every rank)."
        )
    agreed = everyone[0][2]
    for _, _, other in everyone[1:]:
        agreed = agreed & other
    if (
        world.Get_rank() == 0
        and agreed.cuda
        and not agreed.nccl
        and any(asked == "NCCL" for _, asked in request)
    ):
        log.warning(
            "hvdlite: NCCL was asked for GPU collectives but is not usable on every "
            "rank; they run over %s instead.",
            "CUDA-aware MPI" if agreed.cuda_aware_mpi else "MPI staged through host memory",
        )
    return DeviceChoice(agreed, request, hierarchical_allreduce, homogeneous)
