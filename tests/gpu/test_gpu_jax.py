"""JAX GPU arrays on a GPU: eager collectives go through DLPack onto the device path and
return arrays on the input's GPU with the CPU path's values (bfloat16 included); pytrees
and DistributedOptimizer work eagerly and inside jax.jit (where the reduction is a host
callback, so the values cross to the host and back)."""

import os

import numpy as np
import pytest

hvd = None  # hvdlite.jax, imported by the fixture (CPU collection never imports JAX here)


@pytest.fixture(scope="module")
def jax():
    global hvd
    # JAX takes 75 % of the GPU's memory when its backend starts; ranks sharing the GPU
    # (tests/test_gpu_mpi.py) and the torch tests after this module need it to take
    # only what it uses.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip(
        "jax", reason="JAX is not installed here (pip install 'jax[cuda12]' optax)"
    )
    pytest.importorskip("optax", reason="optax is not installed here (pip install optax)")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        gpus = []
    if not gpus:
        pytest.skip("JAX sees no GPU (a CPU build of jaxlib? pip install 'jax[cuda12]')")
    import hvdlite.jax as hvd

    hvd.init()
    yield jax
    hvd.shutdown()


def _gpu(jax):
    return jax.devices("gpu")[hvd.local_rank() % len(jax.devices("gpu"))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_eager_allreduce_stays_on_the_gpu(jax, dtype):
    import jax.numpy as jnp

    gpu = _gpu(jax)
    x = jax.device_put(jnp.full((4, 3), hvd.rank() + 1, dtype=dtype), gpu)
    out = hvd.allreduce(x, op=hvd.Sum)
    assert out.devices() == {gpu} and out.dtype == x.dtype
    n = hvd.size()
    np.testing.assert_allclose(np.asarray(out, dtype=np.float64), n * (n + 1) / 2)


def test_eager_gather_broadcast_and_pytree_on_the_gpu(jax):
    import jax.numpy as jnp

    gpu = _gpu(jax)
    x = jax.device_put(jnp.full((2, 3), float(hvd.rank())), gpu)
    gathered = hvd.allgather(x)
    assert gathered.devices() == {gpu} and gathered.shape == (2 * hvd.size(), 3)
    bits = hvd.broadcast(x.astype(jnp.bfloat16), root_rank=hvd.size() - 1)
    assert bits.devices() == {gpu} and bits.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(bits, dtype=np.float32), hvd.size() - 1)
    tree = hvd.allreduce({"a": x, "b": [x[0]]})
    assert tree["b"][0].devices() == {gpu}
    np.testing.assert_allclose(np.asarray(tree["a"]), (hvd.size() - 1) / 2)


def test_distributed_optimizer_on_the_gpu_eager_and_in_jit(jax):
    import jax.numpy as jnp
    import optax

    gpu = _gpu(jax)
    params = {"w": jax.device_put(jnp.ones(3), gpu)}
    grads = {"w": jax.device_put(jnp.full(3, float(hvd.rank())), gpu)}
    tx = hvd.DistributedOptimizer(optax.sgd(1.0), name="gpu.opt")
    state = tx.init(params)
    eager, _ = tx.update(grads, state, params)
    traced, _ = jax.jit(tx.update)(grads, state, params)
    expected = -(hvd.size() - 1) / 2
    assert eager["w"].devices() == {gpu}
    np.testing.assert_allclose(np.asarray(eager["w"]), expected)
    np.testing.assert_allclose(np.asarray(traced["w"]), expected)
