"""Adasum: adaptive summation of gradients (op=hvdlite.Adasum).

Two gradients a and b are combined as::

    combine(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

so orthogonal gradients add up, identical gradients are kept once, and
anything in between is blended.  A zero vector contributes nothing
(combine(0, b) = b).  The combination is symmetric in a and b.

Over 2**k ranks the vectors are combined pairwise as a binary tree: level
``d = 1, 2, 4, ...`` combines the result of ranks ``[i, i + d)`` with that of
``[i + d, i + 2d)`` for ``i`` a multiple of ``2d``.  At 4 ranks the result is
``combine(combine(x0, x1), combine(x2, x3))``.

The tree runs by recursive vector halving with distance doubling: at level d
each rank trades half of the index range it holds with its partner
``rank ^ d`` (the lower rank keeps the first half), so the 2d ranks of a
sub-group together hold both vectors being combined, each rank a distinct
slice.  Their partial dot products and squared norms are summed over the
sub-group (a butterfly of small Sendrecvs, which gives every rank bit-identical
sums), each rank combines its slice, and the next level halves again.  At the
end every rank owns one slice of the result; the halvings are undone in reverse
order, each step trading slices with the same partner, so every rank ends with
the whole vector.

Cross-rank contract: every rank of *comm* calls :func:`adasum_allreduce` with
a vector of the same length; every rank gets the same result.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from ...ops import ReduceOp
from ...util.dtypes import reduce_dtype
from ...util.paths import Transport
from ..messages import Kind
from .peer import Context, Peer

__all__ = ["adasum_allreduce"]

_TAG = 0x4144  # point-to-point traffic of this module on the process set's communicator


def _sub_group_sum(comm, rank: int, values: np.ndarray, group_size: int) -> np.ndarray:
    """Sum *values* over the *group_size* ranks sharing ``rank // group_size``."""
    total = values.copy()
    other = np.empty_like(total)
    step = 1
    while step < group_size:
        partner = rank ^ step
        comm.Sendrecv([total, MPI.DOUBLE], partner, _TAG, [other, MPI.DOUBLE], partner, _TAG)
        total += other  # x + y == y + x in IEEE arithmetic: partners agree bit for bit
        step *= 2
    return total


def _coefficient(dot: float, norm_sq: float) -> float:
    # A zero vector's coefficient does not matter (it multiplies zeros); 1 keeps it finite.
    return 1.0 - dot / (2.0 * norm_sq) if norm_sq > 0.0 else 1.0


def adasum_allreduce(comm, data: np.ndarray) -> np.ndarray:
    """Adasum-combine *data* (a 1-d array) over every rank of *comm*; returns float64.

    *comm* must have a power-of-two number of ranks (ValueError otherwise).
    """
    size = comm.Get_size()
    if size < 1 or size & (size - 1):
        raise ValueError(
            f"Adasum needs a power-of-two number of ranks, the communicator has "
            f"{size}; use op=Average or run on 2, 4, 8... ranks."
        )
    vec = np.array(data, dtype=np.float64).reshape(-1)  # always a private copy
    if size == 1:
        return vec
    rank = comm.Get_rank()
    lo, hi = 0, vec.size
    levels = []  # (kept range, given range, partner) per level, for the way back
    distance = 1
    while distance < size:
        partner = rank ^ distance
        lower = not rank & distance
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if lower else ((mid, hi), (lo, mid))
        mine = vec[keep[0] : keep[1]]
        theirs = np.empty_like(mine)
        comm.Sendrecv(
            [vec[give[0] : give[1]], MPI.DOUBLE], partner, _TAG, [theirs, MPI.DOUBLE], partner, _TAG
        )
        dot = float(np.dot(mine, theirs))
        mine_sq = float(np.dot(mine, mine))
        theirs_sq = float(np.dot(theirs, theirs))
        # Slot 1 is always the lower half-group's vector, slot 2 the upper one's.
        partial = np.array([dot, mine_sq, theirs_sq] if lower else [dot, theirs_sq, mine_sq])
        dot, lower_sq, upper_sq = _sub_group_sum(comm, rank, partial, 2 * distance)
        c_lower, c_upper = _coefficient(dot, lower_sq), _coefficient(dot, upper_sq)
        c_mine, c_theirs = (c_lower, c_upper) if lower else (c_upper, c_lower)
        mine *= c_mine
        theirs *= c_theirs
        mine += theirs
        levels.append((keep, give, partner))
        lo, hi = keep
        distance *= 2
    for keep, give, partner in reversed(levels):
        comm.Sendrecv(
            [vec[keep[0] : keep[1]], MPI.DOUBLE],
            partner,
            _TAG,
            [vec[give[0] : give[1]], MPI.DOUBLE],
            partner,
            _TAG,
        )
    return vec


class AdasumPeer(Peer):
    """Host allreduces with ``op=Adasum``: one tensor at a time, in float64, through
    :func:`adasum_allreduce`; a joined rank contributes zeros."""

    transport = Transport.ADASUM

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def accepts(self, p, comm, nbytes: int) -> bool:
        return p.kind == Kind.ALLREDUCE and p.op == ReduceOp.ADASUM

    def run(self, batch, comm) -> None:
        for response in batch:
            p = response.params
            entry = self.ctx.lookup(response.key)
            for i, shape in enumerate(p.shapes):
                if entry is None:
                    data = np.zeros(math.prod(shape), dtype=reduce_dtype(p.dtypes[i]))
                else:
                    data = entry.inputs[i].reshape(-1).astype(np.float64) * p.prescale
                result = adasum_allreduce(comm, data)
                if entry is not None:
                    np.multiply(
                        result, p.postscale, out=entry.outputs[i].reshape(-1), casting="unsafe"
                    )
            if entry is not None:
                self.ctx.finish(entry, None)
