"""Single-process tests of the stateful compressors' math (no MPI, no engine).

The exchange between ranks is done by hand here: each simulated rank is its
own compressor object, and the test averages or concatenates what they would
send, exactly as the engine would.
"""

import pytest
import torch

from hvdlite.torch import Compression
from hvdlite.torch.compressors import PowerSGDCompressor, TopKCompressor, topk_count

torch.set_num_threads(1)


def dense_of(values, indices, numel, divisor=1.0):
    return TopKCompressor.scatter(values, indices, divisor, torch.empty(numel))


# ---------------------------------------------------------------------- top-k


@pytest.mark.parametrize(
    "numel,ratio,k",
    [(100, 0.01, 1), (1000, 0.01, 10), (1001, 0.01, 11), (3, 0.01, 1), (5, 1.0, 5), (7, 0.5, 4)],
)
def test_topk_count(numel, ratio, k):
    assert topk_count(numel, ratio) == k


def test_topk_selects_largest_magnitudes_and_keeps_the_rest():
    comp = Compression.topk(0.4)
    grad = torch.tensor([0.1, -5.0, 3.0, 0.2, -0.05])
    before = grad.clone()
    values, indices = comp.select("w", grad)
    assert sorted(indices.tolist()) == [1, 2]
    assert sorted(values.tolist()) == [-5.0, 3.0]
    assert indices.dtype == torch.int64 and values.dtype == torch.float32
    torch.testing.assert_close(comp.residuals["w"], torch.tensor([0.1, 0.0, 0.0, 0.2, -0.05]))
    assert torch.equal(grad, before)  # the gradient itself is not modified


@pytest.mark.parametrize("shape", [(6,), (3, 4), (2, 3, 2)])
def test_topk_round_trip_at_ratio_one(shape):
    comp = TopKCompressor(1.0)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    values, indices = comp.select("w", grad)
    torch.testing.assert_close(dense_of(values, indices, grad.numel()).view(shape), grad)
    assert not comp.residuals["w"].any()


def test_topk_error_feedback_conserves_every_gradient():
    comp = TopKCompressor(0.1)
    gen = torch.Generator().manual_seed(1)
    total_grad, total_sent = torch.zeros(50), torch.zeros(50)
    for _ in range(20):
        grad = torch.randn(50, generator=gen)
        values, indices = comp.select("w", grad)
        assert len(values) == 5
        total_grad += grad
        total_sent += dense_of(values, indices, 50)
    # what was sent plus what is still owed is exactly what was produced
    torch.testing.assert_close(total_sent + comp.residuals["w"], total_grad)


def test_topk_small_entries_are_sent_once_they_accumulate():
    comp = TopKCompressor(0.5)  # 1 of 2 entries per step
    sent = torch.zeros(2)
    for _ in range(12):
        values, indices = comp.select("w", torch.tensor([1.0, 0.3]))
        sent += dense_of(values, indices, 2)
    assert sent[1] > 0  # the small entry went out after its residual grew
    torch.testing.assert_close(sent + comp.residuals["w"], torch.tensor([12.0, 3.6]))


def test_topk_two_ranks_average_and_residuals():
    gen = torch.Generator().manual_seed(2)
    ranks = [TopKCompressor(0.25), TopKCompressor(0.25)]
    grads = [torch.randn(8, generator=gen) for _ in ranks]
    picks = [c.select("w", g) for c, g in zip(ranks, grads)]
    # the allgather: concatenation in rank order; repeated indices must add up
    values = torch.cat([v for v, _ in picks])
    indices = torch.cat([i for _, i in picks])
    averaged = dense_of(values, indices, 8, divisor=2)
    expected = sum(dense_of(v, i, 8) for v, i in picks) / 2
    torch.testing.assert_close(averaged, expected)
    mean_residual = sum(c.residuals["w"] for c in ranks) / 2
    torch.testing.assert_close(averaged + mean_residual, sum(grads) / 2)
    same = dense_of(torch.tensor([1.0, 2.0]), torch.tensor([3, 3]), 5)
    assert same.tolist() == [0.0, 0.0, 0.0, 3.0, 0.0]


