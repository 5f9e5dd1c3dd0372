"""Collective transports of the device path ("links"), over one process set.

A :class:`Link` moves backend arrays between the members of a set.  Every
call is collective: each member calls it with the same sizes, in the same
order (the engine's ordered response list guarantees it).  Blocks are equal
per rank (the executor pads uneven allgathers and reducescatters), which is
what NCCL requires and keeps every transport interchangeable:

- :class:`MpiLink`: MPI on the backend's memory: numpy buffers for the host
  backend, device pointers for a CUDA-aware MPI (mpi4py takes any
  ``__cuda_array_interface__`` buffer); the engine stream is synchronized
  first, because MPI reads and writes from the host thread;
- :class:`StagedLink`: copy to persistent (pinned) host buffers, run the host
  MPI collective, copy back: any GPU job runs on any MPI;
- :class:`~hvdlite.engine.transports.nccl_link.NcclLink`: NCCL on the engine stream;
- :class:`HierarchicalLink`: allreduce as reduce-scatter inside the node, an
  allreduce of each shard across nodes, allgather inside the node; the other
  collectives run on its flat link.
"""

from __future__ import annotations

import abc
import math

import numpy as np
from mpi4py import MPI

from ...util.dtypes import reduce_dtype
from ...ops import ReduceOp
from ...util.splits import offsets

__all__ = ["Link", "MpiLink", "StagedLink", "HierarchicalLink", "MPI_OPS"]

MPI_OPS = {
    ReduceOp.AVERAGE: MPI.SUM,
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.PRODUCT: MPI.PROD,
}


class Link(abc.ABC):
    """One process set's transport for backend arrays (see the module docstring)."""

    #: what ``hvdrun --check-build`` and the tests call it
    name = "link"

    def __init__(self, size: int, rank: int):
        self.size = size
        self.rank = rank

    def wire(self, dtype_str: str) -> np.dtype:
        """The dtype a reduction of *dtype_str* runs in on this link."""
        return reduce_dtype(dtype_str)

    @abc.abstractmethod
    def allreduce(self, buf, op: int) -> None:
        """Reduce flat *buf* in place over the set."""

    @abc.abstractmethod
    def allgather(self, send, recv) -> None:
        """Every rank's *send* block, rank after rank, into *recv* (size x len(send))."""

    @abc.abstractmethod
    def broadcast(self, buf, root: int) -> None:
        """*root*'s (a rank of the set) *buf* into every member's *buf*."""

    @abc.abstractmethod
    def reduce_scatter(self, send, recv, op: int) -> None:
        """Reduce *send* (size blocks of len(recv)); block r of the result to rank r."""

    @abc.abstractmethod
    def alltoallv(self, send, send_counts, recv, recv_counts) -> None:
        """Bytes: send_counts[r] bytes of *send* (in rank order) to rank r, and
        recv_counts[r] bytes from rank r into *recv* (in rank order)."""


class MpiLink(Link):
    """MPI directly on the backend's buffers (host memory, or CUDA-aware MPI)."""

    def __init__(self, comm, backend, device_memory: bool):
        super().__init__(comm.Get_size(), comm.Get_rank())
        self.comm = comm
        self.backend = backend
        self.device_memory = device_memory
        self.name = "CUDA-aware MPI" if device_memory else "MPI"

    def _ready(self) -> None:
        if self.device_memory:
            self.backend.synchronize()

    def allreduce(self, buf, op: int) -> None:
        self._ready()
        self.comm.Allreduce(MPI.IN_PLACE, buf, MPI_OPS[ReduceOp(op)])

    def allgather(self, send, recv) -> None:
        self._ready()
        self.comm.Allgather(send, recv)

    def broadcast(self, buf, root: int) -> None:
        self._ready()
        self.comm.Bcast(buf, root=root)

    def reduce_scatter(self, send, recv, op: int) -> None:
        self._ready()
        self.comm.Reduce_scatter_block(send, recv, MPI_OPS[ReduceOp(op)])

    def alltoallv(self, send, send_counts, recv, recv_counts) -> None:
        self._ready()
        self.comm.Alltoallv(
            [send, (list(send_counts), offsets(send_counts)), MPI.BYTE],
            [recv, (list(recv_counts), offsets(recv_counts)), MPI.BYTE],
        )


