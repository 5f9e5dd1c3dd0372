"""DistributedOptimizer(shard_optimizer_state=True) with CUDA parameters: the same
weights as one process stepping the whole batch, optimizer state on the GPU for this
rank's shard only, and a consolidated checkpoint the plain optimizer loads."""

import pytest

hvd = None  # hvdlite.torch, imported by the fixture (CPU collection stays cheap)

STEPS = 20


@pytest.fixture(scope="module")
def torch():
    global hvd
    import torch

    import hvdlite.torch as hvd

    hvd.init()
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    yield torch
    hvd.shutdown()


def _model(torch):
    torch.manual_seed(0)
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Linear(9, 31), nn.Tanh(), nn.Linear(31, 17), nn.Linear(17, 5)
            )
            self.frozen = nn.Linear(3, 3)  # never in the forward pass: no gradient

        def forward(self, x):
            return self.body(x)

    return Net().cuda()


def _batch(torch, step):
    g = torch.Generator().manual_seed(100 + step)
    per_rank = 4
    x = torch.randn(per_rank * hvd.size(), 9, generator=g)
    y = torch.randn(per_rank * hvd.size(), 5, generator=g)
    return x.cuda(), y.cuda(), per_rank


def _adamw(model, torch):
    return torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.05)


def _train(torch, sharded):
    model = _model(torch)
    opt = _adamw(model, torch)
    if sharded:
        opt = hvd.DistributedOptimizer(
            opt, named_parameters=model.named_parameters(), shard_optimizer_state=True
        )
    for step in range(STEPS):
        x, y, per_rank = _batch(torch, step)
        if sharded:  # this rank's slice of the batch; the mean over ranks is the whole mean
            mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
            x, y = x[mine], y[mine]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt


def test_sharded_adamw_matches_one_process_on_the_whole_batch(torch):
    ref, _ = _train(torch, sharded=False)
    got, opt = _train(torch, sharded=True)
    for (name, p), q in zip(got.named_parameters(), ref.parameters(), strict=True):
        assert p.is_cuda
        torch.testing.assert_close(p, q, rtol=2e-5, atol=2e-5, msg=name)
    stepped = sum(p.numel() for p in got.body.parameters())
    # the inner optimizer's state: slices of this rank's chunk of each bucket only
    assert opt.ownership == "elements" and not opt._reduce_whole  # reduce-scattered
    held = list(opt.local.state.values())
    for state in held:
        assert all(v.is_cuda for v in state.values() if v.dim())
    counts = hvd.allgather_object(sum(state["exp_avg"].numel() for state in held))
    assert sum(counts) == stepped  # each element's state on exactly one rank
    if hvd.size() > 1:
        assert max(counts) < stepped


def test_consolidated_state_loads_into_the_plain_optimizer(torch):
    got, opt = _train(torch, sharded=True)
    opt.consolidate_state_dict(to=0)
    if hvd.rank() == 0:
        plain = _adamw(got, torch)
        plain.load_state_dict(opt.state_dict())
        steps = {int(s["step"]) for s in plain.state_dict()["state"].values()}
        assert steps == {STEPS}


def _amp_train(torch, sharded):
    """float16 autocast with a GradScaler whose first scales overflow: the sharded
    optimizer with hvd.ShardedGradScaler, or the unsharded DistributedOptimizer in
    Horovod's flow (synchronize, unscale_, step in skip_synchronize) with torch's."""
    model = _model(torch)
    opt = hvd.DistributedOptimizer(
        _adamw(model, torch),
        named_parameters=model.named_parameters(),
        shard_optimizer_state=sharded,
    )
    kind = hvd.ShardedGradScaler if sharded else torch.amp.GradScaler
    scaler = kind("cuda", init_scale=2.0**24, growth_interval=3)
    scales = []
    for step in range(STEPS):
        x, y, per_rank = _batch(torch, step)
        mine = slice(hvd.rank() * per_rank, (hvd.rank() + 1) * per_rank)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.mse_loss(model(x[mine]), 100 * y[mine])
        scaler.scale(loss).backward()
        if sharded:
            scaler.step(opt)
        else:
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


def test_sharded_grad_scaler_under_autocast_matches_the_unsharded_flow(torch):
    ref, ref_scales = _amp_train(torch, sharded=False)
    got, scales = _amp_train(torch, sharded=True)
    assert scales == ref_scales and min(scales) < 2.0**24  # skipped the same steps
    for (name, p), q in zip(got.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4, msg=name)
