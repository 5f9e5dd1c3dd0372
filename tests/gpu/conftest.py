"""GPU tests: collected everywhere, run only where CuPy sees a CUDA device.

Every test here is marked ``gpu``; without a device each is skipped with the
reason (no CuPy is imported to find out where CuPy is not installed).  They
run in one process (``make test-gpu``: NCCL at 1 rank) and under mpiexec at 2
ranks sharing one GPU (tests/test_gpu_mpi.py: NCCL refuses that, so the MPI
transports run).  Under mpiexec a failing rank aborts the job, as in
tests/parallel/conftest.py, so nothing hangs.
"""

import importlib.util
import os
import sys

import pytest


def _no_gpu_reason():
    if importlib.util.find_spec("cupy") is None:
        return (
            "no CUDA device here: CuPy is not installed "
            "(pip install hvdlite[cuda12] or hvdlite[cuda13])"
        )
    from hvdlite.device.capabilities import cuda_available

    if not cuda_available():
        return "no CUDA device here: CuPy sees none"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if "tests/gpu/" not in str(item.fspath).replace(os.sep, "/"):
            continue
        item.add_marker(pytest.mark.gpu)
        if not checked:
            reason, checked = _no_gpu_reason(), True
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


_UNDER_MPI = any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _UNDER_MPI:
        sys.stderr.write(
            f"\n[gpu test] FAILED {item.nodeid} ({report.when}):\n{report.longreprtext}\n"
        )
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)
