"""float16 and bfloat16 allreduces across nodes with 16-bit values on the wire,
summed in float32.

MPI has no float16 or bfloat16 sum, so host MPI reduces them in a float32 copy,
and every value crosses the links as 4 bytes.  Where the ranks of a set are on more than one
node, links are what a step waits for, and this peer moves 2 bytes per value:

1. each rank packs its 16-bit inputs (zeros where it has joined) and sends rank
   p the p-th part of them (one ``Alltoallv``; parts as :func:`even_split` cuts);
2. each rank widens the N contributions to its part to float32, multiplies each by
   its tensor's prescale, sums them in rank order, multiplies the sum by the
   postscale and narrows it to the 16-bit dtype: rounded once;
3. one allgather of the 16-bit parts gives every rank the whole result: around
   the set's ring (:mod:`~hvdlite.engine.transports.ring`, at the link's rate),
   or MPI's ``Allgatherv`` where the ring is off.

A rank sends (N-1)/N of the values twice, 2 bytes each: half what a float32
reduce-scatter and allgather (what MPI's large allreduces do) send.  The rule is
the float32 path's: each value scaled and summed in float32, the total rounded
to 16 bits once (to nearest even), so the two agree bit for bit wherever the float32 sum does not
depend on the order of its terms.

Reduce-scatters of float16 and bfloat16 (Sum or Average) take steps 1 and 2
alone (:func:`flat_reduce_scatter`): each rank's rows of every tensor are packed
rank after rank as they are, and the part a rank sums is its own rows of the
result, rounded once.  MPI's reduce-scatter of a float32 copy would carry 4
bytes per value; this carries 2.

With ``HVDLITE_HALF_SUMS_PER_HOP=1`` (:attr:`Routes.half_per_hop`) steps 1 and 2
become a reduce-scatter around the ring whose partial sums are 16-bit: each hop
widens the partial sum it receives, adds its own scaled value in float32 and
rounds to 16 bits before passing it on (the owner of a block applies the
postscale before its rounding).  Each host's one ring edge then carries 2 bytes
per value in both stages, where the ``Alltoallv`` brings a part from every rank
of every other host; the price is one rounding per hop, as with NCCL, gloo and
DDP's fp16 hook.  The sums are still the same on every rank and every run with
the same ring, and at 2 ranks they are the rounded-once sums.  Reduce-scatters
round once whatever that knob says.

The path takes batches of float16 or of bfloat16 (fusion keeps the two apart) of
at least :data:`HALF_WIRE_MIN_BYTES` on every
set whose ranks are on more than one node, ahead of the 32-bit two-level path:
with 16 bits per value a flat exchange moved a step's gradients faster than the
two levels did with 32 (``bench_multihost_tc``).  Where allreduces go through the
two levels, :mod:`~hvdlite.engine.transports.half_two_level` takes these
batches first and runs this module's exchanges (:func:`sum_in_float32`,
:func:`allgather_halves`) inside and across nodes: the one 16-bit wire, on other
communicators.

Cross-rank contract: every member of the set reduces the same batches (agreed
counts, scale factors) in the same order; the engine's response list ensures it.
A reduce-scatter cuts each tensor's rows among the ranks as every reduce-scatter
does (:func:`~hvdlite.util.splits.even_split`).
"""

from __future__ import annotations

import numpy as np

from ...device.buffers import Reduction
from ...device.packing import NUMPY, Scattered, pack_rank_pieces, rank_counts, scattered_of
from ...ops import ReduceOp
from ...timeline.schema import COLLECTIVE, COPY_IN, COPY_OUT
from ...util import half_casts
from ...util.dtypes import HALF_FLOATS
from ...util.paths import Transport
from ...util.splits import even_split, offsets
from ..messages import Kind
from .peer import Context, Peer
from .ring import Ring

__all__ = [
    "HalfWirePeer",
    "HALF_WIRE_MIN_BYTES",
    "sum_in_float32",
    "exchange_halves",
    "add_in_float32",
    "allgather_halves",
    "prescaler",
    "postscaler",
    "ADD_CHUNK",
    "pack_halves",
    "unpack_halves",
    "flat_reduce_scatter",
    "packed_row_pieces",
    "part_postscaler",
    "unpack_part",
]

#: Smallest batch (float32 bytes) worth two collectives: below it one float32
#: allreduce's latency costs less than the bytes saved.
HALF_WIRE_MIN_BYTES = 64 << 10
#: Values widened and added at a time (:func:`add_in_float32`): a float32 sum
#: and one contribution of this many stay in a core's L2 cache, where whole
#: arrays went through memory once per pass.
ADD_CHUNK = 1 << 15
_SUMS = (ReduceOp.SUM, ReduceOp.AVERAGE)
_KINDS = (Kind.ALLREDUCE, Kind.REDUCESCATTER)


