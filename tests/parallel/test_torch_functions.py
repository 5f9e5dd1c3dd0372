"""broadcast_parameters, broadcast_optimizer_state and SyncBatchNorm against local references."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hvdlite.torch as hvd

MPI_SIZES = (2, 3)

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
ROOT = N - 1


def model_on(rank):
    """Every rank starts from different weights (seeded by rank)."""
    torch.manual_seed(rank)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Linear(6, 2))


def assert_equal_state(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


# --------------------------------------------------------- broadcast_parameters


@pytest.mark.parametrize("form", ["state_dict", "named_parameters", "parameters"])
def test_broadcast_parameters(form):
    model = model_on(R)
    model[1].running_mean.add_(R)  # buffers too, with state_dict
    expected = model_on(ROOT)
    expected[1].running_mean.add_(ROOT)
    params = {
        "state_dict": lambda m: m.state_dict(),
        "named_parameters": lambda m: m.named_parameters(),
        "parameters": lambda m: list(m.parameters()),
    }[form](model)
    hvd.broadcast_parameters(params, root_rank=ROOT)
    for (name, p), q in zip(model.named_parameters(), expected.parameters(), strict=True):
        assert torch.equal(p, q), name
    if form == "state_dict":
        assert_equal_state(model.state_dict(), expected.state_dict())


def test_broadcast_parameters_odd_tensors():
    t = torch.full((3, 4), float(R)).t()  # non-contiguous: staged through a copy
    flags = torch.tensor([R % 2 == 0, True])
    bf = torch.full((2,), R + 0.5, dtype=torch.bfloat16)
    hvd.broadcast_parameters({"t": t, "flags": flags, "bf": bf}, root_rank=0)
    assert torch.equal(t, torch.zeros(4, 3))
    assert flags.tolist() == [True, True]
    assert torch.equal(bf, torch.full((2,), 0.5, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(3, root_rank=0)


# --------------------------------------------------- broadcast_optimizer_state


def trained_optimizer(kind, rank, steps):
    model = model_on(rank)
    opt = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1 * (rank + 1), momentum=0.9),
        "adam": lambda p: torch.optim.Adam(p, lr=0.01 * (rank + 1)),
        "lbfgs": lambda p: torch.optim.LBFGS(p, lr=0.5 * (rank + 1), history_size=3),
        "rprop": lambda p: torch.optim.Rprop(p, lr=0.01 * (rank + 1)),
    }[kind](model.parameters())
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)

        def closure(x=x):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            return loss

        opt.step(closure)
    return model, opt


def flatten(state_dict):
    """Comparable form of an optimizer state dict."""
    out = {}
    for pid, st in state_dict["state"].items():
        for k, v in st.items():
            out[(pid, k)] = v.clone() if torch.is_tensor(v) else v
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state_dict["param_groups"]]
    return out, groups


def assert_same_optimizer_state(a, b):
    sa, ga = flatten(a)
    sb, gb = flatten(b)
    assert ga == gb
    assert sa.keys() == sb.keys()
    for k in sa:
        if torch.is_tensor(sa[k]):
            assert torch.equal(sa[k], sb[k]), k
        elif isinstance(sa[k], list):
            assert all(torch.equal(x, y) for x, y in zip(sa[k], sb[k], strict=True)), k
        else:
            assert sa[k] == sb[k], k


def zero_grad_step(model, opt):
    """What Horovod does to an optimizer whose state is empty: a zero .grad on every
    parameter that requires grad, and one local step."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()


@pytest.mark.parametrize("kind", ["sgd", "adam", "lbfgs", "rprop"])
@pytest.mark.parametrize("root_steps,other_steps", [(2, 1), (0, 0), (0, 2), (2, 0)])
def test_broadcast_optimizer_state(kind, root_steps, other_steps):
    _, opt = trained_optimizer(kind, R, root_steps if R == ROOT else other_steps)
    model, expected = trained_optimizer(kind, ROOT, root_steps)
    if root_steps == 0 and kind != "lbfgs":  # L-BFGS steps only with a closure
        zero_grad_step(model, expected)
    hvd.broadcast_optimizer_state(opt, root_rank=ROOT)
    assert_same_optimizer_state(opt.state_dict(), expected.state_dict())


def test_broadcast_optimizer_state_on_empty_state_leaves_zero_grads():
    model = model_on(R)
    frozen = nn.Linear(2, 2)
    frozen.weight.requires_grad_(False)
    frozen.bias.requires_grad_(False)
    params = list(model.parameters())
    opt = torch.optim.Adam([{"params": params}, {"params": frozen.parameters()}], lr=0.01)
    named = list(model.named_parameters()) + [
        (f"frozen.{n}", p) for n, p in frozen.named_parameters()
    ]
    dist = hvd.DistributedOptimizer(opt, named_parameters=named)
    hvd.broadcast_optimizer_state(dist, root_rank=ROOT)
    for p in params:
        assert p.grad is not None and not p.grad.any()
        assert dist.state[p]["step"] == 1  # the state exists on every rank
    assert frozen.weight.grad is None and frozen.bias.grad is None
    for p in params:  # the gradients can now be broadcast as Horovod users do
        hvd.broadcast_(p.grad, root_rank=ROOT)


