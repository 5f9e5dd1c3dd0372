"""Start-of-training helpers: make every rank begin from the root's model,
optimizer state and Python objects.

Cross-rank contract: every rank of the process set calls each helper with
the same structure (same parameter names/shapes, same optimizer layout);
only the root's values matter and every rank ends with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from hvdlite import basics as _basics
from hvdlite import objects as _objects
from hvdlite.process_sets import global_process_set
from hvdlite.torch.mpi_ops import broadcast_async_, synchronize

__all__ = [
    "broadcast_parameters",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
]


def _broadcast_tensors_(tensors, root_rank: int, names, process_set) -> None:
    """Overwrite *tensors* in place with the root's, all broadcasts in flight at once."""
    pending = []
    for tensor, name in zip(tensors, names, strict=True):
        view = tensor.detach()
        staging = view if view.is_contiguous() else view.contiguous()
        pending.append(
            (broadcast_async_(staging, root_rank, name, process_set=process_set), view, staging)
        )
    for handle, view, staging in pending:
        synchronize(handle)
        if staging is not view:
            view.copy_(staging)


def broadcast_parameters(params, root_rank: int, process_set=global_process_set) -> None:
    """Overwrite parameters in place with the root rank's values.

    ``params`` is a ``model.state_dict()``, ``model.named_parameters()``, or a
    list of tensors (``model.parameters()``).  Every rank must pass the same
    structure; ``root_rank`` is a global rank.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items(), key=lambda kv: str(kv[0]))
    elif isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        raise ValueError(
            f"invalid params of type: {type(params).__name__}; pass a "
            f"state_dict, named_parameters() or a list of tensors"
        )
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    items = [(name, p) for name, p in items if p is not None]
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise ValueError(
                f"broadcast_parameters: {name or 'an entry'} is a "
                f"{type(p).__name__}, not a torch.Tensor"
            )
    _broadcast_tensors_([p for _, p in items], root_rank, [n for n, _ in items], process_set)


class _Slot(NamedTuple):
    """Stands in for a tensor in the pickled skeleton of a state dict."""

    index: int
    shape: tuple
    dtype: torch.dtype
    device_type: str = "cpu"  # the root's tensor's device type ("cuda": this rank's GPU)


def _strip(obj, tensors: list):
    """*obj* with every tensor replaced by a :class:`_Slot`; tensors appended."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return _Slot(len(tensors) - 1, tuple(obj.shape), obj.dtype, obj.device.type)
    if isinstance(obj, dict):
        return {k: _strip(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_strip(v, tensors) for v in obj)
    return obj


def _fill(obj, tensors: list):
    """Inverse of :func:`_strip` on a non-root rank: allocate a tensor per slot."""
    if isinstance(obj, _Slot):
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if obj.device_type == "cuda"
            else "cpu"
        )
        tensors.append(torch.empty(obj.shape, dtype=obj.dtype, device=device))
        return tensors[-1]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_fill(v, tensors) for v in obj)
    return obj


def broadcast_optimizer_state(
    optimizer, root_rank: int, model=None, process_set=global_process_set
) -> None:
    """Give every rank the root rank's optimizer state and hyperparameters.

    The root's ``state_dict()`` travels as a small pickled skeleton plus one
    in-place broadcast per state tensor, and non-root ranks load it with
    ``load_state_dict``.  As in Horovod, an optimizer whose state is still empty
    (before its first step) first takes one local step of the wrapped optimizer
    with a zero ``.grad`` on every parameter that requires grad, so that its
    state exists and is broadcast; those ``.grad`` stay zero tensors afterwards
    (frozen parameters keep ``None``).  L-BFGS, whose step needs a closure, is
    broadcast as it is.  ``model`` is accepted for Horovod compatibility and not
    needed.  The skeleton is unpickled on every rank: the ranks must trust each
    other, as in any MPI job.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            "broadcast_optimizer_state expects a torch.optim.Optimizer, got "
            f"{type(optimizer).__name__}"
        )
    if hasattr(optimizer, "broadcast_state"):  # a ShardedOptimizer: its state is spread
        optimizer.broadcast_state(root_rank)
        return
    if not optimizer.state_dict()["state"] and not isinstance(optimizer, torch.optim.LBFGS):
        _initialize_state(optimizer)
    is_root = _basics.rank() == root_rank
    tensors: list = []
    skeleton = _strip(optimizer.state_dict(), tensors) if is_root else None
    skeleton = _objects.broadcast_object(
        skeleton, root_rank, name="broadcast_optimizer_state.skeleton", process_set=process_set
    )
    if not is_root:
        state_dict = _fill(skeleton, tensors)
    names = [f"broadcast_optimizer_state.{i}" for i in range(len(tensors))]
    _broadcast_tensors_(tensors, root_rank, names, process_set)
    if not is_root:
        optimizer.load_state_dict(state_dict)


def _initialize_state(optimizer) -> None:
    """One local step with zero gradients, so that an empty state gets its tensors.

    The step is the wrapped framework optimizer's own (found past hvdlite's
    classes in the MPI-free part of the class hierarchy): a distributed step
    would start collectives that other ranks do not run here.
    """
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    local = next(
        cls
        for cls in type(optimizer).__mro__
        if issubclass(cls, torch.optim.Optimizer) and not cls.__module__.startswith("hvdlite.")
    )
    local.step(optimizer)


def broadcast_object(obj=None, root_rank: int = 0, name=None, process_set=global_process_set):
    """Return the root rank's *obj* (any picklable object) on every rank.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return the list of every rank's *obj*, in rank order, on every rank.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    return _objects.allgather_object(obj, name=name, process_set=process_set)
