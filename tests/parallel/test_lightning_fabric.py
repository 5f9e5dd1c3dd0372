"""hvdlite.lightning's Fabric strategy under real MPI.

Each training test runs a real Fabric loop on every rank and compares the weights
with one process that trains the same steps on the global batch (every rank's rows
together), computed here on each rank in plain torch.  ``setup_dataloaders`` gives
each rank a ``DistributedSampler`` (no shuffling here): rank r reads rows r, r+N,
r+2N..., so the k-th global batch is rows k*N*B to (k+1)*N*B.
"""

import warnings

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hvdlite.lightning  # noqa: F401 - registers strategy="hvdlite" for Fabric too
import hvdlite.torch as hvd
from hvdlite.lightning import HvdliteFabricStrategy

MPI_SIZES = (2, 3)
MPI_REQUIRES = ("lightning",)

pytestmark = pytest.mark.timeout(120)
warnings.filterwarnings("ignore", message=".*does not have many workers.*")

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank and batch
ROWS = 48  # a whole number of global batches at 2 and at 3 ranks


def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g))


def global_batches():
    x, y = dataset().tensors
    return [(x[i : i + N * B], y[i : i + N * B]) for i in range(0, ROWS, N * B)]


def launched(strategy="hvdlite") -> L.Fabric:
    fabric = L.Fabric(strategy=strategy, accelerator="cpu")
    fabric.launch()
    return fabric


def net(seed: int = 0) -> nn.Module:
    """Other weights on each rank (seed + rank) unless the strategy broadcasts rank 0's."""
    torch.manual_seed(seed + R)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def reference(steps) -> nn.Module:
    """Rank 0's starting weights trained in one process: each step sums the gradients
    of the global batches it is given."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for batches in steps:
        opt.zero_grad()
        for x, y in batches:
            F.mse_loss(model(x), y).backward()
        opt.step()
    return model


def assert_same_weights(model, expected) -> None:
    for (name, p), q in zip(model.named_parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_fabric_takes_hvdlites_ranks_and_collectives():
    fabric = launched()
    assert isinstance(fabric.strategy, HvdliteFabricStrategy)
    assert (fabric.global_rank, fabric.world_size) == (R, N)
    assert fabric.local_rank == hvd.local_rank()
    assert fabric.is_global_zero == (R == 0)
    total = fabric.all_reduce(torch.tensor(float(R)), reduce_op="sum")
    assert total.item() == N * (N - 1) / 2
    assert fabric.all_reduce(torch.tensor(R), reduce_op="mean").item() == (N - 1) / 2
    gathered = fabric.all_gather(torch.tensor([float(R)]))
    assert gathered.shape == (N, 1) and gathered.flatten().tolist() == list(range(N))
    assert fabric.broadcast(f"from {R}", src=N - 1) == f"from {N - 1}"
    fabric.barrier()
    with pytest.raises(ValueError, match="take an hvdlite ProcessSet"):
        fabric.all_reduce(torch.tensor(1.0), group="world")
    with pytest.raises(ValueError, match="reduce_op='median'"):
        fabric.all_reduce(torch.tensor(1.0), reduce_op="median")


def test_training_ends_with_the_weights_of_one_process_on_the_global_batch():
    fabric = launched()
    model = net()
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_size=B, shuffle=False))
    assert isinstance(loader.sampler, DistributedSampler)
    assert (loader.sampler.num_replicas, loader.sampler.rank) == (N, R)
    for x, y in loader:
        opt.zero_grad()
        fabric.backward(F.mse_loss(model(x), y))
        opt.step()
    assert_same_weights(model, reference([[batch] for batch in global_batches()]))


def test_no_backward_sync_accumulates_until_the_pass_that_syncs():
    fabric = launched()
    model = net(1)
    torch.manual_seed(1)  # the reference starts from rank 0's seed-1 weights
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    loader = fabric.setup_dataloaders(DataLoader(dataset(), batch_size=B, shuffle=False))
    batches = list(loader)
    for first, second in zip(batches[::2], batches[1::2], strict=True):
        opt.zero_grad()
        with fabric.no_backward_sync(model):
            fabric.backward(F.mse_loss(model(first[0]), first[1]))
        local = model.module[0].weight.grad.clone()
        others = hvd.allgather(local.unsqueeze(0))
        assert not all(torch.equal(o, local) for o in others)  # not averaged yet
        fabric.backward(F.mse_loss(model(second[0]), second[1]))
        opt.step()
    g = global_batches()
    torch.manual_seed(1)
    expected = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    opt_ref = torch.optim.SGD(expected.parameters(), lr=0.1, momentum=0.9)
    for pair in zip(g[::2], g[1::2], strict=True):
        opt_ref.zero_grad()
        for x, y in pair:
            F.mse_loss(expected(x), y).backward()
        opt_ref.step()
    assert_same_weights(model, expected)


def test_clipping_sees_the_averaged_gradients():
    fabric = launched()
    model = net()
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = dataset().tensors
    mine = slice(R * B, (R + 1) * B)
    fabric.backward(F.mse_loss(model(x[mine]), y[mine]))
    norm = fabric.clip_gradients(model, opt, max_norm=0.01)
    expected = reference([])  # rank 0's weights, no step
    F.mse_loss(expected(x[: N * B]), y[: N * B]).backward()
    full = torch.nn.utils.clip_grad_norm_(expected.parameters(), max_norm=0.01)
    torch.testing.assert_close(norm, full, rtol=1e-5, atol=1e-7)
    for p, q in zip(model.parameters(), expected.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_a_checkpoint_is_written_once_and_loads_into_a_plain_model(tmp_path):
    fabric = launched()
    model = net()
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = dataset().tensors
    fabric.backward(F.mse_loss(model(x[R::N]), y[R::N]))
    opt.step()
    path = hvd.broadcast_object(str(tmp_path / "fabric.ckpt") if R == 0 else None, 0)
    fabric.save(path, {"model": model, "optimizer": opt, "step": 1})
    fabric.barrier()
    saved = hvd.allgather_object(sorted(p.name for p in tmp_path.iterdir()))
    assert saved[0] == ["fabric.ckpt"] and all(s == [] for s in saved[1:])  # rank 0 wrote it
    plain = torch.load(path, weights_only=True)
    assert plain["step"] == 1 and set(plain["model"]) == set(model.module.state_dict())
    fresh = net(5)
    fresh.load_state_dict(plain["model"])
    assert_same_weights(fresh, model.module)
    # and it resumes through Fabric, on every rank
    again = net(9)
    again_opt = torch.optim.SGD(again.parameters(), lr=0.1, momentum=0.9)
    again, again_opt = fabric.setup(again, again_opt)
    state = {"model": again, "optimizer": again_opt, "step": 0}
    fabric.load(path, state)
    assert state["step"] == 1
    assert_same_weights(again.module, model.module)
    assert again_opt.state_dict()["state"].keys() == opt.state_dict()["state"].keys()


def test_an_optimizer_wrapped_already_is_refused():
    fabric = launched()
    model = net()
    wrapped = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
    )
    with pytest.raises(ValueError, match="already an hvdlite DistributedOptimizer"):
        fabric.setup(model, wrapped)
