"""hvdlite.jax inside jax.jit: ordered host callbacks, the same values as eagerly.

Runs with HVDLITE_CHECK_ORDER=1 (set before init): the coordinator compares
the order in which every rank submits its collectives, so a jitted program
whose callbacks ran in another order on some rank fails here, naming both.
The stall inspector shuts a stalled collective down after 60 s, and every
test has a timeout, so a hang fails the run instead of hanging it.
"""

import os

from jax_helpers import data, quiet_jax

os.environ["HVDLITE_CHECK_ORDER"] = "1"
os.environ.setdefault("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", "60")
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
BF16 = np.dtype(jnp.bfloat16)


def everyone(**kw):
    return [data(r, **kw) for r in range(N)]


def same(out, expected, dtype, tol=1e-5):
    assert out.dtype == np.dtype(dtype) and out.shape == expected.shape
    np.testing.assert_allclose(
        np.asarray(out).astype(np.float64), np.asarray(expected).astype(np.float64), rtol=tol,
        atol=tol,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16, np.int32])
def test_allreduce_of_a_pytree_inside_jit(dtype):
    step = jax.jit(lambda t: hvd.allreduce(t, op=hvd.Sum))
    tree = {"a": jnp.asarray(data(R, dtype=dtype)), "b": [jnp.asarray(data(R, (2,), dtype))]}
    tol = {np.dtype(np.float16): 1e-2, BF16: 3e-2}.get(np.dtype(dtype), 1e-5)
    for _ in range(3):  # compiled once, run again: names and order hold across runs
        out = step(tree)
        ref = np.sum([d.astype(np.float64) for d in everyone(dtype=dtype)], axis=0)
        same(out["a"], ref.astype(dtype), dtype, tol)
        same(out["b"][0], np.sum(everyone(shape=(2,), dtype=dtype), axis=0), dtype, tol)


def test_every_collective_inside_jit_matches_eager():
    @jax.jit
    def step(x, flags):
        return (
            hvd.allreduce(x, name="avg"),
            hvd.allreduce(flags, op=hvd.Max),
            hvd.allgather(x),
            hvd.broadcast(x, root_rank=N - 1),
            hvd.alltoall(jnp.tile(x, (N, 1))),
            hvd.reducescatter(jnp.tile(x, (N + 1, 1)), op=hvd.Sum),
            hvd.grouped_allgather([x, x.astype(jnp.bfloat16)]),
        )

    x = jnp.asarray(data(R, (2, 3), seed=1))
    flags = jnp.asarray(data(R, (4,), np.bool_, seed=2))
    traced = step(x, flags)
    eager = step.__wrapped__(x, flags)
    for a, b in zip(jax.tree_util.tree_leaves(traced), jax.tree_util.tree_leaves(eager)):
        same(a, np.asarray(b), b.dtype)
    same(traced[0], np.mean(everyone(shape=(2, 3), seed=1), axis=0), np.float32)
    same(traced[1], np.any(everyone(shape=(4,), dtype=np.bool_, seed=2), axis=0), np.bool_)


def test_independent_collectives_keep_program_order_on_every_rank():
    # No data dependence between the three: only ordered effects keep XLA from
    # running them in another order on some rank (the order check would say so).
    @jax.jit
    def step(a, b, c):
        return hvd.allreduce(c, op=hvd.Sum), hvd.allgather(b), hvd.allreduce(a, op=hvd.Sum)

    a, b, c = jnp.full(2, R + 1.0), jnp.full((1, 3), R), jnp.full(4, 2.0 * R)
    for _ in range(5):
        sum_c, gathered, sum_a = step(a, b, c)
    same(sum_a, np.full(2, N * (N + 1) / 2), np.float32)
    same(sum_c, np.full(4, N * (N - 1)), np.float32)
    assert gathered.shape == (N, 3)


def test_gradient_of_allreduce_is_the_allreduce_of_the_gradient():
    x = jnp.asarray(data(R, (3,), seed=3))
    weights = jnp.arange(1.0, 4.0) * (R + 1)  # a different cotangent on every rank

    def loss(v, op):
        return jnp.sum(hvd.allreduce(v, op=op) * weights)

    mean_weights = np.mean([np.arange(1.0, 4.0) * (r + 1) for r in range(N)], axis=0)
    for op, expected in ((hvd.Average, mean_weights), (hvd.Sum, mean_weights * N)):
        same(jax.jit(jax.grad(loss), static_argnums=1)(x, op), expected, np.float32)
        same(jax.grad(loss)(x, op), expected, np.float32)  # eagerly under grad


def test_distributed_optimizer_inside_jit_equals_eager():
    params = {"w": jnp.ones((3, 2))}
    grads = {"w": jnp.asarray(data(R, (3, 2), seed=4))}
    tx = hvd.DistributedOptimizer(optax.adam(0.1), name="jit.opt")
    state = tx.init(params)
    jit_updates, _ = jax.jit(tx.update)(grads, state, params)
    eager_updates, _ = tx.update(grads, state, params)
    same(jit_updates["w"], np.asarray(eager_updates["w"]), np.float32)


def test_eager_only_functions_refuse_traced_values_naming_the_fix():
    x = jnp.ones(2)
    for fn, fix in (
        (lambda v: hvd.synchronize(hvd.allreduce_async(v)), "blocking form"),
        (lambda v: hvd.broadcast_parameters({"v": v}, 0)["v"], "before the training loop"),
        (lambda v: hvd.broadcast_object(v), "outside the jitted function"),
        (lambda v: hvd.alltoall(v, splits=[2] + [0] * (N - 1))[0], "splits=None"),
    ):
        with pytest.raises(ValueError, match="jax.jit") as info:
            jax.jit(fn)(x)
        assert fix in str(info.value)
    with pytest.raises(ValueError, match="vmap"):  # JAX's own refusal, raised at trace time
        jax.vmap(lambda v: hvd.allreduce(v))(jnp.ones((2, 3)))


def test_a_mismatch_inside_jit_fails_every_rank_and_the_engine_goes_on():
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(Exception, match="shape") as info:  # noqa: B017 - JAX's runtime error
        jax.jit(lambda v: hvd.allreduce(v, name="jit.mismatch"))(
            jnp.ones(2 + R)
        ).block_until_ready()
    assert "hvdlite" in str(info.value) or "allreduce" in str(info.value)
    with pytest.raises(Exception, match="same dim 0"):  # noqa: B017
        jax.jit(hvd.allgather)(jnp.ones((1 + R, 2))).block_until_ready()
    with pytest.raises(Exception, match="same dim 0"):  # noqa: B017
        jax.jit(hvd.alltoall)(jnp.ones((N * (1 + R), 2))).block_until_ready()
    same(jax.jit(lambda v: hvd.allreduce(v, op=hvd.Sum))(jnp.ones(2)), np.full(2, N), np.float32)
