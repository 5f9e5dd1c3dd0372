"""DistributedOptimizer(shard_optimizer_state=True): parity with one process on the
concatenated batch (both ownership models, both gradient routes), state held for one
part only, reduce-scatters started during backward, consolidated checkpoints loadable
by the plain optimizer and reloadable at any world size, misuse refused."""

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

ROUTES = pytest.mark.parametrize(
    "whole", [True, False], ids=["allreduce-on-one-node", "reducescatter"]
)


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


class MySGD(torch.optim.SGD):
    """Not one of the known element-wise classes: sharded by whole parameters."""


def my_sgd(params):
    return MySGD(params, lr=0.1, momentum=0.9)


def train(make_opt, steps, sharded, model=None, opt=None, start=0, whole=None, **kwargs):
    """*whole*: force the gradient route (True: averaged during backward as on one
    node; False: reduce-scattered, started from backward where the model allows)."""
    model = model or make_big_model()
    if opt is None:
        opt = make_opt(model.parameters())
        if sharded:
            opt = hvd.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), shard_optimizer_state=True, **kwargs
            )
            if whole is not None:
                opt._reduce_whole = whole
    for step in range(start, start + steps):
        opt.zero_grad()
        x, y = batch(step)
        if sharded:
            x, y = mine(x), mine(y)
        model_out = model[3](model[2](model[1](model[0](x))))
        F.mse_loss(model_out, y).backward()
        if not sharded and N > 1:  # DistributedOptimizer's rule (Horovod's): none = zeros
            for p in model.parameters():
                if p.requires_grad and p.grad is None:
                    p.grad = torch.zeros_like(p)
        opt.step()
    return model, opt


def same_adam_state(state, ref_state):
    """A consolidated Adam(W) state_dict against the plain optimizer's."""
    assert state["param_groups"] == ref_state["param_groups"]
    assert state["state"].keys() == ref_state["state"].keys()
    for k, v in ref_state["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(state["state"][k][name], v[name], rtol=1e-5, atol=1e-6)


def same_weights(a, b, tol=1e-5):
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)


@pytest.mark.parametrize("make_opt", [sgd, adam, adamw_groups])
def test_parity_with_one_process_on_the_whole_batch(make_opt):
    ref, _ = train(make_opt, 50, sharded=False)
    got, opt = train(make_opt, 50, sharded=True)
    same_weights(got, ref)
    assert isinstance(opt, ShardedOptimizer) and isinstance(opt, torch.optim.Optimizer)
    assert got.unused.weight.grad is None  # ZeRO-2: only the slices had one


def test_each_rank_holds_state_for_its_part_only():
    """Element ownership: each rank's state covers its chunk of each bucket (slices
    sharing the parameters' storage), every element exactly once over the ranks."""
    model, opt = train(adam, 2, sharded=True, whole=False, bucket_cap_mb=0.0003)
    assert opt.ownership == "elements"
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    held = sum(state["exp_avg"].numel() for state in opt.local.state.values())
    unused = model.unused.weight.numel() + model.unused.bias.numel()
    stepped = total if N > 1 else total - unused  # zeros, stepped (alone: plain torch)
    assert sum(hvd.allgather_object(held)) == stepped
    mine = sum(end - first for _, first, end in opt._model.pieces)
    assert sum(hvd.allgather_object(mine)) == total
    assert mine <= total // N + len(opt._model._buckets)  # about P/N
    for (i, first, _), piece in zip(
        opt._model.pieces, [q for g in opt.local.param_groups for q in g["params"]], strict=True
    ):
        assert piece.data_ptr() == params[i].data_ptr() + first * piece.element_size()
    # ZeRO-2: after the step no parameter keeps a whole gradient
    assert all(p.grad is None for p in params)


def test_whole_parameter_ownership_for_other_optimizers():
    """An optimizer class not known to be element-wise: whole parameters, balanced."""
    for whole in (True, False):
        ref, _ = train(my_sgd, 5, sharded=False)
        model, opt = train(my_sgd, 5, sharded=True, whole=whole)
        same_weights(model, ref)
        assert opt.ownership == "parameters" and isinstance(opt.local, MySGD)
        params = list(model.parameters())
        owned = {id(params[i]) for i in opt._owned}
        stepped = {id(p) for p in params if p.grad is not None or id(p) in owned}
        assert {id(p) for p in opt.local.state} <= owned
        every = hvd.allgather_object(sorted(opt._owned))
        assert sorted(i for shard in every for i in shard) == list(range(len(params)))
        # ZeRO-2: after the step only this rank's shard kept its gradient
        assert all(p.grad is None for i, p in enumerate(params) if i not in opt._owned)
        assert stepped


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
        same_adam_state(state, ref_state)
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


