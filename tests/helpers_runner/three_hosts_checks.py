"""A rank program for the multi-host tests: hvdlite's collectives across hosts h1-h3.

Run at 6 ranks, 2 per host (``-H h1:2,h2:2,h3:2``).  Each rank checks, and prints
``rank R on HOST checks ok`` at the end (an assertion fails the rank, and hvdrun
the job, naming it):

- its place: rank r on host h{r // 2 + 1}, local rank r % 2 of 2, cross rank r // 2 of 3;
- allreduce (Sum, Average) and allgather over every rank (flat or hierarchical, as
  the job's HVDLITE_HIERARCHICAL_* variables say);
- process sets that span hosts: {0, 3, 5} (one rank per host) and {1, 2};
- join: rank 5 (on h3) joins first, the others reduce twice without it;
- a stall: rank 4 (on h3) submits the collective "late" 3 s after the others (the
  test sets HVDLITE_STALL_CHECK_TIME_SECONDS=1 and reads rank 0's report).
"""

import socket
import time

import numpy as np

import hvdlite as hvd

one_per_host = hvd.ProcessSet([0, 3, 5])
two_hosts = hvd.ProcessSet([1, 2])
hvd.init(process_sets=[one_per_host, two_hosts])
rank, size, host = hvd.rank(), hvd.size(), socket.gethostname()
assert size == 6, size
assert host == f"h{rank // 2 + 1}", (rank, host)
assert (hvd.local_rank(), hvd.local_size()) == (rank % 2, 2)
assert (hvd.cross_rank(), hvd.cross_size()) == (rank // 2, 3)

x = np.arange(1000, dtype=np.float32) * (rank + 1)
total = np.arange(1000, dtype=np.float32) * sum(range(1, size + 1))
np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, name="sum"), total)
np.testing.assert_allclose(hvd.allreduce(x, name="avg"), total / size, rtol=1e-6)
big = np.full(1 << 20, rank + 1, np.float32)  # 4 MB: the fused, hierarchical-sized path
np.testing.assert_array_equal(hvd.allreduce(big, op=hvd.Sum, name="big"), np.full(1 << 20, 21))
rows = hvd.allgather(np.full((rank + 1, 3), rank, np.int32), name="rows")
assert rows.shape == (21, 3) and [int(v) for v in rows[:, 0]] == [
    r for r in range(size) for _ in range(r + 1)
]

for members, process_set in (([0, 3, 5], one_per_host), ([1, 2], two_hosts)):
    if rank in members:
        got = hvd.allreduce(x, op=hvd.Sum, name="set.sum", process_set=process_set)
        want = np.arange(1000, dtype=np.float32) * sum(r + 1 for r in members)
        np.testing.assert_array_equal(got, want)
        gathered = hvd.allgather(np.array([rank], np.int64), name="set.g", process_set=process_set)
        assert gathered.tolist() == members, gathered
        root = members[-1]
        sent = np.full(4, rank, np.float64)
        got = hvd.broadcast(sent, root_rank=root, name="set.b", process_set=process_set)
        assert got.tolist() == [root] * 4, got
        assert process_set.size() == len(members) and process_set.rank() == members.index(rank)
    else:
        assert process_set.rank() is None

if rank == 5:
    last = hvd.join()
else:
    for step in range(2):
        got = hvd.allreduce(np.ones(8, np.float32), op=hvd.Sum, name=f"join.{step}")
        assert got.tolist() == [5.0] * 8, (step, got)  # rank 5 has joined: it adds nothing
    last = hvd.join()
assert hvd.allgather(np.array([last], np.int64), name="last").tolist() == [last] * size

if rank == 4:
    time.sleep(3)  # the others wait: rank 0 reports rank 4 on h3 as missing
np.testing.assert_array_equal(
    hvd.allreduce(np.ones(2, np.float32), op=hvd.Sum, name="late"), np.full(2, 6)
)
print(f"rank {rank} on {host} checks ok", flush=True)
hvd.shutdown()
