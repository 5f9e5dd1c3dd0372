"""Build the launcher's command line, as an argument list, for each MPI flavour.

Every builder takes a :class:`LaunchSpec` and returns ``list[str]`` that is run
without a shell.  What each one does, in its own launcher's words:

============  ==============  ======================  =============  ==========================
flavour       rank prefix     environment             CPU binding    other
============  ==============  ======================  =============  ==========================
MPICH/Hydra   -prepend-rank   inherited               -bind-to none  -hosts a:2,b:2
Open MPI      --tag-output    -x NAME                 --bind-to none --allow-run-as-root as root;
                                                                     --oversubscribe locally
Intel MPI     -prepend-rank   inherited               I_MPI_PIN=0    -hosts a,b -ppn N
srun          --label         inherited (--export)    --cpu-bind=none --mpi=pmi2|pmix
============  ==============  ======================  =============  ==========================

The job's variables (``LaunchSpec.env``: knobs, ``hvdlite.run(env=...)``) are
never written on the command line, where any local user sees them (``ps``,
``/proc/PID/cmdline``): the caller puts their values in the launcher's own
environment, and the command forwards them by name (Open MPI's ``-x NAME``;
Hydra, Intel MPI and srun pass the whole environment on).

``LaunchSpec.binding`` replaces the "no binding" column.  Network interfaces
and ssh options (for jobs with other hosts), in each launcher's terms:

============  ================================  ========================================
flavour       interfaces                        ssh port / identity file
============  ================================  ========================================
MPICH/Hydra   -iface NIC (one)                  -launcher ssh, HYDRA_LAUNCHER_EXTRA_ARGS
Open MPI      --mca btl_tcp_if_include NICS,    --mca plm_rsh_args "-p N -i FILE"
              --mca oob_tcp_if_include NICS
Intel MPI     -iface NIC (one)                  -bootstrap ssh -bootstrap-exec-args "..."
============  ================================  ========================================

MPICH and Intel MPI pass the whole environment to every rank on every host by
default; Open MPI passes only what ``-x`` names to other hosts, so the Open MPI
builder also forwards the variables a Python job needs (see
:func:`forwarded_names`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from .hosts import Host, format_hosts
from .mpi import MpiInfo

__all__ = [
    "LaunchSpec",
    "mpiexec_command",
    "srun_command",
    "forwarded_names",
    "srun_mpi_plugin",
    "launcher_environment",
]

# Inherited variables Open MPI must be told to forward (names or prefixes).
_FORWARD_NAMES = (
    "PATH",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "CUDA_VISIBLE_DEVICES",
)
_FORWARD_PREFIXES = (
    "HVDLITE_",
    "HOROVOD_",
    "PYTHON",
    "MPI4PY_",
    "NCCL_",
    "OMP_",
    "KMP_",
    "TF_",
    "TORCH_",
    "UCX_",
    "FI_",
    "MPICH_",
    "MPIR_CVAR_",
)


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What to launch, independent of the launcher.

    ``hosts`` is None for "this machine only"; ``env`` holds the variables
    hvdrun sets for every rank (the knobs); ``program`` is the per-rank argv
    (the task wrapper followed by the user's command).  ``binding``, when not
    None, replaces the launcher's "no CPU binding" arguments; ``nics`` are the
    network interfaces to use; ``ssh_args`` go to ssh when there are other hosts.
    """

    np: int
    program: Sequence[str]
    hosts: Sequence[Host] | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mpi_args: Sequence[str] = ()
    forward: Sequence[str] = ()
    binding: Sequence[str] | None = None
    nics: Sequence[str] = ()
    ssh_args: Sequence[str] = ()


def forwarded_names(environ: Mapping[str, str], exclude: Sequence[str] = ()) -> list[str]:
    """Inherited variable names an Open MPI job forwards with ``-x``, sorted."""
    skip = set(exclude)
    return sorted(
        name
        for name in environ
        if name not in skip and (name in _FORWARD_NAMES or name.startswith(_FORWARD_PREFIXES))
    )


def _binding(spec: LaunchSpec, default: Sequence[str]) -> list[str]:
    return list(default if spec.binding is None else spec.binding)


def _mpich(info: MpiInfo, spec: LaunchSpec) -> list[str]:
    cmd = [info.path, "-n", str(spec.np)]
    if spec.hosts:
        cmd += ["-hosts", format_hosts(spec.hosts)]
    cmd += _binding(spec, ["-bind-to", "none"]) + ["-prepend-rank"]
    if spec.nics:
        cmd += ["-iface", spec.nics[0]]
    if spec.hosts and spec.ssh_args:  # the arguments travel in HYDRA_LAUNCHER_EXTRA_ARGS
        cmd += ["-launcher", "ssh"]
    return cmd + list(spec.mpi_args) + list(spec.program)


