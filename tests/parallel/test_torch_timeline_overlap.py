"""A torch training job's timeline shows each step's backward pass and synchronize(),
and ``python -m hvdlite.timeline overlap`` splits its communication into the part
backward hid and the part the step waited for.

Runs under mpiexec at 2 ranks with ``HVDLITE_OVERLAP=on`` (set before ``init()``),
so the gradient hooks hand buckets to the engine during backward.  Every rank
trains; rank 0 writes the timeline and checks it.  No times are asserted: only
what the trace must hold whatever the machine's speed.
"""

import os
import tempfile

os.environ["HVDLITE_OVERLAP"] = "on"

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import hvdlite.torch as hvd  # noqa: E402
from hvdlite import basics  # noqa: E402
from hvdlite.timeline import Trace  # noqa: E402
from hvdlite.timeline import schema as s  # noqa: E402
from hvdlite.timeline.__main__ import main as timeline_main  # noqa: E402
from hvdlite.timeline.overlap import overlap, steps_of  # noqa: E402

MPI_SIZES = (2,)
STEPS = 4

pytestmark = pytest.mark.timeout(120)

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()


def _train(path: str) -> None:
    """STEPS steps of a 4-layer MLP (1 MB of gradients in buckets of about 256 KB)
    with the timeline on, on every rank."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256)
    )
    model.append(nn.ReLU()).append(nn.Linear(256, 16))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters(),
        bucket_cap_mb=0.25,
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(R)
    hvd.start_timeline(path)
    try:
        for _ in range(STEPS):
            opt.zero_grad()
            x, y = torch.randn(32, 256, generator=g), torch.randn(32, 16, generator=g)
            F.mse_loss(model(x), y).backward()
            opt.step()
    finally:
        hvd.stop_timeline()


def test_the_overlap_report_of_a_torch_job_adds_up(capsys):
    assert basics.reductions_overlap_compute()  # HVDLITE_OVERLAP=on: hooks start buckets
    path = os.path.join(tempfile.mkdtemp(prefix="hvdlite-overlap-"), "t.json")
    _train(path)
    if R != 0:
        return
    trace = Trace.load(path)
    assert trace.tracks[s.STEPS_TRACK] == "training steps"
    pairs = steps_of(trace)
    assert [step for step, _, _ in pairs] == list(range(1, STEPS + 1))
    for _, back, wait in pairs:
        assert back["name"] == "BACKWARD" and wait["name"] == "SYNCHRONIZE"
        assert wait["ts"] >= back["ts"]

    steps, _ = overlap(trace)
    assert len(steps) == STEPS
    negotiations = [float(e["ts"]) for e in trace.slices[s.NEGOTIATE]]
    for x in steps:
        assert x.batches >= 1 and x.communication > 0
        assert x.hidden + x.exposed == pytest.approx(x.communication)
        assert 0 <= x.hidden <= x.backward + 1e-3 and 0 <= x.exposed
    for x in steps[1:]:  # names the response cache decides: negotiation starts at submission
        # The hooks handed a bucket to the engine during this step's backward.
        assert any(x.start <= t <= x.start + x.backward for t in negotiations), x

    assert timeline_main(["overlap", path]) == 0
    out = capsys.readouterr().out
    assert "Rank 0's view" in out and "hidden fraction" in out
    assert f"Total over {STEPS - 1} steps" in out
