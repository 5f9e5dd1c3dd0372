"""Print which heavy modules `import hvdlite` loaded (run in a fresh interpreter, no MPI)."""

import sys

import hvdlite  # noqa: F401

heavy = ["torch", "tensorflow", "keras", "jax", "mpi4py.MPI", "cupy"]
print("LOADED:", ",".join(m for m in heavy if m in sys.modules))
try:
    hvdlite.rank()
except ValueError as exc:
    print("BEFORE-INIT:", exc)
