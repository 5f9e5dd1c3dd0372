"""hvdlite.lightning under real MPI: Lightning's Trainer on hvdlite's ranks.

Each test runs one real ``Trainer.fit`` on every rank and compares the weights
with one process that trains the same steps on the global batch (the rows of
every rank's batch together), computed here on each rank in plain torch.
Lightning's ``DistributedSampler`` shuffles training data (seed 0, ``set_epoch``
each epoch) and gives rank r the rows r, r+N, r+2N... of that permutation, so the
k-th global batch is the k-th contiguous block of the epoch's permutation.
"""

import os
import tempfile
import warnings

import lightning as L
import pytest
from mpi4py import MPI
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hvdlite.lightning  # noqa: F401 - registers strategy="hvdlite"
import hvdlite.torch as hvd
from hvdlite.lightning import HvdliteStrategy

MPI_SIZES = (2, 3)
MPI_REQUIRES = ("lightning",)

pytestmark = pytest.mark.timeout(120)
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*sync_dist=True.*")

torch.set_num_threads(1)
_WORLD = MPI.COMM_WORLD.Get_size()
PAIR = hvd.ProcessSet([0, 1]) if _WORLD > 2 else hvd.global_process_set  # ranks 0 and 1
hvd.init(process_sets=[PAIR] if _WORLD > 2 else None)
R, N = hvd.rank(), hvd.size()
B = 4  # rows per rank and batch
ROWS = 48  # a whole number of global batches at 2 and at 3 ranks


def dataset():
    g = torch.Generator().manual_seed(7)
    return TensorDataset(torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g))


def loader():
    return DataLoader(dataset(), batch_size=B, shuffle=False)


def global_batches(ranks=N, epoch=0):
    x, y = dataset().tensors
    order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(epoch))
    x, y = x[order], y[order]
    return [(x[i : i + ranks * B], y[i : i + ranks * B]) for i in range(0, ROWS, ranks * B)]


def trainer(strategy="hvdlite", **kw):
    kw.setdefault("max_epochs", 2)
    kw.setdefault("enable_checkpointing", False)
    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kw,
    )


def shared_tmpdir():
    return hvd.broadcast_object(tempfile.mkdtemp() if R == 0 else None, 0)


def same_on_every_rank(module):
    for name, p in module.state_dict().items():
        gathered = hvd.allgather(p.detach().unsqueeze(0))
        for other in gathered:
            torch.testing.assert_close(
                other, p, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}"
            )


