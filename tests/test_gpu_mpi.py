"""The GPU tests at 2 and 3 ranks sharing one GPU, over the MPI transports.

NCCL refuses two ranks on one GPU, so these runs ask for MPI
(``HVDLITE_GPU_OPERATIONS=MPI``): once staged through pinned host memory
(``HVDLITE_CUDA_AWARE_MPI=0``), once on device pointers where the MPI library
is CUDA-aware.  Skipped with the reason where there is no CUDA device.
"""

import importlib.util
import os
import sys

import pytest

from test_parallel import ROOT, run_mpi

pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    if importlib.util.find_spec("cupy") is None:
        return False
    from hvdlite.device.capabilities import cuda_available

    return cuda_available()


@pytest.mark.skipif(not _gpu(), reason="no CUDA device here (CuPy missing or sees none)")
@pytest.mark.parametrize("aware", ["0", ""], ids=["staged", "mpi-as-detected"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_gpu_suite_over_mpi(ranks, aware):
    env = dict(os.environ, HVDLITE_GPU_OPERATIONS="MPI", HVDLITE_CUDA_AWARE_MPI=aware)
    rc, out = run_mpi(
        ranks,
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(ROOT),
            "-c",
            str(ROOT / "pyproject.toml"),
            str(ROOT / "tests" / "gpu"),
        ],
        env=env,
    )
    assert rc == 0, out[-8000:]
    assert " passed" in out, out[-4000:]
