"""Packing a batch into one buffer and back: written once, for host and device arrays.

Every collective that fuses tensors lays them out the same way on the host
(numpy, MPI) and on a device (CuPy, NCCL or CUDA-aware MPI); only the copies
differ.  The functions here take the copies from an *ops* object with four
methods, which :data:`NUMPY` provides for host arrays and every
:class:`~hvdlite.device.backend.ArrayBackend` provides for its own:

- ``copy(dst, src)``: ``dst[...] = src``, cast to dst's dtype;
- ``scale(dst, src, factor)``: ``dst[...] = src * factor``, cast to dst's dtype;
- ``zero(dst)``;
- ``concatenate(srcs, dst)``: the flat *srcs* back to back into *dst*.

Layouts (the same on every rank, decided from agreed shapes and dtypes):

- allreduce: the tensors of one wire dtype back to back (:func:`pack`,
  :func:`unpack`); a joined rank's tensors (input None) are zeros;
- reducescatter and grouped allgather: *rank-major*, rank 0's rows of every
  tensor, then rank 1's...; each rank's region starts where the caller says
  (back to back for MPI's v-collectives, at equal padded blocks for NCCL);
- broadcast of several tensors: their bytes back to back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .fusion import Reduction

__all__ = [
    "NUMPY",
    "Gathered",
    "Scattered",
    "flat_bytes",
    "pack",
    "unpack",
    "reduce_alone",
    "rank_counts",
    "pack_rank_major",
    "unpack_shards",
    "unpack_rank_major",
    "pack_bytes",
    "unpack_bytes",
]


class _NumpyOps:
    """The copies of :mod:`hvdlite.engine.packing` for numpy arrays."""

    @staticmethod
    def copy(dst, src) -> None:
        np.copyto(dst, src, casting="unsafe")

    @staticmethod
    def scale(dst, src, factor: float) -> None:
        np.multiply(src, factor, out=dst, casting="unsafe")

    @staticmethod
    def zero(dst) -> None:
        dst.fill(0)

    @staticmethod
    def concatenate(srcs, dst) -> None:
        np.concatenate(srcs, out=dst)


NUMPY = _NumpyOps()


class Gathered(NamedTuple):
    """One tensor of an allgather batch (every member has its entry: no allgather
    runs while a rank of the set has joined)."""

    entry: object
    input: object
    trailing: tuple  # the shape after dim 0
    dtype: np.dtype


class Scattered(NamedTuple):
    """One tensor of a reducescatter batch (every member has its entry, as for
    :class:`Gathered`)."""

    entry: object
    input: object
    shape: tuple
    dtype: np.dtype
    prescale: float
    postscale: float
    rows: list  # dim-0 rows of each rank's shard

    @property
    def row_elements(self) -> int:
        return math.prod(self.shape[1:])


def flat_bytes(array):
    """The bytes of a C-contiguous array, as a flat uint8 view."""
    return array.reshape(-1).view(np.uint8)


# ------------------------------------------------------------------ allreduce
def pack(ops, tensors: Reduction, buf) -> None:
    """The inputs of *tensors* into *buf*, back to back: prescaled, cast to buf's
    dtype, zeros for a joined rank."""
    inputs, prescales = tensors.inputs, tensors.prescales
    if all(inp is not None and inp.dtype == buf.dtype for inp in inputs) and all(
        pre == 1.0 for pre in prescales
    ):
        # The common case (no scaling, one dtype): one call packs every tensor.
        ops.concatenate([inp.reshape(-1) for inp in inputs], buf)
        return
    offset = 0
    for inp, count, pre in zip(inputs, tensors.counts, prescales):
        view = buf[offset : offset + count]
        offset += count
        if inp is None:
            ops.zero(view)
        elif pre != 1.0:
            ops.scale(view, inp.reshape(-1), pre)
        else:
            ops.copy(view, inp.reshape(-1))


def unpack(ops, tensors: Reduction, buf) -> None:
    """The reduced *buf* out into the outputs: postscaled, cast back; nothing
    for a joined rank."""
    offset = 0
    for out, count, post in zip(tensors.outputs, tensors.counts, tensors.postscales):
        view = buf[offset : offset + count]
        offset += count
        if out is None:
            continue
        if post != 1.0:
            ops.scale(out.reshape(-1), view, post)
        else:
            ops.copy(out.reshape(-1), view)


def reduce_alone(ops, inp, out, prescale: float, postscale: float, allreduce) -> None:
    """One tensor of the wire dtype, reduced straight into *out* (no fusion buffer).

    *allreduce(buf, src)* reduces *src* across the ranks into *buf* (in place
    where *src* is *buf*)."""
    if prescale != 1.0:
        ops.scale(out, inp, prescale)
        inp = out
    allreduce(out, inp)
    if postscale != 1.0:
        ops.scale(out, out, postscale)


# ------------------------------------------------------ reducescatter, allgather
def rank_counts(tensors: Sequence[Scattered], size: int) -> list[int]:
    """Elements of each rank's region in a reducescatter's rank-major layout."""
    return [sum(t.rows[r] * t.row_elements for t in tensors) for r in range(size)]


def pack_rank_major(ops, tensors: Sequence[Scattered], send, starts: Sequence[int]) -> None:
    """Each rank's rows of every tensor into *send*, rank r's from ``starts[r]``:
    prescaled and cast to send's dtype."""
    taken = [0] * len(tensors)
    for r, offset in enumerate(starts):
        for j, t in enumerate(tensors):
            n = t.rows[r] * t.row_elements
            view = send[offset : offset + n]
            src = t.input.reshape(-1)[taken[j] : taken[j] + n]
            if t.prescale != 1.0:
                ops.scale(view, src, t.prescale)
            else:
                ops.copy(view, src)
            taken[j] += n
            offset += n