def _intel(info: MpiInfo, spec: LaunchSpec) -> list[str]:
    common = ["-prepend-rank"] + _binding(spec, ["-genv", "I_MPI_PIN", "0"])
    if spec.nics:
        common += ["-iface", spec.nics[0]]
    if spec.hosts and spec.ssh_args:
        common += ["-bootstrap", "ssh", "-bootstrap-exec-args", " ".join(spec.ssh_args)]
    common += list(spec.mpi_args)
    hosts = list(spec.hosts or ())
    if not hosts:
        return [info.path, "-n", str(spec.np), *common, *spec.program]
    if len({host.slots for host in hosts}) == 1:
        return [
            info.path,
            "-n",
            str(spec.np),
            "-hosts",
            ",".join(h.name for h in hosts),
            "-ppn",
            str(hosts[0].slots),
            *common,
            *spec.program,
        ]
    # Uneven slots: one MPMD section per host, filled in order.
    cmd, left = [info.path, *common], spec.np
    for host in hosts:
        count = min(host.slots, left)
        if count <= 0:
            break
        if left != spec.np:
            cmd.append(":")
        cmd += ["-host", host.name, "-n", str(count), *spec.program]
        left -= count
    return cmd


def _openmpi(info: MpiInfo, spec: LaunchSpec, as_root: bool) -> list[str]:
    cmd = [info.path, "-np", str(spec.np)]
    if as_root:
        cmd.append("--allow-run-as-root")
    if spec.hosts:
        cmd += ["-H", format_hosts(spec.hosts)]
    else:  # this machine only: -np may exceed its cores
        cmd.append("--oversubscribe")
    cmd += _binding(spec, ["--bind-to", "none"]) + ["--tag-output"]
    if spec.nics:
        nics = ",".join(spec.nics)
        cmd += ["--mca", "btl_tcp_if_include", nics, "--mca", "oob_tcp_if_include", nics]
    if spec.hosts and spec.ssh_args:
        cmd += ["--mca", "plm_rsh_args", " ".join(spec.ssh_args)]
    for name in spec.forward:
        if name not in spec.env:
            cmd += ["-x", name]
    for name in spec.env:  # by name: the value is in mpirun's environment
        cmd += ["-x", name]
    return cmd + list(spec.mpi_args) + list(spec.program)


def mpiexec_command(info: MpiInfo, spec: LaunchSpec, as_root: bool | None = None) -> list[str]:
    """The mpiexec command line for *spec* under *info*'s implementation.

    *as_root* defaults to "this process runs as root" (Open MPI refuses root
    without ``--allow-run-as-root``).
    """
    if as_root is None:
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
    if info.flavour == "openmpi":
        return _openmpi(info, spec, as_root)
    if info.flavour == "intel":
        return _intel(info, spec)
    return _mpich(info, spec)


def launcher_environment(info: MpiInfo, spec: LaunchSpec) -> dict[str, str]:
    """Variables the launcher itself needs for *spec* (MPICH's Hydra takes the ssh
    arguments only from ``HYDRA_LAUNCHER_EXTRA_ARGS``, which it splits at spaces)."""
    if info.flavour == "mpich" and spec.hosts and spec.ssh_args:
        return {"HYDRA_LAUNCHER_EXTRA_ARGS": " ".join(spec.ssh_args)}
    return {}


def srun_mpi_plugin(info: MpiInfo | None) -> str:
    """SLURM's PMI plugin for the MPI the ranks use: pmix for Open MPI, else pmi2."""
    return "pmix" if info is not None and info.flavour == "openmpi" else "pmi2"


def srun_command(spec: LaunchSpec, plugin: str, srun: str = "srun") -> list[str]:
    """The ``srun`` command line for *spec*; the knobs travel in srun's environment."""
    cmd = [srun]
    if not any(arg.startswith("--mpi") for arg in spec.mpi_args):
        cmd.append(f"--mpi={plugin}")
    cmd += [
        f"--ntasks={spec.np}",
        "--label",
        *_binding(spec, ["--cpu-bind=none"]),
        "--kill-on-bad-exit=1",
    ]
    if spec.hosts:
        cmd += [
            f"--nodes={len(spec.hosts)}",
            "--nodelist=" + ",".join(host.name for host in spec.hosts),
        ]
    return cmd + list(spec.mpi_args) + list(spec.program)
