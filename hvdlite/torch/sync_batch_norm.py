"""SyncBatchNorm: batch normalization over the batch of every rank together.

In training, each channel's mean and variance come from the concatenation of
every rank's batch, so the output (and the gradient) equals ``nn.BatchNorm``
applied to that concatenated batch.  Statistics are combined without loss of
precision: each rank sends its count, mean and sum of squared deviations
(one allgather), and ranks merge them exactly (Chan et al.'s pairwise
formula).  Backward needs one allreduce of two per-channel sums.

Cross-rank contract: every rank of the process set runs the layer's forward
(and backward) the same number of times, in the same order relative to other
unnamed collectives.  A rank may hold an empty batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from hvdlite.ops import Sum
from hvdlite.process_sets import global_process_set
from hvdlite.torch.mpi_ops import allgather_async, allreduce_async, synchronize

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(_BatchNorm):
    """Drop-in for ``nn.BatchNorm1d/2d/3d`` whose training statistics span all ranks.

    Arguments are those of ``nn.BatchNorm*``; ``process_set`` (keyword, +)
    limits the synchronization to a subset of ranks.  In eval mode, or on a
    single rank, it is exactly ``nn.BatchNorm``.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        process_set=global_process_set,
        device=None,
        dtype=None,
    ):
        super().__init__(
            num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype
        )
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        keep_running = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep_running else None
        running_var = self.running_var if keep_running else None
        if not use_batch_stats or self.process_set.size() == 1:
            return F.batch_norm(
                input,
                running_mean,
                running_var,
                self.weight,
                self.bias,
                use_batch_stats,
                factor,
                self.eps,
            )
        return _SyncBatchNorm.apply(
            input,
            self.weight,
            self.bias,
            running_mean,
            running_var,
            self.eps,
            factor,
            self.process_set,
        )


def _per_channel(t: torch.Tensor, ndim: int) -> torch.Tensor:
    """A per-channel vector shaped to broadcast against an (N, C, ...) input."""
    return t.view(1, -1, *([1] * (ndim - 2)))


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        c, nd = x.shape[1], x.dim()
        dims = [0, *range(2, nd)]
        acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        xf = x.to(acc)
        count = xf.numel() // c if c else 0
        local_mean = xf.mean(dims) if count else torch.zeros(c, dtype=acc, device=x.device)
        local_m2 = ((xf - _per_channel(local_mean, nd)) ** 2).sum(dims)
        count_row = torch.tensor([float(count)], dtype=acc, device=x.device)
        row = torch.cat([count_row, local_mean, local_m2])
        rows = synchronize(allgather_async(row.unsqueeze(0), process_set=process_set))
        counts, means, m2s = rows[:, :1], rows[:, 1 : c + 1], rows[:, c + 1 :]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError(
                "Expected more than 1 value per channel when training, got "
                f"input size {tuple(x.shape)} over all ranks"
            )
        mean = (counts * means).sum(0) / total
        m2 = m2s.sum(0) + (counts * (means - mean) ** 2).sum(0)
        invstd = torch.rsqrt(m2 / total + eps)
        xhat = (xf - _per_channel(mean, nd)) * _per_channel(invstd, nd)
        y = xhat
        if weight is not None:
            y = y * _per_channel(weight.to(acc), nd)
        if bias is not None:
            y = y + _per_channel(bias.to(acc), nd)
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = m2 / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.total, ctx.process_set = total, process_set
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        xhat, invstd, weight = ctx.saved_tensors
        c, nd = xhat.shape[1], xhat.dim()
        dims = [0, *range(2, nd)]
        g = grad.to(xhat.dtype)
        sum_dy = g.sum(dims)
        sum_dy_xhat = (g * xhat).sum(dims)
        grad_weight = None if weight is None else sum_dy_xhat.to(weight.dtype)
        grad_bias = None if ctx.bias_dtype is None else sum_dy.to(ctx.bias_dtype)
        grad_input = None
        if ctx.needs_input_grad[0]:
            sums = synchronize(
                allreduce_async(
                    torch.cat([sum_dy, sum_dy_xhat]), op=Sum, process_set=ctx.process_set
                )
            )
            mean_dy, mean_dy_xhat = sums[:c] / ctx.total, sums[c:] / ctx.total
            scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
            grad_input = (
                (g - _per_channel(mean_dy, nd) - xhat * _per_channel(mean_dy_xhat, nd))
                * _per_channel(scale, nd)
            ).to(grad.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None
