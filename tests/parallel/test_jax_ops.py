"""hvdlite.jax collectives, eagerly, against references computed locally.

Every rank builds every rank's input from a seeded generator, so the expected
result of each collective is computed locally and compared exactly (or to
float tolerance for reductions); results must keep the input's dtype and
device (the module runs with two CPU devices, and inputs go on the second).
"""

from jax_helpers import data, quiet_jax

jax = quiet_jax()

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdlite.jax as hvd  # noqa: E402

MPI_SIZES = (1, 2, 3)
MPI_REQUIRES = ("jax", "optax")

pytestmark = pytest.mark.timeout(120)

# ranks 0 and 1 (the whole world at 1 or 2 ranks)
PAIR = hvd.ProcessSet([0, 1]) if MPI.COMM_WORLD.size > 2 else None
hvd.init(process_sets=[PAIR] if PAIR else None)
R, N = hvd.rank(), hvd.size()
DEV = jax.devices()[1]  # not the default device: results must follow the input
BF16 = np.dtype(jnp.bfloat16)
FLOATS = [np.float32, np.float16, BF16]
INTS = [np.int32, np.uint8, np.int8, np.int16]


def put(array):
    return jax.device_put(array, DEV)


def everyone(**kw):
    return [data(r, **kw) for r in range(N)]


def check(out, expected, dtype, tol=None):
    """*out* is a JAX array on DEV with *dtype* and *expected*'s values."""
    dtype = np.dtype(dtype)
    assert isinstance(out, jax.Array)
    assert out.dtype == dtype and out.shape == expected.shape
    assert out.devices() == {DEV}
    if tol is None:
        tol = {np.dtype(np.float16): 1e-2, BF16: 3e-2}.get(dtype, 1e-5)
    np.testing.assert_allclose(
        np.asarray(out).astype(np.float64),
        np.asarray(expected).astype(np.float64),
        rtol=tol,
        atol=tol,
    )


# ------------------------------------------------------------------ allreduce


@pytest.mark.parametrize("dtype", FLOATS + INTS)
def test_allreduce_sum_every_dtype(dtype):
    out = hvd.allreduce(put(data(R, dtype=dtype)), op=hvd.Sum)
    expected = np.sum([d.astype(np.float64) for d in everyone(dtype=dtype)], axis=0)
    check(out, expected.astype(dtype), dtype)


@pytest.mark.parametrize("dtype", FLOATS)
def test_allreduce_average_scales_and_the_old_spelling(dtype):
    mine = put(data(R, dtype=dtype, seed=1))
    mean = np.mean([d.astype(np.float64) for d in everyone(dtype=dtype, seed=1)], axis=0)
    check(hvd.allreduce(mine), mean, dtype)
    check(hvd.allreduce(mine, average=True), mean, dtype)
    scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    check(scaled, 1.5 * N * mean, dtype)


def test_allreduce_min_max_product_and_bool():
    mine = put(data(R, dtype=np.int32, seed=2))
    stack = np.stack(everyone(dtype=np.int32, seed=2))
    check(hvd.allreduce(mine, op=hvd.Min), stack.min(0), np.int32)
    check(hvd.allreduce(mine, op=hvd.Max), stack.max(0), np.int32)
    check(hvd.allreduce(mine, op=hvd.Product), stack.prod(0), np.int32)
    flags = np.stack(everyone(dtype=np.bool_, seed=3))
    check(hvd.allreduce(put(data(R, dtype=np.bool_, seed=3)), op=hvd.Min), flags.all(0), np.bool_)
    check(hvd.allreduce(put(data(R, dtype=np.bool_, seed=3)), op=hvd.Max), flags.any(0), np.bool_)


def test_allreduce_of_a_pytree_is_one_grouped_submission():
    tree = {
        "w": put(data(R, (4, 3), np.float32)),
        "b": [put(data(R, (3,), BF16)), put(data(R, (2,), np.int32))],
    }
    handle = hvd.allreduce_async(tree, op=hvd.Sum, name="tree")
    assert handle.name == "allreduce.tree"  # one engine entry for every leaf
    out = hvd.synchronize(handle)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(tree)
    check(out["w"], np.sum(everyone(shape=(4, 3)), axis=0), np.float32)
    ref_b = np.sum([d.astype(np.float64) for d in everyone(shape=(3,), dtype=BF16)], axis=0)
    check(out["b"][0], ref_b, BF16)
    check(out["b"][1], np.sum(everyone(shape=(2,), dtype=np.int32), axis=0), np.int32)
    # the blocking spelling, and grouped_allreduce on a list
    again = hvd.allreduce(tree, op=hvd.Sum)
    check(again["w"], np.asarray(out["w"]), np.float32)
    listed = hvd.grouped_allreduce([tree["w"], tree["b"][1]], op=hvd.Max)
    check(listed[1], np.max(everyone(shape=(2,), dtype=np.int32), axis=0), np.int32)


