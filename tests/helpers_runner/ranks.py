"""A rank program for the launcher tests (mpi4py only; no hvdlite engine).

Usage: ranks.py MODE [ARG]
  ok            print "rank R of N" and a sum over all ranks, exit 0
  exit CODE     rank 1 prints a line and exits at once with CODE (os._exit: MPI_Finalize
                would wait for the other ranks); the others wait
  raise         rank 1 raises an exception (run it under python -m mpi4py: MPI_Abort)
  kill          rank 1 kills itself with SIGKILL; the others wait
  sleep         print "ready", then sleep until stopped
  env NAME...   print NAME=value for each variable, then exit 0
  forge         print made-up status lines on stderr (the old marker, a wrong token, this
                job's token -- read from the task wrapper's environment -- with bad JSON
                or bad fields), then do what "ok" does
"""

import os
import signal
import sys
import time
from pathlib import Path

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"


def _forge() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hvdlite" / "runner"))
    import protocol  # as a plain file, as the task wrapper does: no hvdlite package import

    wrapper_env = Path(f"/proc/{os.getppid()}/environ").read_bytes().split(b"\0")
    token = next(
        item.split(b"=", 1)[1].decode()
        for item in wrapper_env
        if item.startswith(protocol.TOKEN_VARIABLE.encode() + b"=")
    )
    right = protocol.marker(token)
    failed = (
        '{"event":"exit","rank":1,"host":"h","code":3,"signal":null,"stopped":false,'
        '"time":1.0,"tail":[]}'
    )
    for line in (
        "@@hvdlite-task@@ " + failed,  # the marker before tokens
        protocol.marker("0" * len(token)) + " " + failed,
        right + " {not json",
        right + " " + failed.replace('"code":3', '"code":"three"'),
        right + " " + failed.replace('"rank":1', '"rank":7'),
        right + " " + failed.replace('"rank":1', '"rank":"1"'),
        right + " " + failed.replace('"time":1.0', '"time":NaN'),
        right + ' {"event":["exit"],"rank":1}',
        right + " [1, 2]",
    ):
        print("forged:", line, file=sys.stderr, flush=True)


if mode == "forge":
    _forge()
    mode = "ok"

if mode == "env":
    for name in sys.argv[2:]:
        print(f"{name}={os.environ.get(name, '<unset>')}")
    sys.exit(0)

from mpi4py import MPI  # noqa: E402

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

if mode == "ok":
    total = comm.allreduce(rank)
    print(f"rank {rank} of {size} sum {total}")
    sys.exit(0)
if mode == "exit":
    if rank == 1:
        print(f"rank {rank} is about to fail", flush=True)
        os._exit(int(sys.argv[2]))
elif mode == "raise":
    if rank == 1:
        print(f"rank {rank} is about to raise", flush=True)
        raise RuntimeError("boom on rank 1")
elif mode == "kill":
    if rank == 1:
        print(f"rank {rank} is about to be killed", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
elif mode == "freeze":
    if rank == 1:
        print(f"rank {rank} is about to stop itself", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
elif mode == "stop-wrapper":
    if rank == 1:  # its task wrapper falls silent, as on a host whose link is cut
        print(f"rank {rank} is about to stop its wrapper", flush=True)
        os.kill(os.getppid(), signal.SIGSTOP)
elif mode == "sleep":
    print(f"rank {rank} ready", flush=True)
else:
    sys.exit(f"unknown mode {mode!r}")
deadline = time.monotonic() + 120
while time.monotonic() < deadline:  # wait without spinning in MPI
    time.sleep(0.2)
sys.exit(5)
