"""A Lightning checkpoint written by Trainer(strategy="hvdlite") at 2 ranks resumes at
3 ranks, and loads without hvdlite or Lightning: the weights and the optimizer's
momentum carry over, rank 0 alone writes, and the resumed job ends where one
process training the same steps on the global batches ends."""

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from test_parallel import ROOT, run_mpi

pytest.importorskip("lightning")
pytestmark = pytest.mark.timeout(300)

SCRIPT = str(ROOT / "tests" / "helpers_runner" / "lightning_checkpoint.py")
ROWS, B = 48, 4


def _reference():
    """One process: epoch 1 on global batches of 2 x B rows, epoch 2 of 3 x B."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(ROWS, 5, generator=g), torch.randn(ROWS, 3, generator=g)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for epoch, ranks in enumerate((2, 3)):
        # Lightning's DistributedSampler shuffles with seed 0 + epoch; the k-th global
        # batch is the k-th block of ranks x B rows of that permutation
        order = torch.randperm(ROWS, generator=torch.Generator().manual_seed(epoch))
        xe, ye = x[order], y[order]
        for i in range(0, ROWS, ranks * B):
            F.mse_loss(net(xe[i : i + ranks * B]), ye[i : i + ranks * B]).backward()
            opt.step()
            opt.zero_grad()
    return {f"net.{k}": v for k, v in net.state_dict().items()}


def test_checkpoint_saved_at_2_ranks_resumes_at_3(tmp_path):
    rc, out = run_mpi(2, [sys.executable, SCRIPT, str(tmp_path), "1"])
    assert rc == 0, out[-4000:]
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    first = [torch.load(tmp_path / f"report.{r}.pt") for r in range(2)]
    assert [r["written"] for r in first] == [1, 0]  # rank 0 alone wrote last.ckpt

    # loadable anywhere: plain torch, no hvdlite, no Lightning
    plain = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    plain.load_state_dict({k[len("net.") :]: v for k, v in saved["state_dict"].items()})
    torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9).load_state_dict(
        saved["optimizer_states"][0]
    )

    rc, out = run_mpi(3, [sys.executable, SCRIPT, str(tmp_path), "2"])
    assert rc == 0, out[-4000:]
    resumed = [torch.load(tmp_path / f"report.{r}.pt") for r in range(3)]
    momentum = [s["momentum_buffer"] for s in saved["optimizer_states"][0]["state"].values()]
    for report in resumed:
        assert (report["start_epoch"], report["start_step"]) == (1, ROWS // (2 * B))
        for name, value in saved["state_dict"].items():
            torch.testing.assert_close(
                report["start_weights"][name], value, msg=lambda m, name=name: f"{name}: {m}"
            )
        for got, want in zip(report["start_momentum"], momentum, strict=True):
            torch.testing.assert_close(got, want)
    assert [r["written"] for r in resumed] == [1, 0, 0]
    want = _reference()
    for report in resumed:
        for name, value in want.items():
            torch.testing.assert_close(
                report["end_weights"][name], value, rtol=1e-5, atol=1e-6, msg=name
            )