def test_allreduce_fp16_compression():
    mine = put(data(R, (5,), np.float32, seed=4))
    out = hvd.allreduce(mine, compression=hvd.Compression.fp16)
    check(out, np.mean(everyone(shape=(5,), seed=4), axis=0), np.float32, tol=1e-2)


def test_async_handles_in_flight_together():
    handles = [
        hvd.allreduce_async(put(data(R, seed=s)), op=hvd.Sum, name=f"async.{s}") for s in range(3)
    ]
    handles.append(hvd.allgather_async(put(data(R, (2, 2), seed=9))))
    handles.append(hvd.broadcast_async(put(data(R, seed=10)), root_rank=N - 1))
    for s, handle in enumerate(handles[:3]):
        check(hvd.synchronize(handle), np.sum(everyone(seed=s), axis=0), np.float32)
    check(hvd.synchronize(handles[3]), np.concatenate(everyone(shape=(2, 2), seed=9)), np.float32)
    check(hvd.synchronize(handles[4]), data(N - 1, seed=10), np.float32)
    assert all(hvd.poll(h) for h in handles)


# ------------------------------------------------------------ allgather, broadcast


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.float16, np.int32, np.bool_])
def test_allgather_uneven_rows_bit_exact(dtype):
    rows = lambda r: r + 1  # noqa: E731
    out = hvd.allgather(put(data(R, (rows(R), 3), dtype)))
    expected = np.concatenate([data(r, (rows(r), 3), dtype) for r in range(N)])
    check(out, expected, dtype, tol=0)


def test_grouped_allgather_of_a_pytree():
    tree = {"a": put(data(R, (2, 3))), "b": put(data(R, (1,), np.int32))}
    out = hvd.grouped_allgather(tree)
    check(out["a"], np.concatenate(everyone(shape=(2, 3))), np.float32, tol=0)
    check(out["b"], np.concatenate(everyone(shape=(1,), dtype=np.int32)), np.int32, tol=0)


@pytest.mark.parametrize("dtype", [np.float32, BF16, np.int32, np.bool_])
def test_broadcast_from_every_root(dtype):
    for root in range(N):
        out = hvd.broadcast(put(data(R, dtype=dtype, seed=5)), root_rank=root)
        check(out, data(root, dtype=dtype, seed=5), dtype, tol=0)


def test_broadcast_parameters_returns_the_roots_pytree():
    params = {"dense": {"w": put(data(R, (3, 2))), "b": put(data(R, (2,), BF16))}, "step": 7 + R}
    out = hvd.broadcast_parameters(params, root_rank=N - 1)
    check(out["dense"]["w"], data(N - 1, (3, 2)), np.float32, tol=0)
    check(out["dense"]["b"], data(N - 1, (2,), BF16), BF16, tol=0)
    assert int(out["step"]) == 7 + N - 1
    # the input pytree is left as it was (JAX arrays are immutable)
    np.testing.assert_array_equal(np.asarray(params["dense"]["w"]), data(R, (3, 2)))


def test_broadcast_and_allgather_object():
    assert hvd.broadcast_object({"rank": R, "blob": "x" * 3000}, root_rank=0) == {
        "rank": 0,
        "blob": "x" * 3000,
    }
    assert hvd.allgather_object(("r", R)) == [("r", r) for r in range(N)]


# ------------------------------------------------------ alltoall, reducescatter


