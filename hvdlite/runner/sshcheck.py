"""Before a job with other hosts starts: can this machine log in to each of them with ssh?

MPI launchers start their remote daemons through ssh.  When ssh cannot get in
(no route, no sshd, a key that is not accepted, an unknown host key) the
launcher either fails with a wall of its own messages or waits for a prompt
nobody answers, and the job sits there until ``--start-timeout``.  horovodrun
therefore checks every host first; hvdrun does the same, every time (it keeps
no cache, which is what ``--disable-cache`` asks for), with the port and key
the job will use:

    ssh -o BatchMode=yes -o ConnectTimeout=T [-p PORT] [-i FILE] HOST true

for every host that is not this machine, all at once.  ``BatchMode`` turns any
question ssh would ask (a password, an unknown host key) into a failure, which
is what the MPI launcher would get stuck on.  The user's ssh configuration
applies as it does for the launcher.

The check is left out when the ranks are not started through ssh: under
``--launcher srun``, inside a SLURM allocation whose hosts hvdrun took from
SLURM (the MPI starts its daemons through SLURM there), or when the MPI
arguments or environment name another launch agent.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["HostCheckError", "check_hosts", "check_command", "uses_ssh", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = 10  # seconds for ssh's connection; the whole login gets this + _LOGIN_SLACK
_LOGIN_SLACK = 20
_MAX_PARALLEL = 32
# mpiexec arguments and variables that choose how remote daemons start.
_AGENT_ARGS = ("-launcher", "-bootstrap", "-rsh", "plm_rsh_agent", "--launch-agent", "--mca plm ")
_AGENT_VARIABLES = (
    "HYDRA_LAUNCHER",
    "HYDRA_BOOTSTRAP",
    "I_MPI_HYDRA_BOOTSTRAP",
    "OMPI_MCA_plm_rsh_agent",
    "PRTE_MCA_plm_rsh_agent",
    "OMPI_MCA_plm",
    "PRTE_MCA_plm",
)


class HostCheckError(RuntimeError):
    """ssh could not log in to one or more hosts; the message names each with ssh's reason,
    and ``failed`` holds ``(host, reason)`` for each."""

    def __init__(self, message: str, failed: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.failed = list(failed)


def uses_ssh(mpi_args: Sequence[str], environ: Mapping[str, str]) -> bool:
    """False when *mpi_args* or *environ* pick a launch agent (ssh or not) themselves."""
    joined = " ".join(mpi_args)
    if any(arg in joined for arg in _AGENT_ARGS):
        return False
    for name in _AGENT_VARIABLES:
        value = environ.get(name, "").strip()
        if value and not value.startswith("ssh"):
            return False
    return True


def check_command(
    host: str, ssh_args: Sequence[str], ssh: str = "ssh", connect_timeout: int = CONNECT_TIMEOUT
) -> list[str]:
    """The ssh command line that tests the login to *host*."""
    return [
        ssh,
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        *ssh_args,
        host,
        "true",
    ]


def _reason(stderr: str, returncode: int) -> str:
    lines = [
        line.strip()
        for line in stderr.splitlines()
        if line.strip() and not line.lstrip().startswith("Warning: Permanently added")
    ]
    return lines[-1] if lines else f"ssh exited with code {returncode}"


def _try(
    host: str,
    ssh_args: Sequence[str],
    ssh: str,
    connect_timeout: int,
    environ: Mapping[str, str] | None,
) -> str | None:
    """None when the login works, else why not."""
    try:
        proc = subprocess.run(
            check_command(host, ssh_args, ssh, connect_timeout),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            timeout=connect_timeout + _LOGIN_SLACK,
            check=False,
            env=None if environ is None else dict(environ),
        )
    except subprocess.TimeoutExpired:
        return f"no answer within {connect_timeout + _LOGIN_SLACK} s"
    except OSError as exc:
        return f"cannot run {ssh}: {exc.strerror}"
    return None if proc.returncode == 0 else _reason(proc.stderr, proc.returncode)


def check_hosts(
    hosts: Sequence[str],
    ssh_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    connect_timeout: int = CONNECT_TIMEOUT,
) -> None:
    """Log in to every host in *hosts* at once; raise HostCheckError naming each failure."""
    if not hosts:
        return
    path = None if environ is None else environ.get("PATH")
    ssh = shutil.which("ssh", path=path)
    if ssh is None:
        raise HostCheckError(
            f"ssh is not on PATH; it is needed to start ranks on {', '.join(hosts)} "
            "(install an ssh client, or run inside SLURM with hosts from the allocation)"
        )
    workers = min(len(hosts), _MAX_PARALLEL)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        reasons = list(pool.map(lambda h: _try(h, ssh_args, ssh, connect_timeout, environ), hosts))
    failed = [(host, why) for host, why in zip(hosts, reasons) if why is not None]
    if failed:
        shown = " ".join(["ssh", *ssh_args, "HOST", "true"])
        lines = [
            f"cannot log in with ssh to {len(failed)} of {len(hosts)} other host(s); "
            "no rank was started:"
        ]
        lines += [f"  {host}: {why}" for host, why in failed]
        lines.append(
            f"hvdrun needs `{shown}` to work without a password or prompt for "
            "every host (key-based login, known host key; see -p/--ssh-port and "
            "-i/--ssh-identity-file)"
        )
        raise HostCheckError("\n".join(lines), failed)