def unpack_shards(ops, tensors: Sequence[Scattered], recv, me: int, outputs) -> None:
    """This rank's reduced region *recv* out into *outputs* (one per tensor):
    postscaled, cast back."""
    offset = 0
    for t, out in zip(tensors, outputs):
        n = t.rows[me] * t.row_elements
        view = recv[offset : offset + n]
        offset += n
        if not n:
            continue
        if t.postscale != 1.0:
            ops.scale(out.reshape(-1), view, t.postscale)
        else:
            ops.copy(out.reshape(-1), view)


def unpack_rank_major(
    ops, recv, starts: Sequence[int], dims, row_bytes: Sequence[int], outputs
) -> None:
    """A grouped allgather's bytes (rank r's rows of every tensor from
    ``starts[r]``) into the tensors' *outputs*."""
    row_at = [0] * len(outputs)
    for r, offset in enumerate(starts):
        for j, out in enumerate(outputs):
            nbytes = int(dims[r, j]) * row_bytes[j]
            if nbytes:
                ops.copy(
                    flat_bytes(out)[row_at[j] : row_at[j] + nbytes], recv[offset : offset + nbytes]
                )
            row_at[j] += nbytes
            offset += nbytes


# ------------------------------------------------------------------ broadcast
def pack_bytes(ops, arrays, buf) -> None:
    """The bytes of *arrays*, back to back, into *buf*."""
    offset = 0
    for array in arrays:
        if array.nbytes:
            ops.copy(buf[offset : offset + array.nbytes], flat_bytes(array))
        offset += array.nbytes


def unpack_bytes(ops, buf, arrays, skip=()) -> None:
    """*buf*'s bytes, back to back, out into *arrays*; an index in *skip* keeps
    its array as it is (its share of *buf* is passed over)."""
    offset = 0
    for i, array in enumerate(arrays):
        if array.nbytes and i not in skip:
            ops.copy(flat_bytes(array), buf[offset : offset + array.nbytes])
        offset += array.nbytes
