"""A cached plan's first batch, staged: this rank's part copied into shared memory early.

Where a loop runs the same cached plan step after step, and its first batch is
an allreduce the set reduces through the node's shared memory in one chunk, a
rank that waits on exactly that plan's bits copies its data for its peers'
portions into its area *before* the engine's status exchange
(:meth:`Stager.stage`).  The exchange then tells every rank whether every
member staged (no UNSTAGED flag) and whether the plan now due is that plan; if
so, it has served as the shared-memory allreduce's first barrier, and
:meth:`Stager.run` does the rest.  A rank that cannot stage (a joined rank, a
timeline being recorded) says so, and every rank takes the unstaged path.
"""

from __future__ import annotations

from ...ops import ReduceOp

__all__ = ["Stager"]


class Stager:
    """A cached plan's first batch (an allreduce), run staged: :meth:`stage`
    before the engine's status exchange, :meth:`run` after it, on every member,
    where every member staged (the exchange tells); the plan's other batches
    then run as usual."""

    __slots__ = ("_executor", "_batch", "_set_size", "_wire", "_op", "_shm")

    def __init__(self, executor, batch, set_size: int, wire, shm):
        self._executor = executor  # the dispatcher's Context: reduction, finish_batch
        self._batch = batch
        self._set_size = set_size
        self._wire = wire
        self._op = ReduceOp(batch[0].params.op)
        self._shm = shm

    def stage(self) -> bool:
        """Copy this rank's batch in ahead of the exchange; False where it cannot be
        (an entry of the batch is not here: a joined rank's)."""
        tensors = self._executor.reduction(self._batch, self._set_size)
        if None in tensors.entries:
            return False
        return self._shm.stage(tensors, self._wire, self._op, layout_key=self._batch)

    def run(self) -> None:
        """Collective: reduce the staged batch and finish its entries."""
        self._shm.run_staged()
        self._executor.finish_batch(self._batch)
