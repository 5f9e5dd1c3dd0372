"""A throwaway one-node SLURM cluster on this machine, for tests (needs root).

``OneNodeCluster(workdir).start()`` installs nothing; it starts ``munged`` (unless
one already answers), ``slurmctld`` and ``slurmd`` in the foreground as child
processes, with every state, spool, pid and log path under *workdir*, on free
TCP ports, and waits until the node is idle.  ``stop()`` ends exactly the
processes it started (by PID), plus any job process still carrying this
cluster's ``SLURM_CONF`` in its environment.
Clients must run with ``cluster.env`` (it sets ``SLURM_CONF``).

``install()`` puts Debian's packages in place (``apt-get install``, with an
``apt-get update`` only when the first attempt fails) and returns None, or the
reason it could not.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge", "libpmix-dev")
DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol")


def _have_all() -> bool:
    """True when the packages are installed (dpkg says so) and the programs are found."""
    for package in PACKAGES:
        try:
            proc = subprocess.run(
                ["dpkg-query", "-W", "-f=${Status}", package],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except OSError:
            return False
        if "install ok installed" not in proc.stdout:
            return False
    return all(
        shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") for name in DAEMONS
    )


def install(timeout: float = 600.0) -> str | None:
    """Install the packages; None on success, else why not (for a skip reason)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "installing slurm-wlm and munge needs root"
    if _have_all():
        return None
    if shutil.which("apt-get") is None:
        return "apt-get is not available to install slurm-wlm and munge"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install_cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    last = ""
    for attempt in range(2):
        if attempt:
            subprocess.run(
                ["apt-get", "update", "-q"],
                env=env,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        try:
            proc = subprocess.run(
                install_cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return f"apt-get install {' '.join(PACKAGES)} timed out after {timeout:.0f} s"
        if proc.returncode == 0 and _have_all():
            return None
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return f"apt-get install {' '.join(PACKAGES)} failed: {last}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") or name


class OneNodeCluster:
    """See the module docstring."""

    def __init__(self, workdir: Path, cpus: int = 4) -> None:
        self.workdir = Path(workdir)
        self.cpus = cpus
        self.host = socket.gethostname()
        self.conf = self.workdir / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.job_ids: list[str] = []

    # -- setup ---------------------------------------------------------------
    def client(self, argv: list[str]) -> list[str]:
        """*argv* (a SLURM client command) as run where the controller can be reached."""
        return argv

    def _site_lines(self) -> list[str]:
        """Controller, ports, daemon files and nodes: what differs between test clusters."""
        d = self.workdir
        return [
            f"SlurmctldHost={self.host}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} Boards=1 "
            f"SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 "
            "RealMemory=1000 State=UNKNOWN",
        ]

    def _write_conf(self) -> None:
        d = self.workdir
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        lines = [
            "ClusterName=hvdtest",
            # Job ids unique across test runs: MPICH names its shared-memory segments
            # after the PMI job id ("<job>.<step>" under srun), and a segment left by a
            # killed job of an earlier run must never be mistaken for a new job's.
            f"FirstJobId={random.randint(10**6, 6 * 10**7)}",
            *self._site_lines(),
            "SlurmUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SwitchType=switch/none",
            "MpiDefault=pmi2",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "AcctGatherEnergyType=acct_gather_energy/none",
            "MailProg=/bin/true",
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "MinJobAge=600",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _munge_works(self) -> bool:
        try:
            cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
            if cred.returncode:
                return False
            check = subprocess.run(
                ["unmunge"], input=cred.stdout, capture_output=True, timeout=10, check=False
            )
            return check.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _start_munge(self) -> None:
        if self._munge_works():
            return  # someone else's munged answers; use it and leave it alone
        run = Path("/run/munge")
        run.mkdir(parents=True, exist_ok=True)
        shutil.chown(run, "munge", "munge")
        self.procs["munged"] = subprocess.Popen(
            [_sbin("munged"), "--foreground", "--force"],
            user="munge",
            group="munge",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "log" / "munged.log", "wb"),  # noqa: SIM115
            start_new_session=True,
        )
        self._wait(self._munge_works, 15, "munged did not start")

    def _wait(self, check, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if check():
                return
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{what}: {name} exited with {proc.returncode}\n" + self.logs()
                    )
            time.sleep(0.2)
        raise RuntimeError(f"{what} within {seconds:.0f} s\n" + self.logs())

    def _node_idle(self) -> bool:
        """True when every node is idle."""
        proc = subprocess.run(
            self.client(["sinfo", "-h", "-N", "-o", "%T"]),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        states = proc.stdout.split()
        return proc.returncode == 0 and bool(states) and all(s == "idle" for s in states)

    def _daemon(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = self.workdir / "log" / f"{name}.out"
        self.procs[name] = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=open(log, "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _start_daemons(self) -> None:
        self._daemon("slurmctld", [_sbin("slurmctld"), "-D", "-i", "-f", str(self.conf)], self.env)
        self._daemon(
            "slurmd",
            [_sbin("slurmd"), "-D", "-f", str(self.conf)],
            dict(self.env, PMIX_MCA_psec="native"),
        )

    def start(self) -> OneNodeCluster:
        self._write_conf()
        self._start_munge()
        self._start_daemons()
        self._wait(self._node_idle, 30, "the SLURM nodes did not become idle")
        return self

    # -- use -----------------------------------------------------------------
    def sbatch(self, args: list[str], env: dict[str, str] | None = None) -> str:
        """Submit; returns the job id."""
        proc = subprocess.run(
            self.client(["sbatch", "--parsable", *args]),
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if proc.returncode:
            raise RuntimeError(f"sbatch {args} failed: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def job_state(self, job_id: str) -> dict[str, str]:
        proc = subprocess.run(
            self.client(["scontrol", "-o", "show", "job", job_id]),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        fields = {}
        for token in proc.stdout.split():
            key, eq, value = token.partition("=")
            if eq:
                fields[key] = value
        return fields

    def wait_job(self, job_id: str, timeout: float) -> dict[str, str]:
        """Wait until the job has ended; returns its scontrol fields."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = self.job_state(job_id)
            if fields.get("JobState") in (
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT",
                "NODE_FAIL",
                "OUT_OF_MEMORY",
                "BOOT_FAIL",
            ):
                return fields
            time.sleep(0.5)
        subprocess.run(
            self.client(["scancel", job_id]), env=self.env, capture_output=True, check=False
        )
        raise TimeoutError(
            f"job {job_id} still {self.job_state(job_id).get('JobState')} "
            f"after {timeout:.0f} s\n" + self.logs()
        )

    def logs(self) -> str:
        out = []
        for path in sorted((self.workdir / "log").glob("*")):
            text = path.read_text(errors="replace").strip().splitlines()[-15:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    # -- teardown ------------------------------------------------------------
    def _leftovers(self) -> list[int]:
        """PIDs of processes this cluster started (their environment names its config)."""
        needle = f"SLURM_CONF={self.conf}".encode() + b"\0"
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "environ").read_bytes() + b"\0":
                    pids.append(int(entry.name))
            except OSError:
                continue
        return pids

    def stop(self) -> None:
        """Cancel every job, stop the daemons we started, then kill any job process left."""
        if self.procs.get("slurmctld") and self.procs["slurmctld"].poll() is None:
            subprocess.run(
                self.client(["scancel", "--full", "--partition=debug"]),
                env=self.env,
                capture_output=True,
                timeout=20,
                check=False,
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                queue = subprocess.run(
                    self.client(["squeue", "-h", "-o", "%i"]),
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=False,
                )
                if queue.returncode or not queue.stdout.strip():
                    break
                time.sleep(0.3)
        for name in [n for n in self.procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in self._leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