def test_broadcast_optimizer_state_of_distributed_optimizer_then_train():
    model, opt = trained_optimizer("adam", R, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    dist = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(dist, root_rank=0)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(R))
    dist.zero_grad()
    model(x).pow(2).mean().backward()
    dist.step()
    weights = hvd.allgather_object([p.detach() for p in model.parameters()])
    for other in weights[1:]:
        for a, b in zip(weights[0], other, strict=True):
            assert torch.equal(a, b)


def test_broadcast_object_spellings():
    assert hvd.broadcast_object(R * 10, root_rank=ROOT) == ROOT * 10
    assert hvd.broadcast_object(R * 10) == 0
    assert hvd.allgather_object(R) == list(range(N))


# ------------------------------------------------------------- SyncBatchNorm


def bn_pair(num_features, dims, affine=True, momentum=0.1, track=True):
    bn_cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[dims]
    torch.manual_seed(0)
    ref = bn_cls(num_features, affine=affine, momentum=momentum, track_running_stats=track)
    sync = hvd.SyncBatchNorm(
        num_features, affine=affine, momentum=momentum, track_running_stats=track
    )
    if affine:
        with torch.no_grad():
            ref.weight.uniform_(0.5, 1.5)
            ref.bias.uniform_(-1, 1)
    sync.load_state_dict(ref.state_dict())
    return ref, sync


def rows_of(rank, dims, c, seed):
    """Rank r holds r + 1 samples (a rank may hold an uneven share)."""
    shape = {2: (rank + 1, c), 3: (rank + 1, c, 5), 4: (rank + 1, c, 3, 2)}[dims]
    g = torch.Generator().manual_seed(seed * 10 + rank)
    return torch.randn(shape, generator=g, dtype=torch.float64).float() * 3 + 7


@pytest.mark.parametrize("dims", [2, 3, 4])
@pytest.mark.parametrize("affine,momentum", [(True, 0.1), (False, None)])
def test_sync_batch_norm_equals_batch_norm_on_concatenated_batch(dims, affine, momentum):
    c = 3
    ref, sync = bn_pair(c, dims, affine, momentum)
    for step in range(2):
        parts = [rows_of(r, dims, c, step) for r in range(N)]
        upstream = [
            torch.randn(p.shape, generator=torch.Generator().manual_seed(50 + r))
            for r, p in enumerate(parts)
        ]
        full = torch.cat(parts).requires_grad_()
        out_full = ref(full)
        (out_full * torch.cat(upstream)).sum().backward()
        x = parts[R].clone().requires_grad_()
        y = sync(x)
        (y * upstream[R]).sum().backward()
        start = sum(p.shape[0] for p in parts[:R])
        torch.testing.assert_close(y, out_full[start : start + x.shape[0]], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            x.grad, full.grad[start : start + x.shape[0]], rtol=1e-4, atol=1e-5
        )
        if affine:  # local parameter gradients sum to the full-batch ones
            for p, q in ((sync.weight, ref.weight), (sync.bias, ref.bias)):
                torch.testing.assert_close(
                    hvd.allreduce(p.grad, op=hvd.Sum), q.grad, rtol=1e-4, atol=1e-4
                )
                p.grad = None
                q.grad = None
        torch.testing.assert_close(sync.running_mean, ref.running_mean, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(sync.running_var, ref.running_var, rtol=1e-5, atol=1e-5)
    assert sync.num_batches_tracked.item() == ref.num_batches_tracked.item() == 2
    # eval mode uses the (equal) running statistics: plain BatchNorm
    sync.eval()
    ref.eval()
    probe = rows_of(R, dims, c, 9)
    torch.testing.assert_close(sync(probe), ref(probe), rtol=1e-5, atol=1e-5)


def test_sync_batch_norm_forward_matches():
    ref, sync = bn_pair(4, 4)
    parts = [rows_of(r, 4, 4, 3) for r in range(N)]
    expected = ref(torch.cat(parts))
    start = sum(p.shape[0] for p in parts[:R])
    torch.testing.assert_close(
        sync(parts[R]), expected[start : start + parts[R].shape[0]], rtol=1e-5, atol=1e-5
    )


def test_sync_batch_norm_in_a_model_with_distributed_optimizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), hvd.SyncBatchNorm(4), nn.Linear(4, 1))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    x = torch.randn(R + 2, 3, generator=torch.Generator().manual_seed(R))
    opt.zero_grad()
    F.mse_loss(model(x), torch.zeros(R + 2, 1)).backward()
    opt.step()
    weights = hvd.allgather_object([p.detach() for p in model.parameters()])
    for a, b in zip(weights[0], weights[-1], strict=True):
        assert torch.equal(a, b)


def test_sync_batch_norm_errors():
    with pytest.raises(ValueError, match="2D"):
        hvd.SyncBatchNorm(3)(torch.ones(3))
