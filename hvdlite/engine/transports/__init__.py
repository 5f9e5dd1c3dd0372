"""The transports: every way a batch of agreed responses can move, as peers.

Each path is a peer: host MPI, shared memory (:mod:`.shm`), two-level
(:mod:`.hierarchical`), Adasum (:mod:`.adasum`), and for device buffers NCCL,
CUDA-aware MPI and staging through host memory (:mod:`.device` over the links of
:mod:`.links` and :mod:`.nccl_link`).  :mod:`.routes` decides, from the knobs and
the job's layout, which paths each process set may take.

Below the engine's loop and above device memory: nothing here imports the
engine's negotiation or loop, only the values a batch is made of
(:mod:`hvdlite.engine.messages`) and :mod:`hvdlite.device`.
"""
