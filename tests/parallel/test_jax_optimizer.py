"""hvdlite.jax.DistributedOptimizer: a data-parallel step equals one process's step
on the combined batch.

Every rank knows the global batch of every step (seeded) and trains on its own
rows; the reference is plain optax on all rows in this process, with no
collective.  Equal rows per rank, mean losses: the average of the ranks'
gradients is the gradient of the combined batch, so parameters must agree to
float tolerance, eagerly and inside jax.jit.
"""

from jax_helpers import quiet_jax

jax = quiet_jax()

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

MPI_SIZES = (1, 2, 3)
MPI_REQUIRES = ("jax", "optax")

pytestmark = pytest.mark.timeout(120)

hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank


def init_params():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {
        "hidden": {"w": jax.random.normal(k1, (5, 8)) * 0.3, "b": jnp.zeros(8)},
        "out": {"w": jax.random.normal(k2, (8, 3)) * 0.3, "b": jnp.zeros(3)},
    }


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def batch(step):
    """The global batch of *step*: B rows per rank (the same on every rank)."""
    rs = np.random.RandomState(100 + step)
    return rs.randn(N * B, 5).astype(np.float32), rs.randn(N * B, 3).astype(np.float32)


def mine(t):
    return t[R * B : (R + 1) * B]


def train(tx, steps, rows, jit):
    params = init_params()
    state = tx.init(params)

    def step(params, state, x, y):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    if jit:
        step = jax.jit(step)
    for s in range(steps):
        x, y = batch(s)
        params, state = step(params, state, rows(x), rows(y))
    return params


def assert_close(a, b, tol=1e-5):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_average_equals_one_process_on_the_combined_batch(jit):
    distributed = train(hvd.DistributedOptimizer(optax.adam(0.05)), 4, mine, jit)
    reference = train(optax.adam(0.05), 4, lambda t: t, jit=False)
    assert_close(distributed, reference)
    # and every rank holds the same parameters
    gathered = hvd.allgather(distributed["out"]["w"][None])
    np.testing.assert_array_equal(np.asarray(gathered), np.repeat(gathered[:1], N, axis=0))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_sum_scales_by_the_number_of_ranks(jit):
    # SGD is linear in the gradient: the sum over ranks is N times the average
    distributed = train(hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Sum), 3, mine, jit)
    reference = train(optax.sgd(0.1 * N), 3, lambda t: t, jit=False)
    assert_close(distributed, reference)


def test_gradient_predivide_factor_keeps_the_average():
    tx = hvd.DistributedOptimizer(optax.sgd(0.1), gradient_predivide_factor=2.0)
    assert_close(train(tx, 2, mine, jit=False), train(optax.sgd(0.1), 2, lambda t: t, False))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_fp16_compression_stays_close(jit):
    tx = hvd.DistributedOptimizer(optax.sgd(0.1), compression=hvd.Compression.fp16)
    reference = train(optax.sgd(0.1), 3, lambda t: t, jit=False)
    assert_close(train(tx, 3, mine, jit), reference, tol=2e-3)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_backward_passes_per_step_applies_the_mean_every_kth_call(jit):
    tx = hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=2)
    reference = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)
    assert_close(train(tx, 4, mine, jit), train(reference, 4, lambda t: t, jit=False))


def test_bad_arguments():
    with pytest.raises(TypeError, match="optax GradientTransformation"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="op must be hvd.Average or hvd.Sum"):
        hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Adasum)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(optax.sgd(0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="needs op=Average"):
        hvd.DistributedOptimizer(optax.sgd(0.1), op=hvd.Sum, gradient_predivide_factor=2.0)
