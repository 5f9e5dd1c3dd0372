"""The elastic torch job that tools/chaos.py injects faults into.

Deterministic data (the batch of step (epoch, batch) on rank r is a fixed function of
those numbers), so any run that resumes exactly from its commits ends with the weights
of an uninterrupted run of the same size, bit for bit on CPU.

Talks to the chaos tool through files in ``--chaos-dir``:

- rank 0 appends one JSON line per event to ``progress.jsonl``: ``{"launch", "step"}``
  after each step it finished, ``{"launch", "commit"}`` after each commit, and
  ``{"launch", "resumed"}`` when a launch starts (the step it starts from);
- before each step every rank without a fault waiting looks for ``inject.<rank>``
  (written by the tool: JSON with ``kind``, kill or freeze, and ``phase``), takes it
  (renames it away) and, at that phase, sends itself SIGKILL or SIGSTOP: ``step`` at
  once, ``backward`` from inside the backward pass (a gradient hook), ``collective`` a
  moment after backward returned, while the optimizer waits on the gradients'
  allreduce, ``commit`` a moment after ``state.commit()`` began (the next commit,
  perhaps some steps later); it writes the time to ``fired.<rank>`` first.

``--step-sleep S`` slows each step so that the tool's faults land mid-run.  Rank 0
saves the final weights to ``--out``/final.pt.

``--global-batch G`` (the multi-host runs, whose size changes as hosts leave and come
back) makes the weights independent of the world size, bit for bit: every step trains
on the same G samples whatever the size (rank r takes samples r, r+size, ...), each
sample's gradient is rounded to a multiple of 2**-16 (and clipped to +-8), and the
ranks sum them with an allreduce (``hvd.Sum``).  Sums of such numbers are exact in
float32 (every partial sum stays below 2**8), so their order, and so how the samples
are split among ranks, changes no bit; the optimizer is plain SGD on that sum.
"""

import argparse
import json
import os
import random
import signal
import threading
import time

import torch
from torch import nn

import hvdlite.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches", type=int, default=10)
parser.add_argument("--commit-every", type=int, default=2)
parser.add_argument("--step-sleep", type=float, default=0.0)
parser.add_argument("--chaos-dir", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--global-batch", type=int, default=0, help="0: 16 samples per rank")
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
if args.global_batch:
    if args.global_batch > 32:  # 32 samples' sum stays exact (the module doc)
        raise SystemExit(f"--global-batch {args.global_batch}: at most 32")
    if args.global_batch % hvd.size():
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {hvd.size()}")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 / args.global_batch, momentum=0.9)
else:
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
# ``notes`` grows by 8 KiB a commit (as a job's logged metrics would), so that a commit
# needs new space on disk and a full state directory fails it; the commits of a fixed
# size reuse the space of the one before.
state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0, notes="")
armed: dict = {}  # this step's fault, once taken


def record(**event) -> None:
    if hvd.rank() == 0:
        with open(os.path.join(args.chaos_dir, "progress.jsonl"), "a") as log:
            log.write(json.dumps({"launch": launch, "time": time.time(), **event}) + "\n")


def take_fault() -> dict:
    path = os.path.join(args.chaos_dir, f"inject.{hvd.rank()}")
    taken = f"{path}.taken.{os.getpid()}"
    try:
        os.rename(path, taken)
    except FileNotFoundError:
        return {}
    with open(taken) as f:
        return json.load(f)


def fire(fault: dict) -> None:
    print(f"chaos: rank {hvd.rank()} {fault['kind']} at {fault['phase']}", flush=True)
    with open(os.path.join(args.chaos_dir, f"fired.{hvd.rank()}"), "w") as note:
        note.write(str(time.time()))
    os.kill(os.getpid(), signal.SIGKILL if fault["kind"] == "kill" else signal.SIGSTOP)


def fire_soon(fault: dict) -> None:
    """Fire from another thread a moment from now, while this one is inside a call."""
    timer = threading.Timer(random.uniform(0.0, 0.004), fire, (fault,))
    timer.daemon = True
    timer.start()


def in_backward(grad):
    if armed.get("phase") == "backward":
        fire(armed)
    return grad


model[0].weight.register_hook(in_backward)


def batch_for(epoch, batch, rank):
    generator = torch.Generator().manual_seed(1000 * epoch + 10 * batch + rank)
    x = torch.randn(16, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def sample_for(epoch, batch, index):
    generator = torch.Generator().manual_seed(100_000 * epoch + 1000 * batch + index)
    x = torch.randn(1, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def size_free_step(epoch, batch) -> None:
    """One step on the global batch's samples (see the module doc): the same bits at any size."""
    total = [torch.zeros_like(p) for p in model.parameters()]
    for index in range(hvd.rank(), args.global_batch, hvd.size()):
        x, y = sample_for(epoch, batch, index)
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        for t, p in zip(total, model.parameters()):
            t += (p.grad * 2.0**16).round().clamp(-(2.0**19), 2.0**19) / 2.0**16
    if armed.get("phase") == "collective":
        fire_soon(armed)
    summed = hvd.grouped_allreduce(total, op=hvd.Sum, name="grads")
    for s, p in zip(summed, model.parameters()):
        p.grad = s
    optimizer.step()


def commit() -> None:
    if armed.get("phase") == "commit":
        fire_soon(armed)
    state.notes += "." * 8192
    state.commit()
    record(commit=state.epoch * args.batches + state.batch)


@hvd.elastic.run
def train(state):
    record(resumed=state.epoch * args.batches + state.batch, size=hvd.size())
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            step = state.epoch * args.batches + state.batch
            if not armed:  # a fault waits for its phase (a commit may be steps away)
                armed.update(take_fault())
            if armed.get("phase") == "step":
                fire(armed)
            time.sleep(args.step_sleep)
            if args.global_batch:
                size_free_step(state.epoch, state.batch)
            else:
                x, y = batch_for(state.epoch, state.batch, hvd.rank())
                optimizer.zero_grad()
                nn.functional.mse_loss(model(x), y).backward()
                if armed.get("phase") == "collective":
                    fire_soon(armed)
                optimizer.step()
            state.batch += 1
            record(step=step)
            if state.batch % args.commit_every == 0:
                commit()
        state.batch = 0
        state.epoch += 1
        commit()


train(state)
if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    print(f"finished {args.epochs} epochs with {hvd.size()} ranks", flush=True)
