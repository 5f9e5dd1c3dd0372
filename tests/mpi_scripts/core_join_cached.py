"""Join while the other ranks repeat cached names (the response cache's fast path).

Usage: ``mpiexec -n N python core_join_cached.py``.  Rank r runs 2 + r steps of
the same two names, then joins; the names are answered from the response cache
until the first rank joins, then by the coordinator.  Exits 0 when every result
is right and join() returns the last rank everywhere.  Run by
tests/test_core_launch.py in its own job: a divergence between ranks here
aborts MPI, which would take a whole pytest module down with it.
"""

import numpy as np

import hvdlite as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def steps_of(r):
    return 2 + r


for s in range(steps_of(rank)):
    active = [r for r in range(size) if steps_of(r) > s]
    out = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum, name="join.cached.ar")
    np.testing.assert_allclose(out, np.full(3, float(sum(r + 1 for r in active))))
    if len(active) == size:  # only allreduce runs once a rank has joined
        out = hvd.allgather(np.full((1,), rank), name="join.cached.ag")
        np.testing.assert_array_equal(out, np.array(active))
last = hvd.join()
assert last == size - 1, last
for _ in range(2):  # the cache serves the names again once nobody is joined
    out = hvd.allreduce(np.full(3, rank + 1.0), op=hvd.Sum, name="join.cached.ar")
    np.testing.assert_allclose(out, np.full(3, float(sum(r + 1 for r in range(size)))))
print(f"rank {rank}: OK", flush=True)