class HalfWirePeer(Peer):
    """float16 and bfloat16 Sum and Average allreduces (:meth:`reduce`) and
    reduce-scatters (:meth:`run`) of host arrays, 16 bits on the wire."""

    transport = Transport.HALF_WIRE
    reduces = True

    def __init__(self, ctx: Context, order=None, per_hop: bool = False):
        self.ctx = ctx
        self.order = order  # the set's ring (Routes.ring), or None: MPI's allgather
        #: float16 partial sums around the ring (Routes.half_per_hop; needs *order*)
        self.per_hop = per_hop and order is not None
        self._ring = None

    def accepts(self, p, comm, nbytes: int) -> bool:
        return (
            p.kind in _KINDS
            and p.device == "cpu"
            and p.op in _SUMS
            and nbytes >= HALF_WIRE_MIN_BYTES
            and p.dtypes[0] in HALF_FLOATS
            and all(d == p.dtypes[0] for d in p.dtypes)
        )

    def reduce(self, p0, tensors: Reduction, dtypes, wire, comm, layout_key) -> None:
        tl, pool = self.ctx.timeline, self.ctx.pool
        if tl is not None:
            tl.via(self.transport)
            tl.phase(COPY_IN)
        size = comm.Get_size()
        total = tensors.total()
        counts = even_split(total, size)
        starts = offsets(counts)
        alone = len(tensors) == 1 and tensors.inputs[0] is not None
        half = np.dtype(dtypes[0])  # float16 or bfloat16, the same for the batch
        if self.per_hop:
            part = self._part_per_hop(comm, tensors, half, counts, starts)
        else:
            part = self._part_rounded_once(comm, tensors, half, counts, starts, alone)
        out = tensors.outputs[0]
        direct = alone and out is not None and out.flags.c_contiguous
        result = out.reshape(-1) if direct else pool.get(half, total, slot=5)
        self._allgather(comm, part, result, counts, starts)
        if tl is not None:
            tl.phase(COPY_OUT)
        if not direct:
            unpack_halves(tensors, result)

    def run(self, batch, comm) -> None:
        """A reduce-scatter batch: each rank its rows of every tensor, rounded once."""
        tl = self.ctx.timeline
        if tl is not None:
            tl.via(self.transport)
            tl.phase(COLLECTIVE)
        size = comm.Get_size()
        tensors = scattered_of(batch, [self.ctx.lookup(r.key) for r in batch], size)
        part = self._scattered_part(comm, tensors, tensors[0].dtype)
        if tl is not None:
            tl.phase(COPY_OUT)
        outputs = unpack_part(tensors, part, comm.Get_rank())
        self.ctx.finish_per_entry([t.entry for t in tensors], outputs)

    def _scattered_part(self, comm, tensors, half) -> np.ndarray:
        """This rank's part of a reduce-scatter batch (the two-level peer cuts it
        its own way)."""
        return flat_reduce_scatter(self.ctx.pool, comm, tensors, half)

    def _part_rounded_once(
        self, comm, tensors: Reduction, half, counts, starts, alone
    ) -> np.ndarray:
        """This rank's part of the sum: every rank's 16-bit values for it, gathered
        in one ``Alltoallv``, scaled and summed in float32, rounded once."""
        pool = self.ctx.pool
        if alone:
            send = tensors.inputs[0].reshape(-1)
        else:
            send = pool.get(half, tensors.total(), slot=0)
            pack_halves(tensors, send)
        part = pool.get(half, counts[comm.Get_rank()], slot=4)
        pre, post = prescaler(tensors), postscaler(tensors)
        sum_in_float32(comm, pool, send, counts, pre, part, post, self.ctx.timeline)
        return part

    def _part_per_hop(self, comm, tensors: Reduction, half, counts, starts) -> np.ndarray:
        """This rank's part of the sum, reduced around the ring with 16-bit partial
        sums: each hop widens the partial sum it receives, adds its own scaled
        value in float32 and rounds the result to 16 bits before passing it on."""
        pool, tl = self.ctx.pool, self.ctx.timeline
        ring = self._ring_of(comm)
        buf = pool.get(half, tensors.total(), slot=0)
        pack_halves(tensors, buf)  # always a copy: the ring overwrites it with partial sums
        widest = max(counts)
        acc, term = pool.get(np.float32, widest, slot=2), pool.get(np.float32, widest, slot=3)
        if any(f != 1.0 for f in tensors.prescales):
            first = ring.first_sent  # the block whose partial sum starts here
            block = buf[starts[first] : starts[first] + counts[first]]
            half_casts.widen(block, term[: block.size])
            _scale(term[: block.size], tensors.counts, tensors.prescales, starts[first])
            half_casts.narrow(term[: block.size], block)

        def combine(owner, into, received, last) -> None:  # 16-bit blocks as their bits
            into, received = into.view(half), received.view(half)
            a, t = acc[: into.size], term[: into.size]
            half_casts.widen(received, a)
            half_casts.widen(into, t)
            _scale(t, tensors.counts, tensors.prescales, starts[owner])
            np.add(a, t, out=a)
            if last:
                _scale(a, tensors.counts, tensors.postscales, starts[owner])
            half_casts.narrow(a, into)

        if tl is not None:
            tl.phase(COLLECTIVE)
        ring.reduce_scatter(buf.view(np.uint16), counts, combine)  # MPI moves the bits
        rank = comm.Get_rank()
        return buf[starts[rank] : starts[rank] + counts[rank]]

    def _allgather(self, comm, part, result, counts, starts) -> None:
        """Every rank's *part* into *result* at its start: around the set's ring
        where it has one (at the link's rate), else MPI's ``Allgatherv``."""
        ring = None if self.order is None else self._ring_of(comm)
        allgather_halves(comm, part, result, counts, starts, ring)

    def _ring_of(self, comm) -> Ring:
        if self._ring is None or self._ring.comm is not comm:
            self._ring = Ring(comm, self.order)
        return self._ring


