"""ElasticSampler across world-size changes that a discovery script announces.

Every step each rank takes its next ``--batch`` indices from the sampler; rank 0
gathers every rank's batch and appends one JSON line per step to ``--log``:
launch, epoch, size and the indices of the step.  Every step is committed, so
what the log holds is exactly the committed work.

At the pause points (launch 0 after ``--pause`` steps; launch 1 after
``--pause`` steps of its second epoch) rank 0 writes ``<--signal-dir>/pause.<launch>``
and every rank keeps committing until hvdrun's host-update notice makes the
commit raise HostsUpdatedInterrupt; the test edits the discovery file when it
sees the pause file.  The reset callback records ``hvd.size()`` after each
relaunch.
"""

import argparse
import json
import os
import time

import hvdlite.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--samples", type=int, default=36)
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--pause", type=int, default=3)
parser.add_argument("--log", required=True)
parser.add_argument("--signal-dir", required=True)
args = parser.parse_args()

hvd.init()
launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))
sampler = hvd.elastic.ElasticSampler(list(range(args.samples)), shuffle=True, seed=7)
state = hvd.elastic.TorchState(sampler=sampler, epoch=0)
sizes_seen = []
state.register_reset_callbacks([lambda: sizes_seen.append(hvd.size())])


def log(record):
    if hvd.rank() == 0:
        with open(args.log, "a") as handle:
            handle.write(json.dumps(record) + "\n")


def wait_for_new_hosts():
    if hvd.rank() == 0:
        open(os.path.join(args.signal_dir, f"pause.{launch}"), "w").close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state.commit()  # raises HostsUpdatedInterrupt once hvdrun posted its notice
        time.sleep(0.05)
    raise RuntimeError("no host update within 60 s")


@hvd.elastic.run
def train(state):
    log({"launch": launch, "reset_sizes": sizes_seen, "size": hvd.size()})
    steps_here = 0
    while state.epoch < args.epochs:
        mine = list(iter(state.sampler))
        steps_this_epoch = 0
        for start in range(0, len(mine), args.batch):
            batch = mine[start : start + args.batch]
            everyone = hvd.allgather_object(batch)
            log(
                {
                    "launch": launch,
                    "epoch": state.epoch,
                    "size": hvd.size(),
                    "indices": [i for part in everyone for i in part],
                }
            )
            state.sampler.record_batch(start // args.batch, args.batch)
            state.commit()
            steps_here += 1
            steps_this_epoch += 1
            if launch == 0 and steps_here == args.pause:
                wait_for_new_hosts()
            if launch == 1 and state.epoch == 1 and steps_this_epoch == args.pause:
                wait_for_new_hosts()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
log({"launch": launch, "done": True, "size": hvd.size()})
