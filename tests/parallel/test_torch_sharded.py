"""DistributedOptimizer(shard_optimizer_state=True): parity with one process on the
concatenated batch, state held for one shard only, consolidated checkpoints loadable by
the plain optimizer and reloadable at any world size, misuse refused."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torch_helpers import N, PAIR, R, batch, make_model, mine

import hvdlite.torch as hvd
from hvdlite.torch.sharded import ShardedOptimizer, balanced_shards

MPI_SIZES = (1, 2, 3)

pytestmark = pytest.mark.timeout(120)


def make_big_model(seed=0):
    """Parameters of uneven sizes (7 of them, prime counts) and one without a gradient."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 13), nn.Tanh(), nn.Linear(13, 7), nn.Linear(7, 3))
    model.unused = nn.Linear(2, 2)  # never in the forward pass: no .grad
    return model


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def adamw_groups(params):
    params = list(params)
    return torch.optim.AdamW(
        [
            {"params": params[:3], "lr": 0.02, "weight_decay": 0.1},
            {"params": params[3:], "lr": 0.005},
        ],
        lr=0.01,
    )


def train(make_opt, steps, sharded, model=None, opt=None, start=0, **kwargs):
    model = model or make_big_model()
    if opt is None:
        opt = make_opt(model.parameters())
        if sharded:
            opt = hvd.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), shard_optimizer_state=True, **kwargs
            )
    for step in range(start, start + steps):
        opt.zero_grad()
        x, y = batch(step)
        if sharded:
            x, y = mine(x), mine(y)
        model_out = model[3](model[2](model[1](model[0](x))))
        F.mse_loss(model_out, y).backward()
        opt.step()
    return model, opt


def same_weights(a, b, tol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("make_opt", [sgd, adam, adamw_groups])
def test_parity_with_one_process_on_the_whole_batch(make_opt):
    ref, _ = train(make_opt, 50, sharded=False)
    got, opt = train(make_opt, 50, sharded=True)
    same_weights(got, ref)
    assert isinstance(opt, ShardedOptimizer) and isinstance(opt, torch.optim.Optimizer)
    assert got.unused.weight.grad is None  # no gradient anywhere: never stepped


def test_each_rank_holds_state_for_its_shard_only():
    model, opt = train(adam, 2, sharded=True)
    params = list(model.parameters())
    owned = {id(params[i]) for i in opt._owned}
    with_state = {id(p) for p in opt.local.state}
    stepped = {id(p) for p in params if p is not model.unused.weight and p is not model.unused.bias}
    assert with_state == owned & stepped
    every = hvd.allgather_object(sorted(opt._owned))
    assert sorted(i for shard in every for i in shard) == list(range(len(params)))
    # ZeRO-2: after the step only this rank's shard kept its gradient
    assert all(p.grad is None for i, p in enumerate(params) if i not in opt._owned)


def test_shards_are_balanced_by_bytes_and_deterministic():
    assert balanced_shards([40, 10, 30, 20], 2) == [[0, 1], [2, 3]]
    assert balanced_shards([5, 5, 5], 3) == [[0], [1], [2]]
    assert balanced_shards([8], 3) == [[0], [], []]
    sizes = [p.numel() * 4 for p in make_big_model().parameters()]
    shards = balanced_shards(sizes, N)
    loads = [sum(sizes[i] for i in s) for s in shards]
    assert max(loads) - min(loads) <= max(sizes)


def test_consolidated_state_loads_into_the_plain_optimizer():
    model, opt = train(adam, 3, sharded=True)
    opt.consolidate_state_dict(to=0)
    if R == 0:
        state = opt.state_dict()
        ref_model, ref_opt = train(adam, 3, sharded=False)
        ref_state = ref_opt.state_dict()
        assert state["param_groups"] == ref_state["param_groups"]
        assert state["state"].keys() == ref_state["state"].keys()
        for k, v in ref_state["state"].items():
            for name in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(state["state"][k][name], v[name], rtol=1e-5, atol=1e-6)
        plain = torch.optim.Adam(model.parameters(), lr=0.01)
        plain.load_state_dict(state)
    else:
        with pytest.raises(RuntimeError, match="consolidate_state_dict"):
            opt.state_dict()


def test_load_state_saved_unsharded_then_continue_like_the_plain_optimizer():
    # a state saved by one process (any world size) reshards here
    ref, ref_opt = train(adam, 2, sharded=False)
    state = copy.deepcopy(ref_opt.state_dict())  # state_dict() shares the live tensors
    weights = {k: v.clone() for k, v in ref.state_dict().items()}
    ref, ref_opt = train(adam, 2, sharded=False, model=ref, opt=ref_opt, start=2)
    model = make_big_model()
    model.load_state_dict(weights)
    opt = hvd.DistributedOptimizer(
        adam(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=True,
    )
    opt.load_state_dict(state)
    train(adam, 2, sharded=True, model=model, opt=opt, start=2)
    same_weights(model, ref)


def test_lr_scheduler_and_predivide_and_fp16():
    ref, ref_opt = make_big_model(), None
    ref_opt = sgd(ref.parameters())
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5)
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), shard_optimizer_state=True, gradient_predivide_factor=2.0
    )
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for step in range(3):
        train(sgd, 1, sharded=False, model=ref, opt=ref_opt, start=step)
        ref_sched.step()
        train(sgd, 1, sharded=True, model=model, opt=opt, start=step)
        sched.step()
    same_weights(model, ref)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    half, _ = train(sgd, 2, sharded=True, compression=hvd.Compression.fp16)
    full, _ = train(sgd, 2, sharded=False)
    same_weights(half, full, tol=1e-2)


