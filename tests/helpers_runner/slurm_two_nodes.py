"""A throwaway SLURM cluster of two compute nodes, on network-namespace hosts (needs root).

``TwoNodeCluster(workdir, hosts).start()`` runs, on the hosts of a started
:class:`~helpers_runner.netns_hosts.NetnsHosts`:

- ``slurmctld`` on the login host (``h3``), which is also where every client
  command (``sbatch``, ``srun``, ``squeue``, ...) runs (:meth:`client`);
- one ``slurmd`` on each compute node (``h1``, ``h2``), each in its own
  namespace under its own host name, with spool, pid and log files per node.

Everything else (munge, the config's common part, job submission and waiting,
stopping exactly what it started) is :class:`~helpers_runner.slurm_cluster.OneNodeCluster`'s.
SLURM's traffic (controller, daemons, srun's I/O) stays on the hosts' bridge.
"""

from __future__ import annotations

from pathlib import Path

from .netns_hosts import NetnsHosts
from .slurm_cluster import OneNodeCluster, _sbin

__all__ = ["TwoNodeCluster"]

_CTLD_PORT, _SLURMD_PORT = 6817, 6818  # free: the namespaces are the test's own


class TwoNodeCluster(OneNodeCluster):
    """See the module docstring."""

    def __init__(
        self,
        workdir: Path,
        hosts: NetnsHosts,
        login: str = "h3",
        nodes: tuple[str, ...] = ("h1", "h2"),
        cpus: int = 4,
    ) -> None:
        super().__init__(workdir, cpus=cpus)
        self.hosts, self.login, self.nodes = hosts, login, nodes
        self.host = login

    def client(self, argv: list[str]) -> list[str]:
        return self.hosts.wrap(self.login, argv)

    def _site_lines(self) -> list[str]:
        d, login = self.workdir, self.hosts[self.login]
        lines = [
            f"SlurmctldHost={login.name}({login.address})",
            f"SlurmctldPort={_CTLD_PORT}",
            f"SlurmdPort={_SLURMD_PORT}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
        ]
        for name in self.nodes:
            lines.append(
                f"NodeName={name} NodeAddr={self.hosts[name].address} "
                f"CPUs={self.cpus} Boards=1 SocketsPerBoard=1 "
                f"CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory=1000 "
                "State=UNKNOWN"
            )
        return lines

    def _write_conf(self) -> None:
        super()._write_conf()
        for name in self.nodes:
            (self.workdir / "spool" / name).mkdir(parents=True, exist_ok=True)

    def _start_daemons(self) -> None:
        self._daemon(
            "slurmctld",
            self.client([_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)]),
            self.env,
        )
        for name in self.nodes:
            self._daemon(
                f"slurmd-{name}",
                self.hosts.wrap(
                    name, [_sbin("slurmd"), "-D", "-N", name, "-f", str(self.conf)], cgroups=True
                ),
                dict(self.env, PMIX_MCA_psec="native"),
            )