def sum_in_float32(comm, pool, send, counts, scale, out, post=None, timeline=None, slots=(1, 2, 3)):
    """Collective over *comm*: this rank's part of the sum of every rank's 16-bit
    *send*, added in float32 and rounded once into *out*.

    Rank q's part is *counts*[q] values from their offset; every rank sends each
    rank its part of *send* as 16 bits in one ``Alltoallv``
    (:func:`exchange_halves`), and each rank adds the contributions to its part
    (:func:`add_in_float32`: *scale* applied to each contribution, *post* to the
    sum, each called with the index in *send* of the values' first).
    ``slots[0]`` of *pool* holds the received values, ``slots[1:]`` the float32
    scratch."""
    if timeline is not None:
        timeline.phase(COLLECTIVE)
    received, _ = exchange_halves(comm, pool, send, counts, slots[0])
    lo = offsets(counts)[comm.Get_rank()]
    add_in_float32(comm, pool, received, counts, scale, lo, out, post, slots[1:])


def exchange_halves(comm, pool, send, counts, slot: int, nonblocking: bool = False):
    """Collective over *comm*: every rank's 16-bit values of this rank's part of
    *send* (rank q's part: *counts*[q] values from their offset), one after
    another in rank order, in a buffer of *pool* at *slot*.  Returns (that
    buffer, None), or with *nonblocking* (the buffer, the ``Ialltoallv``'s
    request), the buffer to read once the request is done."""
    size, rank = comm.Get_size(), comm.Get_rank()
    mine = counts[rank]
    received = pool.get(send.dtype, mine * size, slot=slot)
    args = (
        [send.view(np.uint16), (counts, offsets(counts))],
        [received.view(np.uint16), ([mine] * size, [mine * q for q in range(size)])],
    )
    if nonblocking:
        return received, comm.Ialltoallv(*args)
    comm.Alltoallv(*args)
    return received, None


def add_in_float32(comm, pool, received, counts, scale, lo: int, out, post=None, slots=(2, 3)):
    """This rank's part of the sum from *received* (:func:`exchange_halves`),
    rounded once into the 16-bit *out*: each rank's contribution widened to
    float32, ``scale(values, at)`` applied where *scale* is given, added in rank
    order (the first widened rather than added to a zero), ``post(sum, at)``
    applied where given, then narrowed (*at*: the index in what was sent of the
    values' first; *lo*: the part's).  The work goes :data:`ADD_CHUNK` values at
    a time, in two float32 buffers of *pool* (*slots*) that stay in the cache;
    each value meets the same operations in the same order as whole arrays
    would."""
    size, mine = comm.Get_size(), counts[comm.Get_rank()]
    width = min(mine, ADD_CHUNK)
    acc = pool.get(np.float32, width, slot=slots[0])
    term = pool.get(np.float32, width, slot=slots[1])
    for start in range(0, mine, ADD_CHUNK):
        stop = min(mine, start + ADD_CHUNK)
        total, values = acc[: stop - start], term[: stop - start]
        for q in range(size):
            into = total if q == 0 else values
            half_casts.widen(received[q * mine + start : q * mine + stop], into)
            if scale is not None:
                scale(into, lo + start)
            if q:
                np.add(total, values, out=total)
        if post is not None:
            post(total, lo + start)
        half_casts.narrow(total, out[start:stop])


def flat_reduce_scatter(pool, comm, tensors: list[Scattered], half) -> np.ndarray:
    """Collective over *comm*: this rank's part of a reduce-scatter batch's sum,
    rounded once (a buffer of *pool*, valid until its next use)."""
    size, me = comm.Get_size(), comm.Get_rank()
    counts = rank_counts(tensors, size)
    starts = offsets(counts)
    send, pre = packed_row_pieces(pool, tensors, half, [[c] for c in counts], [starts])
    part = pool.get(half, counts[me], slot=4)
    post = part_postscaler(tensors, me, starts[me])
    sum_in_float32(comm, pool, send, counts, pre, part, post)
    return part


