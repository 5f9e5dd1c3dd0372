"""NCCL through ``cupy.cuda.nccl``: one communicator per process set, made lazily.

:meth:`NcclLink.create` is collective over the set's MPI communicator: rank 0
of the set makes NCCL's unique id, MPI broadcasts it, every member joins the
communicator on its current CUDA device.  NCCL refuses two ranks on one GPU,
so the members first exchange (host, PCI bus id) of their devices; when two
coincide, every member learns it from the same gathered list and ``create``
returns None on all of them alike (the executor then takes the set's MPI
transport).  Collectives are enqueued on the engine's stream (the current CuPy
stream inside ``CudaBackend.activate``) and return without blocking the host.
"""

from __future__ import annotations

import logging

import cupy
import numpy as np
from cupy.cuda import nccl
from mpi4py import MPI

from ...ops import ReduceOp
from .links import Link

__all__ = ["NcclLink", "nccl_dtype"]

log = logging.getLogger("hvdlite")

_DTYPES = {
    np.dtype(np.int8): nccl.NCCL_INT8,
    np.dtype(np.uint8): nccl.NCCL_UINT8,
    np.dtype(np.int32): nccl.NCCL_INT32,
    np.dtype(np.uint32): nccl.NCCL_UINT32,
    np.dtype(np.int64): nccl.NCCL_INT64,
    np.dtype(np.uint64): nccl.NCCL_UINT64,
    np.dtype(np.float16): nccl.NCCL_FLOAT16,
    np.dtype(np.float32): nccl.NCCL_FLOAT32,
    np.dtype(np.float64): nccl.NCCL_FLOAT64,
}
_OPS = {
    ReduceOp.AVERAGE: nccl.NCCL_SUM,  # the division is folded into the postscale
    ReduceOp.SUM: nccl.NCCL_SUM,
    ReduceOp.MIN: nccl.NCCL_MIN,
    ReduceOp.MAX: nccl.NCCL_MAX,
    ReduceOp.PRODUCT: nccl.NCCL_PROD,
}
#: NCCL has no 16-bit integers or bool: those reduce in a wider (exact) type.
_WIRE = {
    np.dtype(np.int16).str: np.dtype(np.int32),
    np.dtype(np.uint16).str: np.dtype(np.int32),
    np.dtype(np.bool_).str: np.dtype(np.uint8),
}


def nccl_dtype(dtype) -> int:
    try:
        return _DTYPES[np.dtype(dtype)]
    except KeyError:
        raise TypeError(f"NCCL cannot move dtype {np.dtype(dtype)}") from None


def _bytes(array):
    return array.reshape(-1).view(cupy.uint8)


class NcclLink(Link):
    """A process set's NCCL communicator."""

    name = "NCCL"

    def __init__(self, communicator, size: int, rank: int):
        super().__init__(size, rank)
        self.communicator = communicator

    @classmethod
    def create(cls, comm) -> NcclLink | None:
        """Collective over *comm* (see the module docstring); None where NCCL cannot serve it."""
        device = cupy.cuda.Device()
        places = comm.allgather((MPI.Get_processor_name(), device.pci_bus_id))
        if len(set(places)) < len(places):
            if comm.Get_rank() == 0:
                log.warning(
                    "hvdlite: ranks of a process set share a GPU (%s); NCCL refuses "
                    "that, so the set's device collectives run over MPI.",
                    places,
                )
            return None
        unique_id = nccl.get_unique_id() if comm.Get_rank() == 0 else None
        unique_id = comm.bcast(unique_id, root=0)
        with device:
            communicator = nccl.NcclCommunicator(comm.Get_size(), unique_id, comm.Get_rank())
        return cls(communicator, comm.Get_size(), comm.Get_rank())

    def wire(self, dtype_str: str) -> np.dtype:
        return _WIRE.get(dtype_str) or np.dtype(dtype_str)

    @staticmethod
    def _stream() -> int:
        return cupy.cuda.get_current_stream().ptr

    def allreduce(self, buf, op: int) -> None:
        self.communicator.allReduce(
            buf.data.ptr,
            buf.data.ptr,
            buf.size,
            nccl_dtype(buf.dtype),
            _OPS[ReduceOp(op)],
            self._stream(),
        )

    def allgather(self, send, recv) -> None:
        send, recv = _bytes(send), _bytes(recv)
        self.communicator.allGather(
            send.data.ptr, recv.data.ptr, send.size, nccl.NCCL_UINT8, self._stream()
        )

    def broadcast(self, buf, root: int) -> None:
        buf = _bytes(buf)
        self.communicator.broadcast(
            buf.data.ptr, buf.data.ptr, buf.size, nccl.NCCL_UINT8, root, self._stream()
        )

    def reduce_scatter(self, send, recv, op: int) -> None:
        self.communicator.reduceScatter(
            send.data.ptr,
            recv.data.ptr,
            recv.size,
            nccl_dtype(recv.dtype),
            _OPS[ReduceOp(op)],
            self._stream(),
        )

    def alltoallv(self, send, send_counts, recv, recv_counts) -> None:
        stream = self._stream()
        send_ptr, recv_ptr = _bytes(send).data.ptr, _bytes(recv).data.ptr
        send_at = recv_at = 0
        nccl.groupStart()
        try:
            for peer in range(self.size):
                if send_counts[peer]:
                    self.communicator.send(
                        send_ptr + send_at, int(send_counts[peer]), nccl.NCCL_UINT8, peer, stream
                    )
                if recv_counts[peer]:
                    self.communicator.recv(
                        recv_ptr + recv_at, int(recv_counts[peer]), nccl.NCCL_UINT8, peer, stream
                    )
                send_at += int(send_counts[peer])
                recv_at += int(recv_counts[peer])
        finally:
            nccl.groupEnd()