@ROUTES
def test_lr_scheduler_and_predivide_and_fp16(whole):
    ref, ref_opt = make_big_model(), None
    ref_opt = sgd(ref.parameters())
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 1, gamma=0.5)
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()), shard_optimizer_state=True, gradient_predivide_factor=2.0
    )
    opt._reduce_whole = whole
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    for step in range(3):
        train(sgd, 1, sharded=False, model=ref, opt=ref_opt, start=step)
        ref_sched.step()
        train(sgd, 1, sharded=True, model=model, opt=opt, start=step)
        sched.step()
    same_weights(model, ref)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    half, _ = train(sgd, 2, sharded=True, whole=whole, compression=hvd.Compression.fp16)
    full, _ = train(sgd, 2, sharded=False)
    same_weights(half, full, tol=1e-2)


def test_broadcast_optimizer_state_and_process_set():
    model, opt = train(adam, 1, sharded=True)
    # Rank 0 loads a whole state of its own (Horovod's `if rank == 0:
    # opt.load_state_dict(...)`): moments and learning rate that no other rank has.
    opt.consolidate_state_dict(to=None)
    root_state = copy.deepcopy(opt.state_dict())
    root_state["param_groups"][0]["lr"] = 0.005
    for entry in root_state["state"].values():
        entry["exp_avg"] *= 2
        entry["exp_avg_sq"] += 1
    if R == 0:
        opt.load_state_dict(root_state)
    else:
        assert opt.param_groups[0]["lr"] == 0.01
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    # Every rank now holds rank 0's state: its hyperparameters and, consolidated
    # from every rank's part, its moments.
    assert opt.param_groups[0]["lr"] == 0.005
    opt.consolidate_state_dict(to=None)
    same_adam_state(opt.state_dict(), root_state)
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


@ROUTES
def test_backward_passes_per_step_like_the_unsharded_optimizer(whole):
    results = []
    for sharded in (False, True):
        model = make_big_model()
        opt = hvd.DistributedOptimizer(
            sgd(model.parameters()),
            named_parameters=model.named_parameters(),
            backward_passes_per_step=2,
            shard_optimizer_state=sharded,
        )
        if sharded:
            opt._reduce_whole = whole
        for step in range(2):
            opt.zero_grad()
            for micro in range(2):
                x, y = batch(10 * step + micro)
                out = model[3](model[2](model[1](model[0](mine(x)))))
                F.mse_loss(out, mine(y)).backward()
            opt.step()
        results.append(model)
    same_weights(results[1], results[0])


@ROUTES
def test_both_gradient_routes_agree_with_one_process(whole):
    ref, _ = train(adam, 3, sharded=False)
    model, opt = train(adam, 3, sharded=True, whole=whole)
    assert opt._reduce_whole is whole
    same_weights(model, ref)


def test_reduce_scatters_start_during_backward():
    """The reduce-scatter route: each bucket's reduce-scatter is in flight once
    backward returns, before step(), and the parameters' gradients are gone."""
    model, opt = train(adam, 1, sharded=True, whole=False, bucket_cap_mb=0.0003)
    buckets = opt._model._buckets
    assert len(buckets) >= 3
    opt.zero_grad()
    x, y = batch(7)
    F.mse_loss(model[3](model[2](model[1](model[0](mine(x))))), mine(y)).backward()
    unused = {id(p) for p in model.unused.parameters()}
    used = [b for b in buckets if not any(id(opt._params[i]) in unused for i in b.members)]
    assert used and all(b.record is not None for b in used)  # started by the hooks
    assert all(opt._params[i].grad is None for b in used for i in b.members)
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.step()
    assert all(b.record is None for b in buckets)


