"""op=Adasum matches the pairwise formula; non-power-of-two sizes are refused.

The reference is computed in the test from every rank's vector (an allgather):
combine(a, b) = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b, applied as a
binary tree over consecutive ranks, the pairing hvdlite.engine.transports.adasum's recursion uses:
at 2 ranks combine(x0, x1); at 4 ranks combine(combine(x0, x1), combine(x2, x3)).
"""

import numpy as np
import pytest
from mpi4py import MPI

import hvdlite
from hvdlite.engine.transports.adasum import adasum_allreduce

MPI_SIZES = (2, 3, 4)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
POWER_OF_TWO = SIZE & (SIZE - 1) == 0
needs_pow2 = pytest.mark.skipif(not POWER_OF_TWO, reason="Adasum needs 2**k ranks")


@pytest.fixture(scope="module", autouse=True)
def hvd():
    hvdlite.init()
    yield hvdlite
    hvdlite.shutdown()


@pytest.fixture(scope="module")
def comm():
    c = WORLD.Dup()
    yield c
    c.Free()


def combine(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, aa, bb = a @ b, a @ a, b @ b
    ca = 1.0 - dot / (2.0 * aa) if aa > 0 else 1.0
    cb = 1.0 - dot / (2.0 * bb) if bb > 0 else 1.0
    return ca * a + cb * b


def tree(vectors):
    level = list(vectors)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def expected(x):
    return tree(WORLD.allgather(np.asarray(x).reshape(-1))).reshape(np.shape(x))


def _vector(n, salt=0, dtype=np.float64):
    rng = np.random.default_rng(97 * RANK + n + salt)
    return rng.standard_normal(n).astype(dtype)


def test_formula_properties():
    x = np.array([1.0, 2.0, -3.0])
    np.testing.assert_allclose(combine(x, x), x)  # identical: kept once
    e1, e2 = np.array([2.0, 0.0]), np.array([0.0, 5.0])
    np.testing.assert_allclose(combine(e1, e2), e1 + e2)  # orthogonal: summed
    np.testing.assert_allclose(combine(np.zeros(3), x), x)  # zero: no contribution


@needs_pow2
def test_engine_algorithm_matches_formula(comm):
    for n in (1, 2, 3, 5, 1001):  # lengths that halve unevenly, and shorter than SIZE
        x = _vector(n)
        np.testing.assert_allclose(adasum_allreduce(comm, x), expected(x), rtol=1e-12, atol=1e-12)


@needs_pow2
def test_special_vectors(comm):
    same = np.linspace(-1.0, 1.0, 9)
    np.testing.assert_allclose(adasum_allreduce(comm, same), same, rtol=1e-12)
    zero_here = np.zeros(6) if RANK == 0 else _vector(6, salt=1)
    np.testing.assert_allclose(
        adasum_allreduce(comm, zero_here), expected(zero_here), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_array_equal(adasum_allreduce(comm, np.zeros(4)), np.zeros(4))
    x = _vector(7, salt=2)
    before = x.copy()
    adasum_allreduce(comm, x)
    np.testing.assert_array_equal(x, before)  # the input is not modified


@needs_pow2
def test_allreduce_op_adasum():
    x = _vector(50, salt=3).reshape(5, 10)
    got = hvdlite.allreduce(x, op=hvdlite.Adasum, name="adasum.f64")
    assert got.shape == x.shape and got.dtype == x.dtype
    np.testing.assert_allclose(got, expected(x), rtol=1e-12, atol=1e-12)
    y = _vector(33, salt=4, dtype=np.float32)
    got = hvdlite.allreduce(y, op=hvdlite.Adasum, name="adasum.f32")
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected(y), rtol=1e-5, atol=1e-6)
    got = hvdlite.allreduce(
        x, op=hvdlite.Adasum, prescale_factor=2.0, postscale_factor=0.25, name="adasum.scaled"
    )
    np.testing.assert_allclose(got, 0.25 * expected(2.0 * x), rtol=1e-12, atol=1e-12)


@needs_pow2
def test_grouped_allreduce_adasum_is_per_tensor():
    tensors = [_vector(n, salt=5) for n in (3, 40, 1)]
    got = hvdlite.grouped_allreduce(tensors, op=hvdlite.Adasum, name="adasum.group")
    for g, t in zip(got, tensors, strict=True):
        np.testing.assert_allclose(g, expected(t), rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(POWER_OF_TWO, reason="checks the refusal at non-power-of-two sizes")
def test_non_power_of_two_is_refused(comm):
    x = _vector(8)
    with pytest.raises(ValueError, match="power-of-two"):
        hvdlite.allreduce(x, op=hvdlite.Adasum, name="adasum.refused")
    with pytest.raises(ValueError, match="power-of-two"):
        hvdlite.grouped_allreduce([x, x], op=hvdlite.Adasum, name="adasum.refused.group")
    with pytest.raises(ValueError, match="power-of-two"):
        adasum_allreduce(comm, x)
    # the engine is still healthy afterwards
    np.testing.assert_allclose(
        hvdlite.allreduce(x, op=hvdlite.Sum, name="after.refusal"),
        sum(WORLD.allgather(x)),
        rtol=1e-12,
    )
