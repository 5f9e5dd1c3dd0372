"""A sharded optimizer's checkpoint travels across world sizes: 2 ranks, then 3, then 1,
each job loading what the last saved, end where one process trains the same steps."""

import sys

import pytest
import torch

from test_parallel import ROOT, run_mpi

pytestmark = pytest.mark.timeout(240)

SCRIPT = str(ROOT / "tests" / "helpers_runner" / "sharded_checkpoint.py")


def test_checkpoint_round_trip_2_3_1_ranks(tmp_path):
    sharded, plain = tmp_path / "sharded", tmp_path / "plain"
    sharded.mkdir()
    plain.mkdir()
    for ranks, start in ((2, 0), (3, 4), (1, 8)):
        rc, out = run_mpi(ranks, [sys.executable, SCRIPT, str(sharded), str(start), "4"])
        assert rc == 0, out[-4000:]
    rc, out = run_mpi(1, [sys.executable, SCRIPT, str(plain), "0", "12", "plain"])
    assert rc == 0, out[-4000:]
    got, want = torch.load(sharded / "ckpt.pt"), torch.load(plain / "ckpt.pt")
    for name, value in want["model"].items():
        torch.testing.assert_close(got["model"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    for key, state in want["optimizer"]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(
                got["optimizer"]["state"][key][name], state[name], rtol=1e-5, atol=1e-7
            )
