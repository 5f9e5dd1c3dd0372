"""Mixed precision with a sharded optimizer: ``hvd.ShardedGradScaler``.

``torch.amp.GradScaler`` unscales and checks the gradients it finds on the
optimizer's ``param_groups``.  With ``shard_optimizer_state=True`` the reduced
gradients are not there: each rank holds its part of them on ``opt.local``'s
parameters, and an inf or NaN may sit in one rank's part only.  A plain
GradScaler would find no gradients (torch then fails with "No inf checks were
recorded"), and a check of one rank's part alone would let the ranks disagree
on whether to step.  :class:`ShardedGradScaler` is a GradScaler that, for a
:class:`~hvdlite.torch.sharded.ShardedOptimizer`:

- reduces the gradients first (``optimizer.synchronize()``) unless that was done,
- unscales and checks this rank's part (``opt.local``'s gradients),
- takes the verdict of every rank of the optimizer's process set (a one-element
  Max allreduce): every rank steps, or every rank skips and backs the scale off,
- steps inside ``skip_synchronize()``.

For any other optimizer it is the plain GradScaler, so one scaler serves both.
Usage is torch's, with ``hvd.ShardedGradScaler`` in place of
``torch.amp.GradScaler``::

    scaler = hvd.ShardedGradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)            # optional: clip here with opt.clip_grad_norm_()
    scaler.step(opt)
    scaler.update()

Cross-rank contract: every rank of the optimizer's set calls ``unscale_`` (or
``step``, which unscales) together, as it calls ``step()``.
"""

from __future__ import annotations

import torch
from torch.amp.grad_scaler import OptState

from hvdlite.ops import Max
from hvdlite.torch import mpi_ops as _ops
from hvdlite.torch.sharded import ShardedOptimizer

__all__ = ["ShardedGradScaler"]


class ShardedGradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` that also drives ``shard_optimizer_state=True``
    optimizers (module doc); same constructor arguments."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
        if not isinstance(optimizer, ShardedOptimizer):
            return super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        if not optimizer._synchronized:
            optimizer.synchronize()  # this rank's part of the reduced gradients
        per_device = super()._unscale_grads_(optimizer.local, inv_scale, found_inf, allow_fp16)
        mine = torch.zeros(1, dtype=torch.float32)
        for flag in per_device.values():
            mine += flag.detach().float().cpu().reshape(1)
        verdict = _ops.allreduce(
            mine, op=Max, name="sharded.found_inf", process_set=optimizer._process_set
        )
        if not per_device:  # no gradient here: still one check, with everyone's verdict
            per_device = {found_inf.device: found_inf}
        for flag in per_device.values():
            flag.fill_(verdict.item())
        return per_device

    def step(self, optimizer, *args, **kwargs):
        if not isinstance(optimizer, ShardedOptimizer) or not self._enabled:
            return super().step(optimizer, *args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        state = self._per_optimizer_states[id(optimizer)]
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        try:
            if state["stage"] is OptState.READY:
                self.unscale_(optimizer)
            result = None
            if not sum(v.item() for v in state["found_inf_per_device"].values()):
                with optimizer.skip_synchronize():  # reduced in unscale_
                    result = optimizer.step(*args, **kwargs)
        finally:
            optimizer._synchronized = False  # a skipped step leaves nothing reduced behind
        state["stage"] = OptState.STEPPED
        return result