class Regression(L.LightningModule):
    """A small MLP; each rank starts from other weights (seed + rank) unless the
    strategy broadcasts rank 0's."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed + R)
        self.net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
        self.seen = {}

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        rank = float(self.global_rank)
        self.log("rank_mean", rank, sync_dist=True, on_step=False, on_epoch=True)
        self.log("rank_max", rank, sync_dist=True, reduce_fx="max", on_step=False, on_epoch=True)
        self.log("rank_local", rank, on_step=False, on_epoch=True)
        return loss

    def on_train_start(self):
        sampler = self.trainer.train_dataloader.sampler
        self.seen.update(
            sampler=type(sampler),
            replicas=getattr(sampler, "num_replicas", None),
            sampler_rank=getattr(sampler, "rank", None),
            gathered=self.all_gather(torch.tensor([float(self.global_rank)])),
            any_true=self.trainer.strategy.reduce_boolean_decision(R == 0, all=False),
            all_true=self.trainer.strategy.reduce_boolean_decision(R == 0, all=True),
            broadcast=self.trainer.strategy.broadcast(f"from {R}", src=self.trainer.world_size - 1),
        )

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def reference(epochs, accumulate=1, clip=None, ranks=N):
    """One process on the global batch: Lightning's automatic optimization
    (loss / accumulate per pass, clip the summed gradient, step)."""
    torch.manual_seed(0)  # rank 0's initial weights
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(epochs):
        batches = global_batches(ranks, epoch)
        for k, (x, y) in enumerate(batches):
            (F.mse_loss(net(x), y) / accumulate).backward()
            if (k + 1) % accumulate == 0 or k + 1 == len(batches):
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
                opt.step()
                opt.zero_grad()
    return net


def test_fit_matches_one_process_with_accumulation_clipping_and_sync_dist():
    model = Regression()
    tmp = shared_tmpdir()
    t = trainer(
        accumulate_grad_batches=2,
        gradient_clip_val=0.05,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp, save_last=True)],
    )
    assert isinstance(t.strategy, HvdliteStrategy)
    assert (t.global_rank, t.world_size, t.local_rank) == (R, N, hvd.local_rank())
    t.fit(model, loader())

    # the weights of one process on the global batch; clipping was active, on the
    # averaged gradients (clipping each rank's own before averaging would differ)
    want = reference(2, accumulate=2, clip=0.05)
    for (name, got), ref in zip(model.net.state_dict().items(), want.state_dict().values()):
        torch.testing.assert_close(
            got, ref, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )
    unclipped = reference(2, accumulate=2)
    assert not torch.allclose(unclipped[0].weight, want[0].weight, atol=1e-4)
    optimizer = t.optimizers[0]
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.backward_passes_per_step == 2
    assert t.global_step == 2 * (ROWS // (N * B)) // 2

    # Lightning's own DistributedSampler with hvdlite's numbers, and the collectives
    seen = model.seen
    assert (seen["sampler"], seen["replicas"], seen["sampler_rank"]) == (DistributedSampler, N, R)
    assert seen["gathered"].tolist() == [[float(r)] for r in range(N)]
    assert (seen["any_true"], seen["all_true"]) == (True, False)
    assert seen["broadcast"] == f"from {N - 1}"

    # self.log(sync_dist=True) reduces over the ranks; without it each keeps its own
    metrics = t.callback_metrics
    assert metrics["rank_mean"].item() == pytest.approx((N - 1) / 2)
    assert metrics["rank_max"].item() == N - 1
    assert metrics["rank_local"].item() == R

    # rank 0 wrote the checkpoints (and removed the older top-1); every rank sees them
    hvd.barrier()
    files = sorted(os.listdir(tmp))
    assert "last.ckpt" in files and len(files) == 2, files
    assert hvd.allgather_object(files) == [files] * N
    saved = torch.load(os.path.join(tmp, "last.ckpt"), weights_only=False)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(
            saved["state_dict"][name], value, msg=lambda m, name=name: f"{name}: {m}"
        )
    assert saved["optimizer_states"][0]["state"][0]["momentum_buffer"].shape == (8, 5)


class TwoOptimizers(L.LightningModule):
    """Manual optimization: optimizer a steps every batch with b frozen; optimizer b
    accumulates two batches (toggle_model(sync_grad=False) on the first) and
    clips before its step."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(1 + R)
        self.a = nn.Linear(5, 8)
        self.b = nn.Linear(8, 3)

    def training_step(self, batch, batch_idx):
        opt_a, opt_b = self.optimizers()
        x, y = batch
        with opt_a.toggle_model():
            self.manual_backward(F.mse_loss(self.b(torch.tanh(self.a(x))), y))
        opt_a.step()
        opt_a.zero_grad()
        last = batch_idx % 2 == 1
        with opt_b.toggle_model(sync_grad=last):
            hidden = torch.tanh(self.a(x)).detach()
            self.manual_backward(F.mse_loss(self.b(hidden), y) / 2)
        if last:
            self.clip_gradients(opt_b, gradient_clip_val=0.05, gradient_clip_algorithm="norm")
            opt_b.step()
            opt_b.zero_grad()

    def configure_optimizers(self):
        return (
            torch.optim.SGD(self.a.parameters(), lr=0.1),
            torch.optim.Adam(self.b.parameters(), lr=0.01),
        )


