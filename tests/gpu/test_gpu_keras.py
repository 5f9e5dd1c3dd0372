"""Keras 3 on its torch and JAX backends on a GPU: ``fit`` with hvdlite.keras at 1 rank
(NCCL) and at 2 and 3 ranks sharing the GPU (MPI), each against one process.

Keras fixes its backend when first imported, so each case runs
tests/gpu/keras_fit_check.py in processes of its own; this module starts them
itself and is skipped where the GPU suite already runs under mpiexec
(tests/test_gpu_mpi.py), whose ranks must not start ranks of their own.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
_UNDER_MPI = any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))

_FRAMEWORK = {"torch": "torch", "jax": "jax"}


def _mpiexec() -> str:
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else (shutil.which("mpiexec") or "mpiexec")


@pytest.mark.skipif(_UNDER_MPI, reason="starts its own ranks: runs in the 1-process GPU suite")
@pytest.mark.timeout(400)
@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_keras_fit_on_the_gpu_matches_one_process(backend, ranks):
    if importlib.util.find_spec("keras") is None:
        pytest.skip("Keras is not installed here (pip install keras)")
    if importlib.util.find_spec(_FRAMEWORK[backend]) is None:
        pytest.skip(f"{backend} is not installed here")
    # The repository first, then whatever PYTHONPATH the node's Keras comes from (a
    # module, a container).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=path)
    probe = [sys.executable, "-c", "import keras"]
    found = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    if found.returncode:
        last = (found.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"a subprocess with this PYTHONPATH cannot import Keras: {last}")
    script = [sys.executable, str(HERE / "keras_fit_check.py")]
    if ranks > 1:  # NCCL refuses ranks sharing a GPU: the MPI transports run
        env["HVDLITE_GPU_OPERATIONS"] = "MPI"
        script = [_mpiexec(), "-n", str(ranks), *script]
    done = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert out.count(f"OK {backend} {ranks} ") == ranks, out[-3000:]
