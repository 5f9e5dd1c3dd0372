"""Run every module in tests/parallel/ under real MPI at the sizes it declares.

Each module names its world sizes in a line ``MPI_SIZES = (1, 2, 3)``; it may
name environment variables its ranks need from their start in a line
``MPI_ENV = {"KERAS_BACKEND": "torch"}`` (what must be set before an import,
e.g. Keras' backend, which a module cannot set once another has imported it), and
the packages it cannot run without in a line ``MPI_REQUIRES = ("jax", "optax")``
(its cases are skipped, saying which is missing, where one is not importable).

Every (module, size) pair is one test here and passes when every rank passed.
Modules of one family (core, torch, tf, jax, Keras on one backend) at one size run
in one launch, ``mpiexec -n size python tests/mpi_modules.py ... -- modules``: one
after another, each in a pytest session of its own, the frameworks imported once
per rank (that import, TensorFlow's above all, was most of a launch's time).  A
module with a line ``MPI_ALONE = True`` gets a launch of its own.  Selecting cases
(``-k test_core_ops``) launches only the selected modules.

Each launch has a hard timeout; on a timeout the whole process group is killed, so
nothing hangs and nothing is left behind.  Inside, each rank's per-test time
limits use pytest-timeout's thread method: a signal is handled only once the main
thread runs Python again, which a rank blocked in C (an MPI call, a TensorFlow
graph waiting on its collective) never does; the thread method prints every
thread's stack and ends the rank, and with it the job.
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
from mpi_modules import MODULE_BEGIN, MODULE_END

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


def run_mpi(n: int, args: list[str], timeout: float = TIMEOUT, env=None, fail_on_timeout=True):
    """Run ``mpiexec -n n args`` in its own process group; kill the group on timeout.

    Returns ``(exit code, output)``; on a timeout the test fails, or, with
    *fail_on_timeout* false, the exit code is None."""
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
        message = f"timed out after {timeout:.0f}s: {' '.join(cmd)}\n{out[-8000:]}"
        if fail_on_timeout:
            pytest.fail(message)
        return None, message
    return proc.returncode, out


#: Module name prefixes and the family whose launch they share; any other module is "core".
_FAMILIES = (
    ("test_keras_jax_", "keras-jax"),
    ("test_keras_torch_", "keras-torch"),
    ("test_tf_", "tf"),
    ("test_torch_", "torch"),
    ("test_lightning", "torch"),
    ("test_jax_", "jax"),
)

#: What every rank's pytest is given, before the module.
_PYTEST_ARGS = (
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
)

#: A launch's time limit for each module in it (TIMEOUT for a launch of one).
_SECONDS_PER_MODULE = 150.0


def _launch_key(module: Path, n: int) -> tuple:
    """Cases with equal keys share one launch."""
    if re.search(r"^MPI_ALONE\s*=\s*True", module.read_text(), re.M):
        family = module.stem
    else:
        family = next((f for prefix, f in _FAMILIES if module.stem.startswith(prefix)), "core")
    return family, tuple(sorted(_declared_env(module).items())), n


def _selected_together(session, key: tuple) -> list[Path]:
    """The modules of this session's selected, runnable cases that share *key*'s launch."""
    modules = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "originalname", None) != "test_module_under_mpi" or not params:
            continue
        module, n = params["module"], params["n"]
        if _missing_requirements(module) or _launch_key(module, n) != key:
            continue
        if module not in modules:
            modules.append(module)
    return modules


def _sections(out: str) -> tuple[dict[str, str], dict[str, int]]:
    """Each module's part of a launch's output, and the exit code each one ended with."""
    sections: dict[str, list[str]] = {}
    ended: dict[str, int] = {}
    current = None
    for line in out.splitlines():
        if line.startswith(MODULE_BEGIN):
            current = line.split()[1]
            sections[current] = []
        elif line.startswith(MODULE_END):
            _, name, code = line.split()
            ended[name] = int(code)
        elif current is not None:
            sections[current].append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}, ended


def _run_together(modules: list[Path], n: int, env: dict) -> dict[str, str | None]:
    """Launch *modules* at *n* ranks; return each one's failure report (None: passed)."""
    names = [m.stem for m in modules]
    timeout = max(TIMEOUT, _SECONDS_PER_MODULE * len(modules))
    rc, out = run_mpi(
        n,
        [sys.executable, str(HERE / "mpi_modules.py"), *_PYTEST_ARGS, "--", *map(str, modules)],
        timeout=timeout,
        env={**os.environ, **env},
        fail_on_timeout=False,
    )
    sections, ended = _sections(out)
    launch = f"(one launch at {n} ranks ran {', '.join(names)}; it exited {rc})"
    reports: dict[str, str | None] = {}
    for name in names:
        text = sections.get(name)
        if text is None:
            before = next((m for m in reversed(names[: names.index(name)]) if m in sections), None)
            why = f"{before} failed before it" if before else "the launch failed"
            reports[name] = f"{name} at {n} ranks did not run: {why} {launch}:\n{out[-8000:]}"
        elif ended.get(name) != 0:
            reports[name] = f"{name} at {n} ranks failed {launch}:\n{text[-8000:]}"
        elif not re.search(r"\d+ passed", text):
            reports[name] = f"{name} at {n} ranks ran no test {launch}:\n{text[-4000:]}"
        else:
            reports[name] = None
    return reports


_REPORTS: dict[tuple, dict[str, str | None]] = {}


@pytest.mark.parametrize("module,n", list(_cases()))
def test_module_under_mpi(module: Path, n: int, request):
    key = _launch_key(module, n)
    if module.stem not in _REPORTS.get(key, {}):
        together = _selected_together(request.session, key)
        if module not in together:
            together = [module]
        _REPORTS.setdefault(key, {}).update(_run_together(together, n, _declared_env(module)))
    report = _REPORTS[key][module.stem]
    assert report is None, report
