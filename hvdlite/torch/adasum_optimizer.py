"""The delta-optimizer scheme behind ``DistributedOptimizer(op=hvd.Adasum)``.

Adasum combines vectors so that agreeing contributions are not counted twice
and orthogonal ones add up (see :mod:`hvdlite.engine.transports.adasum`).  Applied to raw
gradients it would ignore what the optimizer makes of them (momentum, Adam's
scaling), so, as in Horovod, the optimizer combines *updates* instead: every
rank remembers its parameters, runs the wrapped optimizer's step on its own
gradients, and the parameter deltas of all ranks are combined with Adasum::

    start = p;  local step;  p = start + adasum_over_ranks(p - start)

Gradients are never communicated and each rank's optimizer state (momentum,
Adam moments) stays its own.  All deltas go in one grouped allreduce with
``op=Adasum``, which the engine combines tensor by tensor.  The optimizer
reaches this through :class:`hvdlite.torch.reducers.AdasumReducer`.

Cross-rank contract: every rank of the process set (a power-of-two number of
ranks, checked when the optimizer is built) calls ``step()`` the same number of
times with the same named parameters; every rank ends the step with the same
parameters.
"""

from __future__ import annotations

import torch

from hvdlite.ops import Adasum
from hvdlite.torch.mpi_ops import grouped_allreduce_async_, synchronize

__all__ = ["adasum_delta_step"]


def adasum_delta_step(named_params, base_step, closure, *, compression, process_set, start: dict):
    """Run *base_step* (the wrapped optimizer's own step) on this rank's
    gradients, then set each parameter of *named_params* (a list of (name,
    parameter), in the same order on every rank) to its value before the step
    plus the Adasum of all ranks' deltas over *process_set*.

    *compression* (none, fp16 or bf16) casts the deltas for the wire; *start*
    maps each parameter to a buffer kept between steps (filled here).  Returns
    (what *base_step* returned, payload bytes this rank submitted)."""
    params = [p for _, p in named_params]
    with torch.no_grad():
        for p in params:
            buf = start.get(p)
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
                start[p] = buf = torch.empty_like(p, memory_format=torch.contiguous_format)
            buf.copy_(p)
    result = base_step() if closure is None else base_step(closure)
    if not params:
        return result, 0
    with torch.no_grad():
        wires = [compression.compress(p - start[p]) for p in params]
        name = f"hvdlite.adasum_delta.{named_params[0][0]}"
        synchronize(
            grouped_allreduce_async_(
                [w for w, _ in wires], name=name, op=Adasum, process_set=process_set
            )
        )
        for p, (wire, ctx) in zip(params, wires, strict=True):
            p.copy_(start[p].add_(compression.decompress(wire, ctx)))
    return result, sum(w.nbytes for w, _ in wires)