def test_topk_keeps_half_precision_residuals_in_float32():
    comp = TopKCompressor(0.5)
    values, _ = comp.select("w", torch.tensor([1.0, 1e-4, -2.0, 3e-4], dtype=torch.float16))
    assert values.dtype == torch.float32 and comp.residuals["w"].dtype == torch.float32


def test_topk_state_dict_round_trip():
    gen = torch.Generator().manual_seed(3)
    a = TopKCompressor(0.2)
    a.select("w", torch.randn(10, generator=gen))
    saved = a.state_dict()
    b = TopKCompressor(0.2)
    b.load_state_dict(saved)
    grad = torch.randn(10, generator=gen)
    va, ia = a.select("w", grad)
    vb, ib = b.select("w", grad)
    assert torch.equal(va, vb) and torch.equal(ia, ib)
    assert not torch.equal(saved["residuals"]["w"], a.residuals["w"])  # a snapshot
    with pytest.raises(ValueError, match="powersgd"):
        TopKCompressor(0.2).load_state_dict(PowerSGDCompressor().state_dict())


def test_argument_errors_and_no_plain_allreduce():
    for bad in (0, -0.1, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="ratio"):
            Compression.topk(bad)
    for kwargs in ({"rank": 0}, {"rank": 2.0}, {"start_step": -1}):
        with pytest.raises(ValueError, match="Compression.powersgd"):
            Compression.powersgd(**kwargs)
    with pytest.raises(TypeError, match="DistributedOptimizer"):
        Compression.topk(0.1).compress(torch.ones(3))
    with pytest.raises(TypeError, match="DistributedOptimizer"):
        Compression.powersgd().decompress(torch.ones(3), None)


# -------------------------------------------------------------------- PowerSGD


@pytest.mark.parametrize(
    "shape,expected",
    [
        ((10,), None),
        ((1024, 784), (1024, 784)),
        ((16, 1, 3, 3), (16, 9)),
        ((3, 3), None),
        ((10, 64), (10, 64)),
        ((8, 8), None),
    ],
)
def test_powersgd_matrix_shape(shape, expected):
    assert PowerSGDCompressor(rank=4).matrix_shape(shape) == expected


def powersgd_round(ranks, grads, name="w"):
    """One PowerSGD step over simulated ranks; the averages are the allreduces."""
    ps = [c.project(name, g) for c, g in zip(ranks, grads)]
    p_avg = sum(ps) / len(ps)
    qs = [c.back_project(name, p_avg.clone()) for c in ranks]
    q_avg = sum(qs) / len(qs)
    approxes = [c.approximate(name, q_avg.clone()) for c in ranks]
    for a in approxes[1:]:
        assert torch.equal(a, approxes[0])  # every rank computes the same result
    return approxes[0]


def test_powersgd_step_is_a_projection_of_the_mean():
    gen = torch.Generator().manual_seed(4)
    ranks = [PowerSGDCompressor(rank=3), PowerSGDCompressor(rank=3)]
    grads = [torch.randn(12, 10, generator=gen, dtype=torch.float64) for _ in ranks]
    approx = powersgd_round(ranks, grads)
    mean = sum(grads) / 2
    # approx = P P^T mean with P the orthonormal basis: approx lies in a 3-d column
    # space, and projecting mean onto that space gives approx back
    u = torch.linalg.svd(approx).U[:, :3]
    torch.testing.assert_close(u @ u.T @ mean, approx)
    assert torch.linalg.matrix_rank(approx) == 3
    for c, g in zip(ranks, grads):  # residual = corrected - approximation, per rank
        torch.testing.assert_close(c.residuals["w"], g - approx)


