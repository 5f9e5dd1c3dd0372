"""Reduce-scatter through one node's shared memory: each rank sums only the part it keeps.

A reduce-scatter over MPI on one node packs every tensor into a fusion buffer,
and MPI's own shared-memory cells copy it again; the result is a fraction of
that.  Here a rank copies the parts of its tensors that belong to the other
ranks straight into its areas of the set's window
(:class:`~hvdlite.engine.transports.shm.SharedMemoryAllreduce`), and after a
barrier reduces its own part, reading its own data where it is and the peers'
from their areas, into its output.  Nothing full-size is allocated, and nothing
is copied out: a rank's output is its part (the sharded optimizer's gradients
on one node, which then never exist whole outside the backward pass).

The batch moves in *rounds*.  One area of every rank is cut into one
*segment* per rank; segment p of rank q's area holds q's data for rank p's
parts of the round's pieces.  A piece is the same range of every rank's part
of one tensor (parts differ by at most a row), so one cut serves all ranks.
Rounds alternate between a rank's two areas: a rank writes the area of round
k+1 only after the barrier of round k, which no peer reaches before it has
finished reading round k-1 from that area.  So a round costs one barrier, and
the collective one more at its end (the next collective may write any area).

Each element is reduced by one rank, in rank order (rank 0's value first), so
the result does not depend on which rank reduced it.

Cross-rank contract: every member of the set calls :func:`reduce_scatter` with
the same tensors' agreed shapes, dtypes, scale factors and wire dtype, in the
same order (the engine's response list guarantees it).
"""

from __future__ import annotations

import numpy as np

from ...util import half_casts
from ...util.splits import offsets

__all__ = ["ScatterPlan", "reduce_scatter", "reduce_in_rank_order"]

#: A piece that needs a cast or a postscale is reduced a block at a time and
#: handed on while the block is still in cache.
BLOCK_BYTES = 256 << 10


class ScatterPlan:
    """What every rank derives alike from a batch's agreed facts: the element
    range of each rank's part of every tensor (``bounds[i][p]`` to
    ``bounds[i][p + 1]``) and the rounds, each a list of pieces
    ``(tensor, offset in every part, offset in the segment, count)``."""

    __slots__ = ("bounds", "rounds")

    def __init__(self, tensors, size: int, capacity: int):
        self.bounds = []
        for t in tensors:
            starts = offsets(t.rows) + [sum(t.rows)]
            self.bounds.append([r * t.row_elements for r in starts])
        self.rounds = []
        pieces, fill = [], 0
        for i, bounds in enumerate(self.bounds):
            longest = max(bounds[p + 1] - bounds[p] for p in range(size))
            done = 0
            while done < longest:
                n = min(longest - done, capacity - fill)
                pieces.append((i, done, fill, n))
                fill += n
                done += n
                if fill == capacity:
                    self.rounds.append(pieces)
                    pieces, fill = [], 0
        if pieces:
            self.rounds.append(pieces)


def reduce_scatter(window, tensors, wire: np.dtype, ufunc) -> list[np.ndarray]:
    """This rank's dim-0 shard of each reduced tensor (a
    :class:`~hvdlite.device.packing.Scattered` each: prescaled and cast to *wire*
    on the way in, postscaled and cast back on the way out), through *window*'s
    areas (its ``areas()``, ``rank``, ``size`` and collective ``sync()``)."""
    size, rank = window.size, window.rank
    areas = window.areas()  # [contribution areas, result areas], bytes, by rank
    capacity = (min(a.nbytes for a in areas[0]) // wire.itemsize // size) & ~15
    plan = ScatterPlan(tensors, size, capacity)
    ins = [t.input.reshape(-1) for t in tensors]
    outs = [np.empty((t.rows[rank],) + tuple(t.shape[1:]), dtype=t.dtype) for t in tensors]
    flat_outs = [o.reshape(-1) for o in outs]
    direct = [t.dtype == wire and t.prescale == 1.0 for t in tensors]
    scratch = None
    for k, pieces in enumerate(plan.rounds):
        round_areas = [a[: capacity * size * wire.itemsize].view(wire) for a in areas[k % 2]]
        _copy_in(tensors, plan, ins, direct, pieces, round_areas[rank], capacity, size, rank)
        window.sync()
        segments = [a[rank * capacity : (rank + 1) * capacity] for a in round_areas]
        for i, offset, at, n in pieces:
            lo = plan.bounds[i][rank] + offset
            n = min(n, plan.bounds[i][rank + 1] - lo)
            if n <= 0:
                continue
            out = flat_outs[i][offset : offset + n]
            parts = [s[at : at + n] for s in segments]
            if direct[i]:
                parts[rank] = ins[i][lo : lo + n]
            post = tensors[i].postscale
            if direct[i] and post == 1.0:
                reduce_in_rank_order(ufunc, parts, out)
                continue
            if scratch is None:
                scratch = np.empty(BLOCK_BYTES // wire.itemsize, dtype=wire)
            for start in range(0, n, scratch.size):
                m = min(scratch.size, n - start)
                block = scratch[:m]
                reduce_in_rank_order(ufunc, [part[start : start + m] for part in parts], block)
                half_casts.copy(out[start : start + m], block, post)
    window.sync()
    return outs


def _copy_in(tensors, plan, ins, direct, pieces, area, capacity: int, size: int, rank: int):
    """This rank's data of a round's *pieces* into its *area*: for each rank p,
    its part's range into segment p (prescaled, cast); this rank's own range too
    where it cannot be read in place."""
    for i, offset, at, n in pieces:
        bounds, pre = plan.bounds[i], tensors[i].prescale
        for p in range(size):
            if p == rank and direct[i]:
                continue
            lo = bounds[p] + offset
            m = min(n, bounds[p + 1] - lo)
            if m <= 0:
                continue
            half_casts.copy(
                area[p * capacity + at : p * capacity + at + m], ins[i][lo : lo + m], pre
            )


def reduce_in_rank_order(ufunc, parts: list[np.ndarray], out: np.ndarray) -> None:
    """out = parts[0] (op) parts[1] (op) ... in rank order."""
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)
