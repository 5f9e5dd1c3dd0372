"""The doorbell: how a rank with new work wakes peers that stopped cycling.

After a cycle that needs no follow-up, every rank stops cycling and waits.
The first rank with new work sends one byte to every other rank (it *rings*);
a waiting rank that receives it resumes cycling.  The next status vector says
how many ranks rang, so each rank receives exactly the doorbells sent before
that cycle and none is left over for a later wait.

Cross-rank contract: each rank rings at most once per wait; the engine's
private communicator carries doorbells under their own tag.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..util.backoff import Backoff

__all__ = ["Doorbell"]

_TAG = 77
_DRAIN_WAIT = Backoff(floor=0.00001, cap=0.001, ratio=0.5, spin=0.001)


class Doorbell:
    """A posted receive for peers' rings, and this rank's own ring."""

    def __init__(self, comm):
        self.comm = comm
        rank = comm.Get_rank()
        self.peers = [r for r in range(comm.Get_size()) if r != rank]
        self._inbox = np.zeros(1, dtype=np.uint8)
        self._outbox = np.ones(1, dtype=np.uint8)  # what a ring sends (never written)
        self.rang = False  # this rank rang since the last drain
        self.rings = 0  # how often this rank rang, for tests and diagnostics
        self._received = 0  # rings received since the last drain
        self._request = self._post()

    def _post(self):
        return self.comm.Irecv(self._inbox, MPI.ANY_SOURCE, _TAG)

    def ring(self) -> None:
        """Wake every peer (once per wait)."""
        peers = self.peers
        if len(peers) == 1:
            self.comm.Send(self._outbox, dest=peers[0], tag=_TAG)
        elif peers:
            MPI.Request.Waitall([self.comm.Isend(self._outbox, dest=r, tag=_TAG) for r in peers])
        self.rang = True
        self.rings += 1

    def heard(self) -> bool:
        """Did a peer ring? (Never blocks.)"""
        if self._request.Test():
            self._received += 1
            self._request = self._post()
            return True
        return False

    def drain(self, ringers: int, timeout: float | None = None) -> bool:
        """Receive exactly the rings of *ringers* ranks (this one included, if it rang).

        The rings were sent before the status exchange that counted them, so they
        arrive at once; with *timeout* (seconds) give up after that long: False.
        """
        expected = ringers - (1 if self.rang else 0)
        while self._received < expected:
            if timeout is None:
                self._request.Wait()
            elif not _DRAIN_WAIT.wait_for(self._request.Test, timeout=timeout):
                return False
            self._received += 1
            self._request = self._post()
        self._received = 0
        self.rang = False
        return True

    def close(self) -> None:
        try:
            self._request.Cancel()
            self._request.Wait()
        except MPI.Exception:
            pass