def test_on_one_node_a_rank_keeps_only_its_chunks_between_steps():
    """The default route on this machine (one node, CPU): element ownership
    reduce-scatters (through the shared window at 2-3 ranks), whole-parameter
    ownership averages during backward.  Between steps an element-owning rank holds
    no full-size gradient or buffer: its gradients are its chunks, its state covers
    its chunks, nothing else is kept."""
    model, opt = train(adam, 3, sharded=True, bucket_cap_mb=0.0003)
    assert opt.ownership == "elements" and opt._reduce_whole is False
    _, whole_opt = train(my_sgd, 1, sharded=True)
    assert whole_opt._reduce_whole is (N > 1)
    params = list(model.parameters())
    assert all(p.grad is None for p in params)
    pieces = [q for g in opt.local.param_groups for q in g["params"]]
    grads = {
        g.untyped_storage().data_ptr(): g.untyped_storage().nbytes()
        for g in (q.grad for q in pieces)
        if g is not None
    }
    chunks = sum(b.chunk for b in opt._model._buckets) * 4
    assert sum(grads.values()) <= chunks  # no view into a full-size gradient
    total = sum(p.numel() for p in params) * 4
    held = sum(
        v.untyped_storage().nbytes()
        for state in opt.local.state.values()
        for v in state.values()
        if torch.is_tensor(v) and v.dim()
    )
    assert held <= 2 * chunks  # exp_avg and exp_avg_sq of the chunks
    if N > 1:
        assert held + sum(grads.values()) < 3 * total / N + 64 * len(opt._model._buckets)
    assert not any(torch.is_tensor(v) for b in opt._model._buckets for v in (b.record or ()))


def frozen_model(seed=0):
    """make_big_model with a frozen parameter used in the forward pass."""
    model = make_big_model(seed)
    model[2].bias.requires_grad_(False)
    return model


@pytest.mark.parametrize("make_opt", [sgd, adam, adamw_groups])
def test_fifty_steps_on_the_reduce_scatter_route_like_one_process(make_opt):
    ref, _ = train(make_opt, 50, sharded=False, model=frozen_model())
    got, opt = train(
        make_opt, 50, sharded=True, model=frozen_model(), whole=False, bucket_cap_mb=0.0003
    )
    assert opt.ownership == "elements" and not opt._reduce_whole
    same_weights(got, ref)
    assert torch.equal(got[2].bias, frozen_model()[2].bias)  # frozen: never stepped
    assert got.unused.weight.grad is None


@ROUTES
def test_checkpoint_round_trip_through_the_plain_optimizer(whole):
    model, opt = train(adamw_groups, 3, sharded=True, whole=whole, bucket_cap_mb=0.0003)
    ref, ref_opt = train(adamw_groups, 3, sharded=False)
    opt.consolidate_state_dict(to=None)
    state = opt.state_dict()
    ref_state = ref_opt.state_dict()
    same_adam_state(state, ref_state)
    for k in ref_state["state"]:
        assert int(state["state"][k]["step"]) == 3
    # into a sharded optimizer with other buckets (other slices), then on together
    again = make_big_model()
    again.load_state_dict(model.state_dict())
    opt2 = hvd.DistributedOptimizer(
        adamw_groups(again.parameters()),
        named_parameters=again.named_parameters(),
        shard_optimizer_state=True,
        bucket_cap_mb=0.0001,
    )
    opt2._reduce_whole = not whole
    opt2.load_state_dict(copy.deepcopy(state))
    train(adamw_groups, 3, sharded=True, model=again, opt=opt2, start=3)
    train(adamw_groups, 3, sharded=False, model=ref, opt=ref_opt, start=3)
    same_weights(again, ref)


@ROUTES
def test_synchronize_then_step_inside_skip_synchronize(whole):
    ref, _ = train(sgd, 2, sharded=False)
    model = make_big_model()
    opt = hvd.DistributedOptimizer(sgd(model.parameters()), shard_optimizer_state=True)
    opt._reduce_whole = whole
    for step in range(2):
        opt.zero_grad()
        x, y = batch(step)
        F.mse_loss(model[3](model[2](model[1](model[0](mine(x))))), mine(y)).backward()
        opt.synchronize()
        grads = [q.grad for g in opt.local.param_groups for q in g["params"]]
        assert any(g is not None for g in grads)
        with opt.skip_synchronize():
            opt.step()
    same_weights(model, ref)


