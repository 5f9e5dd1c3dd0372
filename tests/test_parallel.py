"""Run every module in tests/parallel/ under real MPI at the sizes it declares.

Each module names its world sizes in a line ``MPI_SIZES = (1, 2, 3)``; it may
name environment variables its ranks need from their start in a line
``MPI_ENV = {"KERAS_BACKEND": "torch"}`` (what must be set before an import,
e.g. Keras' backend, which a module cannot set once another has imported it), and
the packages it cannot run without in a line ``MPI_REQUIRES = ("jax", "optax")``
(its cases are skipped, saying which is missing, where one is not importable).  Every
(module, size) pair is one test here: ``mpiexec -n size python -m pytest
module`` with a hard timeout; the test passes when every rank passed.  On a
timeout the whole process group is killed, so nothing hangs and nothing is left
behind.  Inside, each rank's per-test time limits use pytest-timeout's thread
method: a signal is handled only once the main thread runs Python again, which
a rank blocked in C (an MPI call, a TensorFlow graph waiting on its collective)
never does; the thread method prints every thread's stack and ends the rank,
and with it the job.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARALLEL = HERE / "parallel"
TIMEOUT = float(os.environ.get("HVDLITE_TEST_MPI_TIMEOUT", "240"))


def _declared_sizes(path: Path) -> tuple[int, ...]:
    match = re.search(r"^MPI_SIZES\s*=\s*\(([^)]*)\)", path.read_text(), re.M)
    if not match:
        return (2,)
    return tuple(int(x) for x in match.group(1).replace(",", " ").split())


def _declared_env(path: Path) -> dict[str, str]:
    match = re.search(r"^MPI_ENV\s*=\s*(\{[^}]*\})", path.read_text(), re.M)
    return {str(k): str(v) for k, v in ast.literal_eval(match.group(1)).items()} if match else {}


def _missing_requirements(path: Path) -> list[str]:
    match = re.search(r"^MPI_REQUIRES\s*=\s*\(([^)]*)\)", path.read_text(), re.M)
    names = re.findall(r"[\w.]+", match.group(1)) if match else []
    return [name for name in names if importlib.util.find_spec(name) is None]


def _cases():
    for path in sorted(PARALLEL.glob("test_*.py")):
        missing = _missing_requirements(path)
        marks = (
            [
                pytest.mark.skip(
                    reason=f"{', '.join(missing)} not importable here (pip install hvdlite[all])"
                )
            ]
            if missing
            else []
        )
        for n in _declared_sizes(path):
            yield pytest.param(path, n, id=f"{path.stem}-np{n}", marks=marks)


def mpiexec() -> str:
    """The mpiexec beside this Python (the pip-installed MPICH), else the one on PATH."""
    local = Path(sys.executable).with_name("mpiexec")
    return str(local) if local.exists() else "mpiexec"


def run_mpi(n: int, args: list[str], timeout: float = TIMEOUT, env=None):
    """Run ``mpiexec -n n args`` in its own process group; kill the group on timeout."""
    cmd = [mpiexec(), "-n", str(n), *args]
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("PYTHONPATH", str(ROOT))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout:.0f}s: {' '.join(cmd)}\n{out[-8000:]}")
    return proc.returncode, out


@pytest.mark.parametrize("module,n", list(_cases()))
def test_module_under_mpi(module: Path, n: int):
    rc, out = run_mpi(
        n,
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout_method=thread",
            "--rootdir",
            str(ROOT),
            "-c",
            str(ROOT / "pyproject.toml"),
            str(module),
        ],
        env={**os.environ, **_declared_env(module)},
    )
    passed = re.findall(r"(\d+) passed", out)
    assert rc == 0, f"{module.name} at {n} ranks exited {rc}:\n{out[-8000:]}"
    assert passed, f"{module.name} at {n} ranks ran no test:\n{out[-4000:]}"
