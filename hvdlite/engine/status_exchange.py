"""The per-cycle status exchange: one non-blocking bitwise-AND allreduce.

Every rank of the job calls :meth:`StatusExchange.exchange` once per cycle, with
vectors of the same layout (:mod:`hvdlite.engine.status`), and every rank gets
back the same :class:`~hvdlite.engine.status.Status`.  A waiter never spins on
a core while a peer is late: it tests the request with a back-off, and gives
up after ``HVDLITE_COLLECTIVE_TIMEOUT`` with an error naming the wait.
"""

from __future__ import annotations

from mpi4py import MPI

from ..util.backoff import Backoff
from .status import Codec, Layout, Status, alone

__all__ = ["StatusExchange"]

#: Peers in step arrive within microseconds, so a waiter first looks in a loop
#: that yields the core (long for a caller blocked on a handle, short on the
#: engine thread, beside the framework's compute), then sleeps between looks, so
#: a slow peer never costs this rank a core.
_WAIT_CALLER = Backoff(floor=0.00002, cap=0.001, ratio=0.5, spin=0.005)
_WAIT_THREAD = Backoff(floor=0.00002, cap=0.001, ratio=0.5, spin=0.0002)


class StatusExchange:
    """This rank's side of the exchange on the engine's control communicator."""

    def __init__(self, comm, limit):
        self._comm = comm
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._limit = limit  # the engine's WaitLimit
        self._codec = Codec()
        self._layouts: dict[tuple, tuple] = {}  # (bits, after a wait, root words) -> layout

    def exchange(
        self,
        flags: int,
        bits,
        joined: bool,
        after_wait: bool,
        rang: bool,
        tuning,
        on_engine_thread: bool,
    ) -> Status:
        """Collective: this rank's *flags* and cache *bits* (a CacheBits) against
        every rank's.  *rang*: this rank rang the doorbell; *tuning*: autotune's
        link, whose words rank 0 sends, or None."""
        root_words, root = (tuning.words, tuning.outgoing()) if tuning is not None else (0, None)
        shape = (bits.cache.num_bits, after_wait, root_words)
        try:
            layout, full = self._layouts[shape]
        except KeyError:
            layout = Layout.of(shape[0], self._size, after_wait, root_words)
            full = (1 << (layout.bit_words * 64)) - 1
            self._layouts[shape] = (layout, full)
        hit_and, hit_or = bits.status_masks(joined, full)
        invalid = bits.invalid_mask
        if self._size == 1:
            return alone(layout, flags, hit_and, hit_or, invalid, rang, root)
        vector = self._codec.encode(
            layout, flags, hit_and, hit_or, invalid, self._rank if rang else None, root
        )
        req = self._comm.Iallreduce(MPI.IN_PLACE, vector, MPI.BAND)
        wait = _WAIT_THREAD if on_engine_thread else _WAIT_CALLER
        if not wait.wait_for(req.Test, timeout=self._limit.seconds):
            raise self._limit.error("in the engine's status exchange")
        return self._codec.decode(layout, vector)
