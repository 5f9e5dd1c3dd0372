"""The collectives both Lightning strategies offer, on hvdlite's process sets.

``reduce``/``all_reduce``, ``all_gather``, ``broadcast`` and ``barrier`` are what
``self.log(..., sync_dist=True)``, ``self.all_gather``, Lightning's callbacks and
Fabric's ``fabric.all_reduce`` (...) call.  A strategy mixes
:class:`HvdliteCollectives` in before Lightning's base class and sets
``self.process_set``.

Cross-rank contract: every rank of the strategy's process set (or of the set
passed as ``group``) makes the same calls in the same order, as with
``torch.distributed``.
"""

from __future__ import annotations

import torch
from lightning.fabric.utilities.distributed import ReduceOp

import hvdlite.torch as hvd

__all__ = ["HvdliteCollectives"]

_TORCH_OPS = (("SUM", hvd.Sum), ("MAX", hvd.Max), ("MIN", hvd.Min), ("AVG", hvd.Average))
_OPS = {"mean": hvd.Average, "avg": hvd.Average, "sum": hvd.Sum, "max": hvd.Max, "min": hvd.Min}


class HvdliteCollectives:
    """Lightning's collective methods over ``self.process_set``."""

    process_set: hvd.ProcessSet

    def _root(self, src: int = 0) -> int:
        """The global rank of the set's rank *src*."""
        return self.process_set.ranks[src]

    def _set(self, group):
        # None is also what Lightning passes as torch.distributed.group.WORLD, which
        # is None while torch.distributed is not initialized (hvdlite never does).
        if group is None or group is self.process_set:
            return self.process_set
        if isinstance(group, hvd.ProcessSet):
            return group
        raise ValueError(
            f"group={group!r}: {type(self).__name__}'s collectives take an hvdlite "
            "ProcessSet (registered at hvd.init(process_sets=[...]) or with "
            "hvd.add_process_set), or None for the strategy's own set."
        )

    def reduce(self, tensor, group=None, reduce_op: ReduceOp | str | None = "mean"):
        """Reduce *tensor* over the ranks (``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or
        a ``torch.distributed.ReduceOp``); anything but a tensor comes back as it is."""
        if not isinstance(tensor, torch.Tensor):
            return tensor
        op = _reduce_op(reduce_op, type(self).__name__)
        if op is hvd.Average and not (tensor.is_floating_point() or tensor.is_complex()):
            tensor = tensor.to(torch.get_default_dtype())
        return hvd.allreduce(tensor.detach(), op=op, process_set=self._set(group))

    def all_reduce(self, tensor, group=None, reduce_op: ReduceOp | str | None = "mean"):
        """Fabric's name for :meth:`reduce`."""
        return self.reduce(tensor, group=group, reduce_op=reduce_op)

    def all_gather(self, tensor: torch.Tensor, group=None, sync_grads: bool = False):
        """Every rank's *tensor* (same shape on each), stacked: ``[world_size, *shape]``.
        With ``sync_grads`` the gradient flows back to each rank's input."""
        stacked = tensor.unsqueeze(0)
        process_set = self._set(group)
        if sync_grads:
            return hvd.allgather(stacked, process_set=process_set)
        with torch.no_grad():
            return hvd.allgather(stacked.detach(), process_set=process_set)

    def broadcast(self, obj, src: int = 0):
        return hvd.broadcast_object(obj, root_rank=self._root(src), process_set=self.process_set)

    def barrier(self, name: str | None = None) -> None:
        hvd.barrier(process_set=self.process_set)


def _reduce_op(reduce_op, strategy: str):
    if reduce_op is None:
        return hvd.Average
    if isinstance(reduce_op, str):
        op = _OPS.get(reduce_op.lower())
        if op is not None:
            return op
    else:
        for name, op in _TORCH_OPS:
            if reduce_op == getattr(ReduceOp, name, None):
                return op
    raise ValueError(
        f"reduce_op={reduce_op!r}: {strategy}.reduce takes 'mean', 'sum', 'max', 'min' "
        "or torch.distributed.ReduceOp.SUM/MAX/MIN/AVG."
    )
