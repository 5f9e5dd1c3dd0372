"""An elastic torch job with deterministic data: TorchState, DistributedOptimizer.

The batch of step (epoch, batch) on rank r is a fixed function of those three
numbers, so an uninterrupted run from a commit (``--start-from``, a file the
resumed job's reset callback wrote) must end with the same weights as the
elastic run that resumed from it.  ``--kill-rank R --kill-at S``: in launch 0,
rank R SIGKILLs itself before global step S (``--exit-code C``: calls ``os._exit(C)``
instead, a crash; ``--freeze``: stops itself with SIGSTOP, never to continue, as a
frozen process).  Rank 0 saves the final weights to
``--out``/final.pt; after a relaunch the reset callback saves what the job
resumed from (model, optimizer, epoch, batch, size) to ``--out``/resumed.pt.
``--compare-with FILE``: rank 0 says at the end whether its weights equal FILE's.
``--sharded``: the optimizer shards its state (``shard_optimizer_state=True``);
``--hosts-file F --shrink-to H``: the rank that kills itself first writes H into the
discovery file F, so that the job resumes on fewer ranks.
"""

import argparse
import os
import signal

import torch
from torch import nn

import hvdlite.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batches", type=int, default=8)
parser.add_argument("--commit-every", type=int, default=3)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=-1)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--freeze", action="store_true")
parser.add_argument("--out", required=True)
parser.add_argument("--start-from", default=None)
parser.add_argument("--compare-with", default=None)
parser.add_argument("--sharded", action="store_true")
parser.add_argument("--hosts-file", default=None)
parser.add_argument("--shrink-to", default=None)
args = parser.parse_args()

hvd.init()
torch.set_num_threads(1)
torch.manual_seed(0)
launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
    named_parameters=model.named_parameters(),
    shard_optimizer_state=args.sharded,
)
state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
if args.start_from:
    start = torch.load(args.start_from)
    model.load_state_dict(start["model"])
    optimizer.load_state_dict(start["optimizer"])
    state.epoch, state.batch = start["epoch"], start["batch"]
    state.save()
    if hvd.rank() == 0:
        print(
            f"replaying from epoch {state.epoch} batch {state.batch} with {hvd.size()} ranks "
            f"(the commit was resumed with {start['size']})",
            flush=True,
        )


def on_reset():
    if args.sharded:
        optimizer.consolidate_state_dict(to=0)  # collective: state_dict() on rank 0
    if hvd.rank() == 0:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "epoch": state.epoch,
                "batch": state.batch,
                "size": hvd.size(),
            },
            os.path.join(args.out, "resumed.pt"),
        )


state.register_reset_callbacks([on_reset])


def batch_for(epoch, batch, rank):
    generator = torch.Generator().manual_seed(1000 * epoch + 10 * batch + rank)
    x = torch.randn(4, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


@hvd.elastic.run
def train(state):
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            step = state.epoch * args.batches + state.batch
            if launch == 0 and hvd.rank() == args.kill_rank and step == args.kill_at:
                print(f"rank {hvd.rank()} kills itself before step {step}", flush=True)
                if args.hosts_file:
                    with open(args.hosts_file, "w") as hosts:
                        hosts.write(args.shrink_to + "\n")
                if args.exit_code:
                    os._exit(args.exit_code)
                os.kill(os.getpid(), signal.SIGSTOP if args.freeze else signal.SIGKILL)
            x, y = batch_for(state.epoch, state.batch, hvd.rank())
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
            state.batch += 1
            if state.batch % args.commit_every == 0:
                state.commit()
        state.batch = 0
        state.epoch += 1
        state.commit()


train(state)
if hvd.rank() == 0:
    torch.save(model.state_dict(), os.path.join(args.out, "final.pt"))
    print(f"finished {args.epochs} epochs with {hvd.size()} ranks", flush=True)
    if args.compare_with:
        other = torch.load(args.compare_with)
        same = all(torch.equal(value, other[name]) for name, value in model.state_dict().items())
        print(f"weights equal those of {args.compare_with}: {same}", flush=True)