@ROUTES
@pytest.mark.parametrize("make_opt", [sgd, my_sgd], ids=["elements", "parameters"])
@pytest.mark.parametrize("norm_type", [2.0, float("inf")], ids=["l2", "inf"])
def test_clip_grad_norm_like_clipping_the_whole_batch(whole, make_opt, norm_type):
    """synchronize(), clip_grad_norm_(), step() in skip_synchronize(): the weights and
    norms of one process clipping its gradients on the whole batch."""
    results, norms = [], []
    for sharded in (False, True):
        model = make_big_model()
        opt = make_opt(model.parameters())
        if sharded:
            opt = hvd.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), shard_optimizer_state=True
            )
            opt._reduce_whole = whole
        for step in range(5):
            opt.zero_grad()
            x, y = batch(step)
            if sharded:
                x, y = mine(x), mine(y)
            F.mse_loss(model[3](model[2](model[1](model[0](x)))), 10 * y).backward()
            if sharded:
                opt.synchronize()
                norms.append(opt.clip_grad_norm_(0.5, norm_type=norm_type))
                with opt.skip_synchronize():
                    opt.step()
            else:
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5, norm_type))
                opt.step()
        results.append(model)
    same_weights(results[1], results[0])
    for got, ref in zip(norms[5:], norms[:5]):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert max(norms[:5]) > 0.5  # the clipping did something


def test_clip_grad_norm_before_synchronize_is_refused_with_the_fix():
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        sgd(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=True,
    )
    with pytest.raises(RuntimeError, match=r"call optimizer.synchronize\(\) first"):
        opt.clip_grad_norm_(1.0)


def _amp_run(sharded: bool, steps: int, clip: float | None = None):
    """Train with a GradScaler whose first scale overflows float32 gradients: the
    sharded optimizer with hvd.ShardedGradScaler, or Horovod's documented unsharded
    flow (synchronize, unscale_, step inside skip_synchronize) with torch's scaler.
    """
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        adam(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=sharded,
    )
    kind = hvd.ShardedGradScaler if sharded else torch.amp.GradScaler
    scaler = kind("cpu", init_scale=2.0**127, growth_interval=2)
    scales = []
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step)
        x, y = mine(x), 100 * mine(y)  # gradients near 100: 2**127 times that overflows
        loss = F.mse_loss(model[3](model[2](model[1](model[0](x)))), y)
        scaler.scale(loss).backward()
        if sharded:
            if clip is not None:  # unscale_ reduces; clip by the whole model's norm
                scaler.unscale_(opt)
                opt.clip_grad_norm_(clip)
            scaler.step(opt)
        else:
            opt.synchronize()
            scaler.unscale_(opt)
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            with opt.skip_synchronize():
                scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


def test_sharded_grad_scaler_steps_and_skips_like_the_unsharded_flow():
    ref, ref_scales = _amp_run(sharded=False, steps=12)
    got, scales = _amp_run(sharded=True, steps=12)
    assert scales == ref_scales  # the same steps skipped (overflow), then grown
    assert scales[0] < 2.0**127 and max(scales[6:]) > min(scales), scales
    same_weights(got, ref)


def test_sharded_grad_scaler_with_clipping_like_the_unsharded_flow():
    """unscale_(), clip_grad_norm_(), step(): torch's AMP clipping recipe, sharded."""
    ref, ref_scales = _amp_run(sharded=False, steps=10, clip=1.0)
    got, scales = _amp_run(sharded=True, steps=10, clip=1.0)
    assert scales == ref_scales
    same_weights(got, ref)


def test_an_overflow_in_one_ranks_part_skips_the_step_on_every_rank():
    """An inf in the last rank's part of the reduced gradients only: every rank skips
    the step and backs the scale off (one rank stepping alone would split the model)."""
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        adam(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=True,
    )
    scaler = hvd.ShardedGradScaler("cpu", init_scale=1024.0)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step)
        loss = F.mse_loss(model[3](model[2](model[1](model[0](mine(x))))), mine(y))
        scaler.scale(loss).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.synchronize()
        if step == 1 and R == N - 1:
            grads = [p.grad for g in opt.local.param_groups for p in g["params"]]
            next(g for g in grads if g is not None).view(-1)[0] = float("inf")
        scaler.step(opt)
        scaler.update()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        assert unchanged == (step == 1), step
        assert scaler.get_scale() == (512.0 if step >= 1 else 1024.0)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for other in hvd.allgather_object(flat):
        assert torch.equal(other, flat)


def test_torch_grad_scaler_on_a_sharded_optimizer_names_the_sharded_scaler():
    model = make_big_model()
    opt = hvd.DistributedOptimizer(
        adam(model.parameters()),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=True,
    )
    scaler = torch.amp.GradScaler("cpu")
    x, y = batch(0)
    scaler.scale(F.mse_loss(model[3](model[2](model[1](model[0](mine(x))))), mine(y))).backward()
    with pytest.raises(RuntimeError, match="use hvdlite.torch.ShardedGradScaler"):
        scaler.step(opt)
