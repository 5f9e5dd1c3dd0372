"""Autotune offers hierarchical allreduce where two levels can spare the links, and
float16 gradients (as Compression.fp16 hands them over) then cross nodes as 16-bit
node partial sums.

Runs as simulated nodes of two consecutive ranks (HVDLITE_TEST_NODE_SIZE=2) with
autotune on and HVDLITE_HIERARCHICAL_ALLREDUCE unset: at 4 ranks two nodes of
two, where the tuner must offer the switch, apply it on every rank in the same
cycle and send float16 batches through the two levels; at 2 ranks one node,
where the switch would mean nothing and is not offered.  Every result must be
one of the two documented roundings: the flat wire's (summed in float32, rounded
once) or the two levels' (each node's partial sum rounded, then the total).
"""

import os

import numpy as np
import pytest
from core_helpers import half_values, spy_on

for _var in list(os.environ):
    if "AUTOTUNE" in _var or "HIERARCHICAL" in _var:
        os.environ.pop(_var)
os.environ.update(
    {
        "HVDLITE_TEST_NODE_SIZE": "2",
        "HVDLITE_AUTOTUNE": "1",
        "HVDLITE_AUTOTUNE_WARMUP_SAMPLES": "1",
        "HVDLITE_AUTOTUNE_STEPS_PER_SAMPLE": "2",
        "HVDLITE_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4",
        "HVDLITE_CYCLE_TIME": "5",
    }
)

import hvdlite as hvd  # noqa: E402
from hvdlite.engine.runtime import state  # noqa: E402
from hvdlite.engine.transports.half_two_level import HalfTwoLevelPeer  # noqa: E402
from hvdlite.engine.transports.half_wire import HALF_WIRE_MIN_BYTES  # noqa: E402

MPI_SIZES = (2, 4)
MPI_ENV = {"HVDLITE_TEST_NODE_SIZE": "2", "HVDLITE_AUTOTUNE": "1"}

pytestmark = pytest.mark.timeout(120)

hvd.init()
R, N = hvd.rank(), hvd.size()
NODES = [tuple(range(first, min(first + 2, N))) for first in range(0, N, 2)]
OFFERED = len(NODES) > 1
COUNTS = (HALF_WIRE_MIN_BYTES // 4 + 1001, 40_000)  # both large enough for 16 bits


def _sum32(terms):
    total = terms[0].astype(np.float32)
    for term in terms[1:]:
        total = total + term.astype(np.float32)
    return total


def roundings(inputs) -> tuple[np.ndarray, np.ndarray]:
    """The averages of *inputs* under the flat rule and under the two levels' rule."""
    post = np.float32(1.0 / N)
    flat = (_sum32(inputs) * post).astype(np.float16)
    partials = [_sum32([inputs[r] for r in node]).astype(np.float16) for node in NODES]
    return flat, (_sum32(partials) * post).astype(np.float16)


def test_the_tuner_offers_two_levels_only_across_nodes_of_several_ranks(monkeypatch):
    link = state().engine.tuning
    assert (state().engine.executor.hierarchical is not None) == OFFERED
    if R == 0:
        assert ("hierarchical_allreduce" in link.tuner.space.switches) == OFFERED
    two_level = spy_on(monkeypatch, HalfTwoLevelPeer, "reduce", lambda p0, t, *rest: t.total())
    step = 0
    while step < 80:
        inputs = [
            [half_values(r, n, 100 * step + i) for r in range(N)] for i, n in enumerate(COUNTS)
        ]
        handles = [
            hvd.allreduce_async(x[R], op=hvd.Average, name=f"fp16.grad.{i}")
            for i, x in enumerate(inputs)
        ]
        for x, handle in zip(inputs, handles):
            out = hvd.synchronize(handle).view(np.uint16)
            assert any(np.array_equal(out, r.view(np.uint16)) for r in roundings(x))
        step += 1
        done = hvd.broadcast_object(link.tuner.finished if R == 0 else None, root_rank=0)
        if done:
            break
    assert done, "autotune did not settle"
    histories = hvd.allgather_object(link.history)
    assert all(h == histories[0] for h in histories)
    tried_two_levels = any(s.hierarchical_allreduce for _, s in link.history)
    assert tried_two_levels == OFFERED
    assert bool(two_level) == OFFERED  # float16 batches went through the two levels
