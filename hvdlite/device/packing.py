"""Packing a batch into one buffer and back: written once, for host and device arrays.

Every collective that fuses tensors lays them out the same way on the host
(numpy, MPI) and on a device (CuPy, NCCL or CUDA-aware MPI); only the copies
differ.  The functions here take the copies from an *ops* object, which
:data:`NUMPY` provides for host arrays and every
:class:`~hvdlite.device.backend.ArrayBackend` provides for its own:

- ``copy_many(copies)``: every :class:`Copy` of a list, ``dst[...] = src *
  factor`` cast to dst's dtype (src None: zeros).  One call per pack or unpack,
  whatever the number of tensors: a device backend runs it as a constant
  number of launches, which is what keeps the GPU path's cost per batch flat;
- ``concatenate(srcs, dst)`` and ``split(src, dsts)``: the flat *srcs* back to
  back into *dst*, and back out (the unscaled single-dtype pack and unpack);
- ``copy(dst, src)`` and ``scale(dst, src, factor)``: one array;
- ``flat(x)``, ``as_bytes(x)`` and ``window(flat, start, count)``: the views a
  copy reads or writes (a device backend may answer with a bare pointer record,
  cheaper than an array view, which only its ``copy_many`` reads).

Where a copy scales, the ops decide in which precision: numpy computes in the
destination's (float16 tensors are packed into float32 and scaled there, the
CPU rule of Horovod); a device backend rounds to the caller's tensor dtype
(Horovod's CUDA rule, see :mod:`hvdlite.device.backend`).

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
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..ops import ReduceOp
from ..util import half_casts
from ..util.splits import even_split
from .buffers import Reduction

__all__ = [
    "NUMPY",
    "Copy",
    "Gathered",
    "Scattered",
    "scattered_of",
    "flat_bytes",
    "pack",
    "unpack",
    "reduce_alone",
    "rank_counts",
    "pack_rank_major",
    "pack_rank_pieces",
    "unpack_shards",
    "unpack_rank_major",
    "pack_bytes",
    "unpack_bytes",
]


class Copy(NamedTuple):
    """One copy of a batch: ``dst[...] = src * factor``, cast to dst's dtype;
    *src* None writes zeros (a joined rank's share of a fused buffer)."""

    dst: object
    src: object
    factor: float = 1.0


class _NumpyOps:
    """The copies of :mod:`hvdlite.device.packing` for numpy arrays."""

    @staticmethod
    def copy(dst, src) -> None:
        half_casts.copy(dst, src)

    @staticmethod
    def scale(dst, src, factor: float) -> None:
        half_casts.copy(dst, src, factor)

    @staticmethod
    def concatenate(srcs, dst) -> None:
        np.concatenate(srcs, out=dst)

    @staticmethod
    def split(src, dsts) -> None:
        offset = 0
        for dst in dsts:
            dst[...] = src[offset : offset + dst.size]
            offset += dst.size

    @staticmethod
    def flat(x):
        return x.reshape(-1)

    @staticmethod
    def as_bytes(x):
        return x.reshape(-1).view(np.uint8)

    @staticmethod
    def window(flat, start: int, count: int):
        return flat[start : start + count]

    @staticmethod
    def copy_many(copies: Sequence[Copy]) -> None:
        for dst, src, factor in copies:
            if src is None:
                dst.fill(0)
            else:  # a float16/bfloat16 tensor is widened, then scaled in float32
                half_casts.copy(dst, src, factor)


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


def scattered_of(batch, entries, size: int) -> list[Scattered]:
    """The tensors of a reducescatter *batch* (responses) over a set of *size*, with
    each response's local entry from *entries*; Average's division folded into each
    postscale."""
    tensors = []
    for response, entry in zip(batch, entries, strict=True):
        p = response.params
        post = p.postscale / size if p.op == ReduceOp.AVERAGE else p.postscale
        for i, (dt, shape) in enumerate(zip(p.dtypes, p.shapes)):
            tensors.append(
                Scattered(
                    entry,
                    entry.inputs[i],
                    tuple(shape),
                    np.dtype(dt),
                    p.prescale,
                    post,
                    even_split(shape[0], size),
                )
            )
    return tensors


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
        # The common case (no scaling, one dtype): one plain concatenation.
        ops.concatenate([ops.flat(inp) for inp in inputs], buf)
        return
    copies, offset, window, flat = [], 0, ops.window, ops.flat
    for inp, count, pre in zip(inputs, tensors.counts, prescales):
        copies.append(Copy(window(buf, offset, count), None if inp is None else flat(inp), pre))
        offset += count
    ops.copy_many(copies)


def unpack(ops, tensors: Reduction, buf) -> None:
    """The reduced *buf* out into the outputs: postscaled, cast back; nothing
    for a joined rank."""
    outputs = tensors.outputs
    if all(out is not None and out.dtype == buf.dtype for out in outputs) and all(
        post == 1.0 for post in tensors.postscales
    ):
        # The common case (no scaling, one dtype, nobody joined): one plain split.
        ops.split(buf, [ops.flat(out) for out in outputs])
        return
    copies, offset, window, flat = [], 0, ops.window, ops.flat
    for out, count, post in zip(tensors.outputs, tensors.counts, tensors.postscales):
        if out is not None:
            copies.append(Copy(flat(out), window(buf, offset, count), post))
        offset += count
    ops.copy_many(copies)


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
    prescaled and cast to send's dtype (:func:`pack_rank_pieces` in one piece)."""
    counts = rank_counts(tensors, len(starts))
    pack_rank_pieces(ops, tensors, send, [[count] for count in counts], [list(starts)])


def pack_rank_pieces(ops, tensors: Sequence[Scattered], send, cuts, places) -> list:
    """Each rank's block of :func:`pack_rank_major` (its rows of every tensor,
    prescaled and cast to send's dtype) cut into pieces: piece i of rank r's block,
    its next ``cuts[r][i]`` elements, from ``places[i][r]`` of *send*.  Returns
    each copy's (place, elements, tensor index), in *send*'s order."""
    copies, runs = [], []
    taken = [0] * len(tensors)  # where each tensor's rows of the next rank start
    for rank, rank_cuts in enumerate(cuts):
        segments = deque()  # (tensor index, start, elements) of this rank's block
        for j, t in enumerate(tensors):
            n = t.rows[rank] * t.row_elements
            if n:
                segments.append((j, taken[j], n))
            taken[j] += n
        for piece, n in enumerate(rank_cuts):
            at = places[piece][rank]
            while n:
                j, start, left = segments[0]
                take, t = min(n, left), tensors[j]
                source = ops.window(ops.flat(t.input), start, take)
                copies.append(Copy(ops.window(send, at, take), source, t.prescale))
                runs.append((at, take, j))
                if take == left:
                    segments.popleft()
                else:
                    segments[0] = (j, start + take, left - take)
                at, n = at + take, n - take
    ops.copy_many(copies)
    return sorted(runs)


def unpack_shards(ops, tensors: Sequence[Scattered], recv, me: int, outputs) -> None:
    """This rank's reduced region *recv* out into *outputs* (one per tensor):
    postscaled, cast back."""
    copies, offset = [], 0
    for t, out in zip(tensors, outputs):
        n = t.rows[me] * t.row_elements
        if n:
            copies.append(Copy(ops.flat(out), ops.window(recv, offset, n), t.postscale))
        offset += n
    ops.copy_many(copies)


def unpack_rank_major(
    ops, recv, starts: Sequence[int], dims, row_bytes: Sequence[int], outputs
) -> None:
    """A grouped allgather's bytes (rank r's rows of every tensor from
    ``starts[r]``) into the tensors' *outputs*."""
    copies, row_at = [], [0] * len(outputs)
    for r, offset in enumerate(starts):
        for j, out in enumerate(outputs):
            nbytes = int(dims[r, j]) * row_bytes[j]
            if nbytes:
                copies.append(
                    Copy(
                        ops.window(ops.as_bytes(out), row_at[j], nbytes),
                        ops.window(recv, offset, nbytes),
                    )
                )
            row_at[j] += nbytes
            offset += nbytes
    ops.copy_many(copies)


# ------------------------------------------------------------------ broadcast
def pack_bytes(ops, arrays, buf) -> None:
    """The bytes of *arrays*, back to back, into *buf*."""
    copies, offset = [], 0
    for array in arrays:
        if array.nbytes:
            copies.append(Copy(ops.window(buf, offset, array.nbytes), ops.as_bytes(array)))
        offset += array.nbytes
    ops.copy_many(copies)


def unpack_bytes(ops, buf, arrays, skip=()) -> None:
    """*buf*'s bytes, back to back, out into *arrays*; an index in *skip* keeps
    its array as it is (its share of *buf* is passed over)."""
    copies, offset = [], 0
    for i, array in enumerate(arrays):
        if array.nbytes and i not in skip:
            copies.append(Copy(ops.as_bytes(array), ops.window(buf, offset, array.nbytes)))
        offset += array.nbytes
    ops.copy_many(copies)
