"""shard_optimizer_state=True never changes the weights: parameters without a gradient.

The unsharded DistributedOptimizer follows Horovod's rule: a parameter without a
gradient on a rank counts as zeros there, and one without a gradient on any rank gets
zeros and is stepped (weight decay and momentum move it).  Turning sharding on must
give the same weights, for a parameter unused everywhere, unused on some steps only,
and unused on one rank only; for SGD with momentum, Adam and AdamW with weight decay;
for both ownership models (elements for the known torch classes, whole parameters for
any other) and both gradient routes; with and without ShardedGradScaler (bfloat16
autocast on CPU).  Alone in its set (one rank) the unsharded optimizer is plain torch,
where a parameter without a gradient is not stepped, and so is the sharded one.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import N, R, batch, mine

import hvdlite.torch as hvd

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(120)

STEPS = 6


def make_model(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 13), nn.Tanh(), nn.Linear(13, 7), nn.Linear(7, 3))
    model.unused = nn.Linear(2, 2)  # in no forward pass, on no rank
    model.sometimes = nn.Linear(3, 3)  # on even steps only
    model.not_last = nn.Linear(3, 3)  # on every rank but the last
    return model


def forward(model, x, step):
    h = model[3](model[2](model[1](model[0](x))))
    if step % 2 == 0:
        h = model.sometimes(h)
    if R != N - 1:
        h = h + model.not_last(h)
    return h


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def adamw(params):
    return torch.optim.AdamW(params, lr=0.02, weight_decay=0.05)


def whole_parameters(make_opt):
    """*make_opt* with a subclass of its optimizer: not a known element-wise class, so
    the sharded optimizer owns whole parameters."""

    def make(params):
        opt = make_opt(params)
        opt.__class__ = type(f"My{type(opt).__name__}", (type(opt),), {})
        return opt

    return make


def train(make_opt, sharded, route=None, scaler=False):
    model = make_model()
    opt = hvd.DistributedOptimizer(
        make_opt(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=sharded,
    )
    if route is not None:
        opt._reduce_whole = route == "whole"
    grad_scaler = None
    if scaler:
        kind = hvd.ShardedGradScaler if sharded else torch.amp.GradScaler
        grad_scaler = kind("cpu", init_scale=2.0**10)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step)
        x, y = mine(x), mine(y)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler):
            loss = F.mse_loss(forward(model, x, step).float(), y)
        if grad_scaler is None:
            loss.backward()
            opt.step()
        elif sharded:
            grad_scaler.scale(loss).backward()
            grad_scaler.step(opt)
            grad_scaler.update()
        else:  # Horovod's documented unsharded flow with torch's scaler
            grad_scaler.scale(loss).backward()
            opt.synchronize()
            grad_scaler.unscale_(opt)
            with opt.skip_synchronize():
                grad_scaler.step(opt)
            grad_scaler.update()
    return model, opt


def same_weights(got, ref):
    for (name, p), q in zip(got.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


OPTIMIZERS = pytest.mark.parametrize("make_opt", [sgd, adam, adamw])
OWNERSHIP = pytest.mark.parametrize("ownership", ["elements", "whole-parameters"])


def _maker(make_opt, ownership):
    return make_opt if ownership == "elements" else whole_parameters(make_opt)


@OPTIMIZERS
@OWNERSHIP
@pytest.mark.parametrize("route", ["whole", "reducescatter"])
def test_sharding_gives_the_unsharded_weights(make_opt, ownership, route):
    make = _maker(make_opt, ownership)
    ref, _ = train(make, sharded=False)
    got, opt = train(make, sharded=True, route=route)
    assert opt.ownership == ("elements" if ownership == "elements" else "parameters")
    same_weights(got, ref)


@OPTIMIZERS
@OWNERSHIP
def test_sharding_with_the_grad_scaler_gives_the_unsharded_weights(make_opt, ownership):
    make = _maker(make_opt, ownership)
    ref, _ = train(make, sharded=False, scaler=True)
    got, _ = train(make, sharded=True, scaler=True)
    same_weights(got, ref)


@pytest.mark.skipif(N == 1, reason="alone in its set the optimizer is plain torch")
def test_weight_decay_moves_a_parameter_no_rank_uses_with_and_without_sharding():
    """What the comparisons above rest on: the rule moves the unused weight at all."""
    start = make_model().unused.weight.detach().clone()
    for sharded in (False, True):
        model, _ = train(adamw, sharded=sharded)
        moved = (model.unused.weight.detach() - start).abs().max().item()
        assert moved > 1e-4, (sharded, moved)
