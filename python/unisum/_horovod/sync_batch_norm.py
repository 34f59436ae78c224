"""Horovod's SyncBatchNorm: batch normalisation with the statistics of every
rank's batch.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch

from unisum._horovod.basics import Sum
from unisum._horovod.reduce import allreduce


class _SyncBatchNormFn(torch.autograd.Function):
    """Batch normalisation with the statistics of every rank's batch: the
    counts, sums and sums of squares are allreduced (Sum) forward, and the
    two sums the input's gradient needs backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], eps: float,
                stats_out: List[torch.Tensor]) -> torch.Tensor:
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xd = x.detach().double()
        local = torch.cat([torch.tensor([float(x.numel() // c)], dtype=torch.float64),
                           xd.sum(dims), (xd * xd).sum(dims)])
        total = allreduce(local, op=Sum)
        count = total[0]
        mean = total[1:1 + c] / count
        var = total[1 + c:] / count - mean * mean
        shape = [1, c] + [1] * (x.dim() - 2)
        invstd = 1.0 / torch.sqrt(var + eps)
        xhat = ((xd - mean.view(shape)) * invstd.view(shape)).to(x.dtype)
        out = xhat
        if weight is not None:
            out = out * weight.view(shape)
        if bias is not None:
            out = out + bias.view(shape)
        ctx.save_for_backward(xhat, weight, invstd.to(x.dtype))
        ctx.count, ctx.dims, ctx.shape = float(count), dims, shape
        stats_out.extend([mean, var, count])
        return out

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        xhat, weight, invstd = ctx.saved_tensors
        dims, shape = ctx.dims, ctx.shape
        sum_dy = dy.sum(dims)
        sum_dy_xhat = (dy * xhat).sum(dims)
        grad_w = sum_dy_xhat if weight is not None and ctx.needs_input_grad[1] else None
        grad_b = sum_dy if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            both = allreduce(torch.cat([sum_dy, sum_dy_xhat]).double(), op=Sum)
            c = sum_dy.numel()
            mean_dy = (both[:c] / ctx.count).to(dy.dtype).view(shape)
            mean_dy_xhat = (both[c:] / ctx.count).to(dy.dtype).view(shape)
            scale = invstd.view(shape) * (weight.view(shape) if weight is not None else 1.0)
            grad_x = scale * (dy - mean_dy - xhat * mean_dy_xhat)
        return grad_x, grad_w, grad_b, None, None


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Horovod's SyncBatchNorm: in training, batch normalisation over the
    union of every rank's batch (its mean and variance allreduced), on the
    CPU tensors unisum sums; in evaluation, the running statistics, which
    every rank keeps alike.  Every rank must call it in the same order."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError("unisum.torch: SyncBatchNorm expects an input of at least 2 "
                             "dimensions, got %d" % input.dim())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training and self.track_running_stats:
            return super().forward(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
        stats: List[torch.Tensor] = []
        out: torch.Tensor = _SyncBatchNormFn.apply(input, self.weight, self.bias, self.eps, stats)
        if self.training and self.track_running_stats and self.running_mean is not None:
            mean, var, count = stats
            unbiased = var * count / max(float(count) - 1.0, 1.0)
            with torch.no_grad():
                self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype) * factor)
                self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype) * factor)
        return out