class StagedLink(Link):
    """Through host buffers (pinned on CUDA) and MPI on them."""

    name = "staged through host memory"

    def __init__(self, comm, backend):
        super().__init__(comm.Get_size(), comm.Get_rank())
        self.backend = backend
        self.host = MpiLink(comm, backend, device_memory=False)

    def _down(self, array, slot: int) -> np.ndarray:
        host = self.backend.staging(array.dtype, array.size, slot)
        self.backend.to_host(array, host)
        return host

    def allreduce(self, buf, op: int) -> None:
        host = self._down(buf, 0)
        self.host.allreduce(host, op)
        self.backend.from_host(host, buf)

    def allgather(self, send, recv) -> None:
        host_send = self._down(send, 0)
        host_recv = self.backend.staging(recv.dtype, recv.size, 1)
        self.host.allgather(host_send, host_recv)
        self.backend.from_host(host_recv, recv)

    def broadcast(self, buf, root: int) -> None:
        host = self._down(buf, 0)
        self.host.broadcast(host, root)
        self.backend.from_host(host, buf)

    def reduce_scatter(self, send, recv, op: int) -> None:
        host_send = self._down(send, 0)
        host_recv = self.backend.staging(recv.dtype, recv.size, 1)
        self.host.reduce_scatter(host_send, host_recv, op)
        self.backend.from_host(host_recv, recv)

    def alltoallv(self, send, send_counts, recv, recv_counts) -> None:
        host_send = self._down(send, 0)
        host_recv = self.backend.staging(recv.dtype, recv.size, 1)
        self.host.alltoallv(host_send, send_counts, host_recv, recv_counts)
        self.backend.from_host(host_recv, recv)


class HierarchicalLink(Link):
    """Two-level allreduce (Horovod's scheme); everything else on *flat*.

    *local*: a link over this rank's node; *cross*: a link over the ranks with
    this rank's local rank on every node.  Every node must have the same number
    of ranks (the router only chooses this link then).
    """

    name = "hierarchical"

    def __init__(self, local: Link, cross: Link, flat: Link, backend):
        super().__init__(flat.size, flat.rank)
        self.local, self.cross, self.flat = local, cross, flat
        self.backend = backend
        self.name = f"hierarchical ({local.name} in the node, {cross.name} across nodes)"

    def wire(self, dtype_str: str) -> np.dtype:
        # The shard crosses nodes over MPI: its dtype must be one MPI reduces.
        return self.cross.wire(dtype_str)

    def allreduce(self, buf, op: int) -> None:
        count, width = buf.size, self.local.size
        shard_count = math.ceil(count / width) if count else 0
        padded = self.backend.buffer(buf.dtype, shard_count * width, slot=5)
        self.backend.copy(padded[:count], buf)
        if padded.size > count:  # the padding's results are dropped: any value will do
            self.backend.zero(padded[count:])
        shard = self.backend.buffer(buf.dtype, shard_count, slot=6)
        self.local.reduce_scatter(padded, shard, op)
        self.cross.allreduce(shard, op)
        self.local.allgather(shard, padded)
        self.backend.copy(buf, padded[:count])

    def allgather(self, send, recv) -> None:
        self.flat.allgather(send, recv)

    def broadcast(self, buf, root: int) -> None:
        self.flat.broadcast(buf, root)

    def reduce_scatter(self, send, recv, op: int) -> None:
        self.flat.reduce_scatter(send, recv, op)

    def alltoallv(self, send, send_counts, recv, recv_counts) -> None:
        self.flat.alltoallv(send, send_counts, recv, recv_counts)