def test_powersgd_round_trip_of_a_low_rank_mean():
    gen = torch.Generator().manual_seed(5)
    ranks = [PowerSGDCompressor(rank=4) for _ in range(2)]
    u = torch.randn(20, 2, generator=gen, dtype=torch.float64)
    grads = [u @ torch.randn(2, 15, generator=gen, dtype=torch.float64) for _ in ranks]
    approx = powersgd_round(ranks, grads)
    torch.testing.assert_close(approx, sum(grads) / 2)  # rank 2 <= 4: exact


def test_powersgd_error_feedback_conserves_every_gradient():
    comp = PowerSGDCompressor(rank=1)
    gen = torch.Generator().manual_seed(6)
    total_grad, total_sent = torch.zeros(8, 6), torch.zeros(8, 6)
    for _ in range(10):
        grad = torch.randn(8, 6, generator=gen)
        total_sent += powersgd_round([comp], [grad])
        total_grad += grad
    torch.testing.assert_close(total_sent + comp.residuals["w"], total_grad, rtol=1e-5, atol=1e-5)


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation():
    gen = torch.Generator().manual_seed(7)
    u, _ = torch.linalg.qr(torch.randn(30, 30, generator=gen, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(20, 20, generator=gen, dtype=torch.float64))
    s = torch.tensor([2.0**-i for i in range(20)], dtype=torch.float64)
    matrix = u[:, :20] @ torch.diag(s) @ v.T
    best = torch.linalg.norm(s[2:])  # error of the truncated SVD at rank 2
    comp = PowerSGDCompressor(rank=2)
    errors = []
    for _ in range(8):
        comp.residuals.clear()  # isolate the warm start from error feedback
        errors.append(torch.linalg.norm(matrix - powersgd_round([comp], [matrix])).item())
        assert comp.qs["w"].shape == (20, 2)
    assert errors[-1] < errors[0]
    assert errors[-1] == pytest.approx(best.item(), rel=1e-3)


def test_powersgd_initial_q_is_the_same_on_every_rank():
    a, b = PowerSGDCompressor(rank=2, seed=1), PowerSGDCompressor(rank=2, seed=1)
    grad = torch.randn(6, 5)
    assert torch.equal(a.project("layer.weight", grad), b.project("layer.weight", grad))
    other = PowerSGDCompressor(rank=2, seed=1).project("other.weight", grad)
    assert not torch.equal(other, a._pending["layer.weight"][1])


def test_powersgd_state_dict_round_trip():
    gen = torch.Generator().manual_seed(8)
    a = PowerSGDCompressor(rank=2, start_step=0)
    powersgd_round([a], [torch.randn(6, 5, generator=gen)])
    a.steps = 1
    b = PowerSGDCompressor(rank=2, start_step=0)
    b.load_state_dict(a.state_dict())
    assert b.steps == 1
    grad = torch.randn(6, 5, generator=gen)
    assert torch.equal(powersgd_round([a], [grad]), powersgd_round([b], [grad]))
    with pytest.raises(ValueError, match="rank=2"):
        PowerSGDCompressor(rank=4).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="topk"):
        a.load_state_dict(TopKCompressor(0.1).state_dict())


@pytest.mark.parametrize("case", ["normal", "heavy-tailed", "sample-misleads", "small"])
def test_topk_indices_is_exact(case):
    from hvdlite.torch.compressors import topk_indices

    gen = torch.Generator().manual_seed(9)
    n, k = (100_000, 1000) if case != "small" else (500, 7)
    mags = torch.randn(n, generator=gen).abs()
    if case == "heavy-tailed":
        mags = mags**6
    if case == "sample-misleads":  # the strided sample sees only huge entries
        mags[::97] = 1e6 + torch.arange(len(mags[::97]), dtype=torch.float32)
    got = topk_indices(mags, k)
    expected = torch.topk(mags, k).indices
    assert got.numel() == k and set(got.tolist()) == set(expected.tolist())
