"""Shared set-up of the test modules that run Keras on a backend other than TensorFlow.

Keras fixes its backend when it is first imported, so such a module declares
``MPI_ENV = {"KERAS_BACKEND": ...}`` (tests/test_parallel.py starts its ranks
with it) and calls :func:`keras_on` before anything imports keras: run alone
under pytest, the module still gets its backend; collected after a module
that imported keras on another backend, it fails at once, saying why.
"""

import os


def keras_on(backend: str, stall_shutdown_seconds: int = 90):
    """Import keras on *backend* (one torch or XLA thread per rank: two ranks share
    two cores) and return it; a collective that stalls *stall_shutdown_seconds*
    fails the test instead of hanging it."""
    os.environ.setdefault("KERAS_BACKEND", backend)
    if backend == "jax":  # XLA's CPU client on one thread
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = (
            f"{flags} --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        ).strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", str(stall_shutdown_seconds))
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"this module needs Keras on {backend!r}, but keras was imported on "
            f"{keras.backend.backend()!r} first: run it in its own process "
            f"(tests/test_parallel.py does) with KERAS_BACKEND={backend}"
        )
    if backend == "torch":
        import torch

        torch.set_num_threads(1)
    return keras
