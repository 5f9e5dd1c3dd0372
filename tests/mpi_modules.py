"""Run several tests/parallel modules one after another in one process per rank.

``mpiexec -n N python tests/mpi_modules.py PYTEST_ARGS... -- MODULE...`` (started by
tests/test_parallel.py).  Each module gets a pytest session of its own, as if it
had been launched alone; what the processes keep between modules is what is slow
to make again: the imported frameworks (TensorFlow's import alone takes seconds per
rank), MPI itself, and the interpreter.  Before each module every rank

- shuts hvdlite down (a module's ``hvd.init()`` at import, with its own
  arguments, must be the one that counts);
- restores the environment it started with (modules set knobs before they
  initialize hvdlite);
- forgets the helper modules of tests/parallel (``torch_helpers`` initializes
  hvdlite when it is imported, so it must be imported afresh).

Cross-rank contract: every rank runs the same modules in the same order.  After
each module the ranks agree on the worst exit code; any failure ends the launch
with exit code 1 on every rank, before the next module starts.  (A failing test
usually ends the launch sooner: tests/parallel/conftest.py aborts MPI.)  Rank 0
prints ``MODULE_BEGIN`` and ``MODULE_END`` lines around each module, which
tests/test_parallel.py reads to report each module on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PARALLEL = Path(__file__).resolve().parent / "parallel"
MODULE_BEGIN = "@@hvdlite-mpi-module-begin"
MODULE_END = "@@hvdlite-mpi-module-end"


def _forget_helpers() -> None:
    """Drop tests/parallel's modules (helpers, earlier test modules) but its conftest."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).parent == PARALLEL and Path(path).name != "conftest.py":
            del sys.modules[name]


def _shutdown_hvdlite() -> None:
    import hvdlite

    if hvdlite.is_initialized():
        hvdlite.shutdown()


def _worst_everywhere(code: int) -> int:
    from hvdlite.basics import prepare_mpi_import

    prepare_mpi_import()  # a no-op once a module has started MPI
    from mpi4py import MPI

    return MPI.COMM_WORLD.allreduce(code, op=MPI.MAX)


def main(argv: list[str]) -> int:
    split = argv.index("--")
    pytest_args, modules = argv[:split], argv[split + 1 :]
    environment = dict(os.environ)
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    for module in modules:
        name = Path(module).stem
        if rank == "0":
            print(f"{MODULE_BEGIN} {name}", flush=True)
        code = int(pytest.main([*pytest_args, module]))
        sys.stdout.flush()
        _shutdown_hvdlite()
        os.environ.clear()
        os.environ.update(environment)
        _forget_helpers()
        worst = _worst_everywhere(code)
        if rank == "0":
            print(f"{MODULE_END} {name} {worst}", flush=True)
        if worst != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