def test_alltoall_even_and_with_splits():
    mine = put(data(R, (2 * N, 3), np.float32, seed=6))
    out = hvd.alltoall(mine)
    expected = np.concatenate([data(r, (2 * N, 3), seed=6)[2 * R : 2 * R + 2] for r in range(N)])
    check(out, expected, np.float32, tol=0)
    # rank r sends j + 1 rows to rank j
    splits = lambda r: [j + 1 for j in range(N)]  # noqa: E731
    rows = sum(splits(R))
    out, received = hvd.alltoall(put(data(R, (rows, 2), BF16, seed=7)), splits=splits(R))
    starts = np.cumsum([0] + splits(R))
    expected = np.concatenate(
        [data(r, (rows, 2), BF16, seed=7)[starts[R] : starts[R + 1]] for r in range(N)]
    )
    check(out, expected, BF16, tol=0)
    assert received.dtype == np.int32 and list(np.asarray(received)) == [R + 1] * N


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_reducescatter_uneven_rows(op):
    rows = 2 * N + 1
    out = hvd.reducescatter(put(data(R, (rows, 2), seed=8)), op=op)
    total = np.sum(everyone(shape=(rows, 2), seed=8), axis=0)
    if op == hvd.Average:
        total = total / N
    blocks = np.array_split(total, N)
    check(out, blocks[R], np.float32)
    grouped = hvd.grouped_reducescatter([put(data(R, (rows, 2), seed=8))], op=op)
    check(grouped[0], blocks[R], np.float32)


# ------------------------------------------------------------ devices and sets


def test_results_stay_on_the_default_device_too():
    x = jnp.ones(3)  # the default device
    assert hvd.allreduce(x).devices() == x.devices()
    assert hvd.allgather(x).devices() == x.devices()


def test_process_set_members_only():
    if PAIR is None:
        pytest.skip("a proper subset needs 3 ranks")
    if R in (0, 1):
        out = hvd.allreduce(put(data(R)), op=hvd.Sum, process_set=PAIR)
        check(out, data(0) + data(1), np.float32)
    else:
        with pytest.raises(ValueError, match="not a member"):
            hvd.allreduce(put(data(R)), process_set=PAIR)


# ------------------------------------------------------------------- errors


def test_mismatched_shapes_fail_on_every_rank_and_the_engine_goes_on():
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hvd.HorovodInternalError, match="shape"):
        hvd.allreduce(jnp.ones(3 + R), name="mismatch")
    with pytest.raises(hvd.HorovodInternalError, match="dtype"):
        hvd.allreduce(jnp.ones(3, dtype=jnp.float32 if R else jnp.int32), name="mismatch.dtype")
    check(hvd.allreduce(put(jnp.ones(2)), op=hvd.Sum), np.full(2, N), np.float32)


def test_bfloat16_on_one_rank_and_float32_on_another_fail_on_every_rank():
    if N == 1:
        pytest.skip("needs two ranks to disagree")
    # the engine is handed float32 (reductions) or int16 bits (the rest) on both sides
    wide = jnp.bfloat16 if R == 0 else jnp.float32
    with pytest.raises(hvd.HorovodInternalError, match="dtype"):
        hvd.allreduce(jnp.ones(3, dtype=wide), name="mismatch.bf16")
    bits = jnp.bfloat16 if R == 0 else jnp.int16
    with pytest.raises(hvd.HorovodInternalError, match="dtype"):
        hvd.allgather(jnp.ones((1, 2), dtype=bits), name="mismatch.bf16.bits")
    same = hvd.allreduce(jnp.ones(3, dtype=jnp.bfloat16), op=hvd.Sum, name="bf16.agreed")
    assert same.dtype == jnp.bfloat16 and float(same[0]) == N


def test_bad_arguments_raise_on_the_calling_rank():
    with pytest.raises(TypeError, match="expected JAX arrays"):
        hvd.allreduce(["not an array"])
    with pytest.raises(ValueError, match="dtype complex64 is not supported"):
        hvd.allreduce(jnp.ones(2, dtype=jnp.complex64))
    with pytest.raises(ValueError, match="op=Min"):
        hvd.allreduce(jnp.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="both op= and the deprecated average="):
        hvd.allreduce(jnp.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="root_rank 99"):
        hvd.broadcast(jnp.ones(2), root_rank=99)
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.allgather(jnp.float32(1.0))
    with pytest.raises(ValueError, match="splits must be"):
        hvd.alltoall(jnp.ones(N + 1), splits=[1] * N)
    with pytest.raises(ValueError, match="Adasum is not supported"):
        hvd.reducescatter(jnp.ones(N), op=hvd.Adasum)
    with pytest.raises(ValueError, match="empty pytree"):
        hvd.allreduce({})
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("d",))
    sharded = jax.device_put(
        jnp.ones(4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    )
    with pytest.raises(ValueError, match="sharded over 2 devices"):
        hvd.allreduce(sharded)
    # nothing was left in flight: a plain collective still runs
    check(hvd.allreduce(put(jnp.ones(2)), op=hvd.Sum), np.full(2, N), np.float32)
