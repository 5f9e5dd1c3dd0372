"""Shared set-up of the JAX test modules: JAX imported on one thread per rank (two or
three ranks share this machine's two cores), with two CPU devices so results can be
checked to land on the input's device, and every rank's inputs made reproducibly."""

import os

import numpy as np


def quiet_jax():
    """Import JAX with XLA's CPU client on one thread and two host devices; returns
    ``jax``.  Call it before anything imports JAX."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        f"{flags} --xla_force_host_platform_device_count=2 "
        "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    return jax


def data(rank, shape=(3, 4), dtype=np.float32, seed=0) -> np.ndarray:
    """What rank *rank* contributes, as a numpy array (the same on every rank)."""
    rs = np.random.RandomState(1000 * seed + rank)
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rs.rand(*shape) > 0.5
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rs.randn(*shape).astype(dtype)
    low = 0 if dtype.kind == "u" else -5
    return rs.randint(low, 6, size=shape).astype(dtype)