def test_manual_optimization_with_two_optimizers():
    model = TwoOptimizers()
    trainer(max_epochs=1).fit(model, loader())

    torch.manual_seed(1)
    a, b = nn.Linear(5, 8), nn.Linear(8, 3)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(b.parameters(), lr=0.01)
    for k, (x, y) in enumerate(global_batches()):
        b.requires_grad_(False)
        F.mse_loss(b(torch.tanh(a(x))), y).backward()
        b.requires_grad_(True)
        opt_a.step()
        opt_a.zero_grad()
        (F.mse_loss(b(torch.tanh(a(x)).detach()), y) / 2).backward()
        if k % 2 == 1:
            torch.nn.utils.clip_grad_norm_(b.parameters(), 0.05)
            opt_b.step()
            opt_b.zero_grad()
    for got, want in ((model.a, a), (model.b, b)):
        for (name, p), q in zip(got.named_parameters(), want.parameters()):
            torch.testing.assert_close(
                p, q, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
            )


def test_options_bf16_mixed_sharded_state_and_fp16_compression():
    model = Regression(seed=3)
    strategy = HvdliteStrategy(compression=hvd.Compression.fp16, shard_optimizer_state=True)
    t = trainer(strategy=strategy, precision="bf16-mixed", max_epochs=1)
    t.fit(model, loader())
    assert type(t.optimizers[0]).__name__ == "ShardedOptimizer"
    same_on_every_rank(model)
    # a checkpoint of sharded state holds the whole, consolidated optimizer state
    tmp = shared_tmpdir()
    t.save_checkpoint(os.path.join(tmp, "sharded.ckpt"))
    saved = torch.load(os.path.join(tmp, "sharded.ckpt"), weights_only=False)
    state = saved["optimizer_states"][0]["state"]
    assert sorted(state) == [0, 1, 2, 3]
    assert state[0]["momentum_buffer"].shape == (8, 5)


def test_process_set_trains_on_its_ranks_only():
    if PAIR.included():
        model = Regression()
        t = trainer(strategy=HvdliteStrategy(process_set=PAIR), max_epochs=1)
        assert (t.global_rank, t.world_size) == (R, 2)
        t.fit(model, loader())
        want = reference(1, ranks=2)
        for (name, got), ref in zip(model.net.state_dict().items(), want.state_dict().values()):
            torch.testing.assert_close(
                got, ref, rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
            )
        assert model.seen["gathered"].tolist() == [[0.0], [1.0]]
    else:
        with pytest.raises(ValueError, match="not in the process set"):
            HvdliteStrategy(process_set=PAIR)
    hvd.barrier()


def test_misuse_names_the_fix():
    with pytest.raises(ValueError, match="hvdrun -np 5"):
        trainer(devices=5).fit(Regression(), loader())
    strategy = HvdliteStrategy()
    with pytest.raises(ValueError, match="reduce_op='median'"):
        strategy.reduce(torch.ones(1), reduce_op="median")
    with pytest.raises(ValueError, match="hierarchical_allreduce=True"):
        HvdliteStrategy(hierarchical_allreduce=True)


def test_lightning_digits_example_reaches_95_percent():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "lightning_digits.py"
    spec = importlib.util.spec_from_file_location("lightning_digits", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    tmp = shared_tmpdir()
    accuracy = example.main(["--epochs", "8", "--checkpoint-dir", tmp])
    assert accuracy >= 0.95
    assert hvd.allgather_object(accuracy) == [accuracy] * N
    hvd.barrier()
    files = sorted(os.listdir(tmp))
    assert len(files) == 2 and files[-1] == "last.ckpt", files  # the best epoch's, and last


def test_rank_zero_stays_global_zero_after_the_other_ranks_left():
    """At a job's end the other ranks may exit (and shut hvdlite down, which stops
    this rank's engine too) before rank 0 asks ``trainer.is_global_zero`` to print
    its result: that answer must not change.  Last here: it shuts hvdlite down."""
    import time

    fitted = trainer()
    fitted.fit(Regression(), loader())
    hvd.barrier()
    if R != 0:
        hvd.shutdown()
        return
    deadline = time.monotonic() + 30
    while hvd.is_initialized() and time.monotonic() < deadline:
        time.sleep(0.05)  # until a peer's shutdown has stopped this rank's engine
    assert not hvd.is_initialized()
    assert fitted.is_global_zero and fitted.global_rank == 0
