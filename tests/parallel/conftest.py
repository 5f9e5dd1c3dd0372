"""pytest plugin for tests that run under mpiexec: one pytest per rank.

Cross-rank contract: every rank collects and runs the same tests in the same
order.  A test that fails on one rank would leave the others waiting in a
collective, so the first failure prints its report and aborts the whole MPI
job (the mpi4py.run model): a failing rank fails the run, it never hangs it.
"""

import os
import sys

import pytest


def pytest_configure(config):
    # Rank-tagged output, and only rank 0 prints the progress line.
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    config._hvdlite_rank = rank


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        rank = item.config._hvdlite_rank
        sys.stderr.write(
            f"\n[rank {rank}] FAILED {item.nodeid} ({report.when}):\n{report.longreprtext}\n"
        )
        sys.stderr.flush()
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(params=["on", "off"])
def overlap(request):
    """For the torch optimizer tests (torch_helpers): hvdlite started again with
    HVDLITE_OVERLAP on or off on every rank.  With a core for some rank's engine
    thread, a DistributedOptimizer's hooks start reductions during backward;
    without, they count passes and synchronize() starts every reduction.  (One
    rank's shutdown() ends every rank's engine, so each rank first waits for the
    others to be done with the last test.)"""
    from mpi4py import MPI
    import hvdlite.torch as hvd
    from torch_helpers import init

    MPI.COMM_WORLD.Barrier()
    hvd.shutdown()
    os.environ["HVDLITE_OVERLAP"] = request.param
    try:
        init()
        yield request.param
    finally:
        del os.environ["HVDLITE_OVERLAP"]
        MPI.COMM_WORLD.Barrier()
        hvd.shutdown()
        init()