def test_broadcast_optimizer_state_and_process_set():
    model, opt = train(adam, 1, sharded=True)
    hvd.broadcast_optimizer_state(opt, root_rank=0)  # collective, and a no-op in effect
    train(adam, 1, sharded=True, model=model, opt=opt, start=1)
    if N >= 3 and R < 2:
        _train_in_pair()
    hvd.barrier()  # the ranks outside the pair wait: none shuts down while it trains


def _train_in_pair():
    """Sharding inside the set of ranks 0 and 1 (batches 2 ranks wide)."""
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), shard_optimizer_state=True, process_set=PAIR
    )
    for step in range(2):
        opt.zero_grad()
        x, y = batch(step, ranks=2)
        x, y = mine(x), mine(y)
        F.mse_loss(model[3](model[2](model[1](model[0](x)))), y).backward()
        opt.step()
    ref2 = make_big_model()
    ref2_opt = sgd(ref2.parameters())
    for step in range(2):
        ref2_opt.zero_grad()
        x, y = batch(step, ranks=2)
        F.mse_loss(ref2[3](ref2[2](ref2[1](ref2[0](x)))), y).backward()
        ref2_opt.step()
    same_weights(model, ref2)


def test_misuse_is_refused_with_the_fix():
    model = make_model()
    for kwargs, match in (
        ({"compression": hvd.Compression.topk(0.1)}, "top-k and PowerSGD"),
        ({"op": hvd.Adasum}, "op=Average or Sum"),
        ({"sparse_as_dense": True}, "drop reducer"),
    ):
        with pytest.raises(ValueError, match=match):
            hvd.DistributedOptimizer(sgd(model.parameters()), shard_optimizer_state=True, **kwargs)
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), shard_optimizer_state=True)
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()


def test_elastic_torch_state_commits_and_restores_a_sharded_optimizer():
    model, opt = train(adam, 2, sharded=True)
    state = hvd.elastic.TorchState(model=model, optimizer=opt, epoch=0)
    state.commit()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    opt.consolidate_state_dict(to=None)
    committed = copy.deepcopy(opt.state_dict())
    train(adam, 2, sharded=True, model=model, opt=opt, start=2)  # then a failure...
    state.restore()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, weights[k])
    opt.consolidate_state_dict(to=None)
    restored = opt.state_dict()
    for k, v in committed["state"].items():
        torch.testing.assert_close(restored["state"][k]["exp_avg"], v["exp_avg"])
    state.sync()  # after a reset: rank 0's state everywhere
    train(adam, 1, sharded=True, model=model, opt=opt, start=2)


def test_backward_passes_per_step_like_the_unsharded_optimizer():
    results = []
    for sharded in (False, True):
        model = make_big_model()
        opt = hvd.DistributedOptimizer(
            sgd(model.parameters()),
            named_parameters=model.named_parameters(),
            backward_passes_per_step=2,
            shard_optimizer_state=sharded,
        )
        for step in range(2):
            opt.zero_grad()
            for micro in range(2):
                x, y = batch(10 * step + micro)
                out = model[3](model[2](model[1](model[0](mine(x)))))
                F.mse_loss(out, mine(y)).backward()
            opt.step()
        results.append(model)
    same_weights(results[1], results[0])


@pytest.mark.parametrize("whole", [True, False], ids=["allreduce-on-one-node", "reducescatter"])
def test_both_gradient_routes_agree_with_one_process(whole):
    ref, _ = train(adam, 3, sharded=False)
    model = make_big_model()
    opt = hvd.DistributedOptimizer(adam(model.parameters()), shard_optimizer_state=True)
    opt._reduce_whole = whole  # the route is the engine's choice; both must agree
    train(adam, 3, sharded=True, model=model, opt=opt)
    same_weights(model, ref)