def packed_row_pieces(pool, tensors: list[Scattered], half, cuts, places):
    """Each rank's rows of every tensor, as they are (not scaled), its block cut
    into pieces (:func:`~hvdlite.device.packing.pack_rank_pieces`: piece i of rank
    r's block, *cuts*[r][i] values, from ``places[i][r]``), in a buffer of *pool*
    at slot 0.  Returns the buffer and ``scale(values, at)`` applying each
    tensor's prescale to the values from index *at* of it, or None where every
    prescale is 1."""
    send = pool.get(half, sum(map(sum, cuts)), slot=0)
    as_they_are = [t._replace(prescale=1.0) for t in tensors]
    runs = pack_rank_pieces(NUMPY, as_they_are, send, cuts, places)
    return send, _scaler([n for _, n, _ in runs], [tensors[j].prescale for _, _, j in runs])


def part_postscaler(tensors: list[Scattered], me: int, lo: int):
    """``scale(values, at)`` applying each tensor's postscale to the values from
    index *at* of what the last exchange sent, where rank *me*'s part starts at
    *lo*; None where every one is 1."""
    counts = [t.rows[me] * t.row_elements for t in tensors]
    scale = _scaler(counts, [t.postscale for t in tensors])
    if scale is None:
        return None
    return lambda values, at: scale(values, at - lo)


def unpack_part(tensors: list[Scattered], part: np.ndarray, me: int) -> list[np.ndarray]:
    """Rank *me*'s *part* cut into a new array per tensor: its rows of each."""
    outputs, at = [], 0
    for t in tensors:
        n = t.rows[me] * t.row_elements
        outputs.append(part[at : at + n].reshape((t.rows[me],) + tuple(t.shape[1:])).copy())
        at += n
    return outputs


def allgather_halves(comm, part, result, counts, starts, ring=None) -> None:
    """Collective over *comm*: every rank's 16-bit *part* into *result* at its
    start, moved as 16 bits: around *ring* (a :class:`Ring` over *comm*) where
    given, else MPI's ``Allgatherv``."""
    part, result = part.view(np.uint16), result.view(np.uint16)
    if ring is None:
        comm.Allgatherv(part, [result, (counts, starts)])
        return
    rank = comm.Get_rank()
    result[starts[rank] : starts[rank] + counts[rank]] = part
    ring.allgather(result, counts)


def prescaler(tensors: Reduction):
    """``scale(values, lo)`` applying each tensor's prescale in float32 (values
    lo.. of the batch), or None where every prescale is 1."""
    return _scaler(tensors.counts, tensors.prescales)


def pack_halves(tensors: Reduction, send: np.ndarray) -> None:
    """The batch's inputs one after another into *send* (zeros for a joined rank)."""
    at = 0
    for inp, count in zip(tensors.inputs, tensors.counts):
        if inp is None:  # a joined rank contributes zeros
            send[at : at + count] = 0
        else:
            send[at : at + count] = inp.reshape(-1)
        at += count


def unpack_halves(tensors: Reduction, result: np.ndarray) -> None:
    """*result* cut into the batch's outputs (none on a joined rank)."""
    at = 0
    for out, count in zip(tensors.outputs, tensors.counts):
        if out is not None:
            out[...] = result[at : at + count].reshape(out.shape)
        at += count


def postscaler(tensors: Reduction):
    """``scale(values, lo)`` applying each tensor's postscale in float32 (values
    lo.. of the batch), or None where every postscale is 1."""
    return _scaler(tensors.counts, tensors.postscales)


def _scaler(counts, factors):
    """``scale(values, lo)`` for these per-tensor *factors*; None where all are 1,
    one multiplication where all are the same (Average's postscale)."""
    first = factors[0] if factors else 1.0
    if all(f == first for f in factors):
        if first == 1.0:
            return None
        factor = np.float32(first)
        return lambda values, lo: np.multiply(values, factor, out=values)
    return lambda values, lo: _scale(values, counts, factors, lo)


def _scale(values: np.ndarray, counts, factors, lo: int) -> None:
    """Multiply the elements of *values* (elements lo.. of the batch) by their
    tensor's factor, in float32."""
    if all(f == 1.0 for f in factors):
        return
    at, hi = 0, lo + values.size
    for count, factor in zip(counts, factors):
        a, b = max(at, lo), min(at + count, hi)
        if a < b and factor != 1.0:
            np.multiply(values[a - lo : b - lo], np.float32(factor), out=values[a - lo : b - lo])
        at += count
        if at >= hi:
            break
