"""Top-level test configuration.

Modules in tests/parallel/ run only under mpiexec (tests/test_parallel.py starts
them); a plain ``pytest tests`` must not import them in its own process.
"""

import os

_UNDER_MPI = any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))

collect_ignore_glob = [] if _UNDER_MPI else ["parallel/*"]
