"""Running hvdrun from tests: as ``python -m hvdlite.runner`` in a clean environment.

The package may not be pip-installed, so ``PYTHONPATH`` points at the repo
root.  Variables that would change what hvdrun does (knobs, a SLURM
allocation, a launcher's rank variables) are removed from the inherited
environment, so the tests behave the same inside a batch job or a shell with
knobs set.  Every run has a hard time limit and kills its process group.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
RANKS = HELPERS / "ranks.py"
_DROP_PREFIXES = ("HVDLITE_", "HOROVOD_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "MPI_LOCAL")


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def hvdrun_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "hvdlite.runner", *args]


@dataclasses.dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(
    cmd: list[str], timeout: float = 90.0, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> Result:
    """Run *cmd* in its own session; on timeout kill the session and fail loudly."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env or clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout:.0f} s: {cmd}\n{out}\n{err}") from None
    return Result(proc.returncode, out, err, time.monotonic() - start)


def hvdrun(*args: str, timeout: float = 90.0, env: dict[str, str] | None = None) -> Result:
    return run(hvdrun_cmd(*args), timeout=timeout, env=env)


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment contains *marker* (zombies excluded)."""
    pids = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            pids.append(int(entry.name))
    return pids


def gone_within(marker: str, seconds: float) -> bool:
    """True when no process carries *marker* within *seconds*; SIGKILLs what is left
    (so a failing test leaves nothing running) and returns False then."""
    deadline = time.monotonic() + seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_with(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    return not left


def cli_launch(argv, **env):
    """hvdrun's plan for *argv* in a minimal environment plus *env* (nothing runs)."""
    from hvdlite.runner import cli

    _args, plan = cli.prepare(argv, {"PATH": "/usr/bin:/bin", **env})
    return plan


def genv(plan):
    """The job's variables of a plan: the values its launcher's environment carries for
    the names the command forwards (MPICH: all of them), as ``Launch.extra_env`` shows."""
    launcher = set(plan.extra_env) - {name for name in plan.extra_env if name.startswith("HYDRA_")}
    return {name: plan.env[name] for name in launcher}
