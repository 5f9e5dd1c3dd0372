"""A small elastic job on hvdlite's numpy API: an ObjectState, deterministic steps.

Each step adds the allreduced (averaged) contribution ``step + 1`` to ``total``
and commits every ``--commit-every`` steps, so the final ``total`` tells
whether a step was skipped or repeated: it must be ``steps * (steps + 1) / 2``.

Faults (only in launch 0, i.e. ``HVDLITE_ELASTIC_GENERATION`` 0, unless
``--every-launch``): ``--kill-rank R --kill-at S`` (rank R SIGKILLs itself before
step S), ``--crash-in-commit N`` (rank 0 dies inside commit N, after the state
is written to its temporary file and before the rename), ``--corrupt-after N``
(rank 0 flips a byte of the state file after commit N, then dies; with
``--corrupt-spare-too`` of its spare copy too),
``--kill-after-commit N`` (rank 0 SIGKILLs itself as soon as commit N returns),
``--local-state-dir DIR`` (rank 0 takes DIR for the job's state directory, as on a
host that does not share hvdrun's), ``--file-size-limit BYTES`` (rank 0 may write no
file larger: with ``--ballast BYTES`` of numpy array in the state its commits fail
with EFBIG).
"""

import argparse
import os
import signal
import time

import numpy as np

import hvdlite
import hvdlite.elastic
import hvdlite.elastic.persistence as persistence

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--commit-every", type=int, default=2)
parser.add_argument("--kill-rank", type=int, default=-1)
parser.add_argument("--kill-at", type=int, default=-1)
parser.add_argument("--crash-in-commit", type=int, default=0)
parser.add_argument("--corrupt-after", type=int, default=0)
parser.add_argument("--kill-after-commit", type=int, default=0)
parser.add_argument("--corrupt-spare-too", action="store_true")
parser.add_argument("--every-launch", action="store_true")
parser.add_argument("--local-state-dir", default=None)
parser.add_argument("--step-seconds", type=float, default=0.0)
parser.add_argument("--file-size-limit", type=int, default=0)
parser.add_argument("--ballast", type=int, default=0)
args = parser.parse_args()

hvdlite.init()
launch = int(os.environ.get("HVDLITE_ELASTIC_GENERATION", "0"))
faulty = launch == 0 or args.every_launch
if args.local_state_dir and hvdlite.rank() == 0:  # rank 0 sees another directory
    os.environ["HVDLITE_ELASTIC_JOB_DIR"] = args.local_state_dir
ballast = {"ballast": np.zeros(args.ballast, np.uint8)} if args.ballast else {}
state = hvdlite.elastic.ObjectState(step=0, total=0.0, **ballast)


def limit_file_size():
    """From now on rank 0 writes no file larger than --file-size-limit (after the first
    collective: MPI's shared-memory segments are files too)."""
    if faulty and args.file_size_limit and hvdlite.rank() == 0:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size_limit, resource.RLIM_INFINITY))


if faulty and args.crash_in_commit and hvdlite.rank() == 0:
    publish, commits = persistence._publish, [0]

    def dying_publish(temporary, final):
        commits[0] += 1
        if commits[0] == args.crash_in_commit:
            print(
                f"dying inside commit {commits[0]}: {os.path.getsize(temporary)} bytes "
                "written, not renamed",
                flush=True,
            )
            os.kill(os.getpid(), signal.SIGKILL)
        publish(temporary, final)

    persistence._publish = dying_publish


@hvdlite.elastic.run
def train(state):
    while state.step < args.steps:
        if faulty and hvdlite.rank() == args.kill_rank and state.step == args.kill_at:
            print(f"rank {hvdlite.rank()} kills itself before step {state.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        contribution = hvdlite.allreduce(np.array([state.step + 1.0]), name="step")
        state.total += float(contribution[0])
        state.step += 1
        time.sleep(args.step_seconds)
        if state.step % args.commit_every == 0:
            limit_file_size()
            state.commit()
            if (
                faulty
                and hvdlite.rank() == 0
                and args.kill_after_commit
                and state._commit_number == args.kill_after_commit
            ):
                print(f"rank 0 dies as commit {args.kill_after_commit} returns", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if (
                faulty
                and hvdlite.rank() == 0
                and args.corrupt_after
                and state._commit_number == args.corrupt_after
            ):
                state.flush()  # commit N is on disk
                path = os.path.join(os.environ["HVDLITE_ELASTIC_JOB_DIR"], "state.hvdlite")
                for name in [path] + ([path + ".spare"] if args.corrupt_spare_too else []):
                    with open(name, "r+b") as handle:
                        handle.seek(-3, os.SEEK_END)
                        byte = handle.read(1)
                        handle.seek(-3, os.SEEK_END)
                        handle.write(bytes([byte[0] ^ 0xFF]))
                print(f"corrupted {path} after commit {args.corrupt_after}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
    return state.total


total = train(state)
if hvdlite.rank() == 0:
    print(f"final total={total:g} steps={state.step} size={hvdlite.size()}", flush=True)
