"""Which rank am I? Rank, size and local rank from the launcher's environment.

Every launcher tells its processes who they are before MPI starts, each in its
own variables.  This module reads them in order of trust:

1. Open MPI (``mpirun``/``mpiexec``): ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` /
   ``_LOCAL_RANK`` / ``_LOCAL_SIZE``.
2. PMI (MPICH's and Intel MPI's Hydra, ``srun --mpi=pmi2``): ``PMI_RANK`` /
   ``PMI_SIZE``; the local rank from Hydra's ``MPI_LOCALRANKID`` /
   ``MPI_LOCALNRANKS``, else from SLURM's step variables.
3. PMIx (``srun --mpi=pmix``): ``PMIX_RANK`` with SLURM's step variables.
4. A bare ``srun`` step: ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID``
   (only inside a step, i.e. when ``SLURM_STEP_ID`` is set: in the batch
   script itself every process sees ``SLURM_PROCID=0``).

The answer is what the launcher *says*; MPI's communicator stays the truth
once initialized.  The task wrapper uses this to label its reports and to give
each rank torchrun's variables (:func:`torchrun_variables`), and the engine may
use it before ``MPI_Init``.  Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

try:
    from .slurm import expand_tasks_per_node
except ImportError:  # imported as a plain file (by the task wrapper)
    from slurm import expand_tasks_per_node  # type: ignore[no-redef]

__all__ = ["RankEnv", "from_environ", "torchrun_variables"]


@dataclasses.dataclass(frozen=True)
class RankEnv:
    """What the launcher told this process; local fields are None when unknown."""

    rank: int
    size: int
    local_rank: int | None
    local_size: int | None
    source: str  # "openmpi", "pmi", "pmix" or "slurm"


def _int(environ: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _slurm_local(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """Local rank and local size of an ``srun`` step, or (None, None) outside one."""
    if not environ.get("SLURM_STEP_ID") and not environ.get("SLURM_STEPID"):
        return None, None
    local_rank = _int(environ, "SLURM_LOCALID")
    local_size = None
    node = _int(environ, "SLURM_NODEID")
    raw = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if raw and node is not None:
        try:
            counts = expand_tasks_per_node(raw)
            local_size = counts[node] if node < len(counts) else None
        except ValueError:
            local_size = None
    return local_rank, local_size


def from_environ(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """The launcher's view of this process, or None when no launcher set one."""
    env = os.environ if environ is None else environ
    rank = _int(env, "OMPI_COMM_WORLD_RANK")
    size = _int(env, "OMPI_COMM_WORLD_SIZE")
    if rank is not None and size is not None:
        return RankEnv(
            rank,
            size,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
            "openmpi",
        )
    slurm_local = _slurm_local(env)
    rank, size = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
    if rank is not None and size is not None:
        local_rank = _int(env, "MPI_LOCALRANKID")
        local_size = _int(env, "MPI_LOCALNRANKS")
        if local_rank is None or local_size is None:
            local_rank, local_size = slurm_local
        return RankEnv(rank, size, local_rank, local_size, "pmi")
    rank = _int(env, "PMIX_RANK")
    if rank is not None:
        size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "PMIX_SIZE")
        if size is not None:
            return RankEnv(rank, size, slurm_local[0], slurm_local[1], "pmix")
    if slurm_local != (None, None):
        rank = _int(env, "SLURM_PROCID")
        size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
        if rank is not None and size is not None:
            return RankEnv(rank, size, slurm_local[0], slurm_local[1], "slurm")
    return None


def torchrun_variables(who: RankEnv | None) -> dict[str, str]:
    """torchrun's names for what the launcher said: ``RANK``, ``WORLD_SIZE`` and, where
    the launcher told, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``; empty without a launcher.

    Code written for torchrun (``int(os.environ["LOCAL_RANK"])``,
    ``init_process_group("gloo")`` with ``MASTER_ADDR``/``MASTER_PORT`` from
    ``hvdrun --master-port``) then runs under hvdrun unchanged."""
    if who is None:
        return {}
    names = {"RANK": who.rank, "WORLD_SIZE": who.size}
    if who.local_rank is not None and who.local_size is not None:
        names.update(LOCAL_RANK=who.local_rank, LOCAL_WORLD_SIZE=who.local_size)
    return {name: str(value) for name, value in names.items()}
