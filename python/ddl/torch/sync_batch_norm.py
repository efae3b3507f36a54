"""SyncBatchNorm: batch statistics over every rank of the process set, with gradients through them."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ddl.torch import mpi_ops as ops
from ddl.torch.process_sets import global_process_set


class _EveryRanksRow(torch.autograd.Function):
    """Every rank's row (a 1 x k tensor), in rank order. Each rank's statistics feed every rank's
    output, so the gradient of a rank's row is the sum of every rank's gradient of it. (Horovod's
    allgather averages the gradient instead, which would make the inputs' gradients 1/size of the
    global batch's.)"""

    @staticmethod
    def forward(ctx, row, process_set):
        ctx.process_set = process_set
        return ops.synchronize(ops.allgather_async(row, None, process_set))

    @staticmethod
    def backward(ctx, grad):
        summed = ops.synchronize(ops.allreduce_async(grad.contiguous(), None, None, ops.Sum, 1.0, 1.0, ctx.process_set))
        rank = ctx.process_set.rank()
        return summed[rank:rank + 1], None


class SyncBatchNorm(_BatchNorm):
    """Like torch.nn.BatchNorm*d, but in training the mean and variance are those of the whole batch
    across the ranks of `process_set`. Without running statistics (track_running_stats=False) that
    holds in eval too, as in Horovod: every rank of the set must then call it in eval as well. Works
    on CPU and CUDA tensors."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.track_running_stats:  # every batch, in training and in eval, by the whole batch's statistics
            return self._normalized(input, update_running=False)
        if not self.training:
            return super().forward(input)
        return self._normalized(input, update_running=True)

    def _normalized(self, input, update_running):
        """`input` normalized by the statistics of every rank's batch, the running ones updated."""
        if update_running:
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        dims = [0] + list(range(2, input.dim()))
        # Statistics in float32 at least: sums of squares of float16 activations overflow at 65504.
        x = input.to(torch.promote_types(input.dtype, torch.float32))
        c = input.shape[1]
        shape = [1, c] + [1] * (input.dim() - 2)
        mean, var, n = self._global_moments(x, dims, shape)
        if update_running:
            with torch.no_grad():
                unbiased = var * n / torch.clamp(n - 1, min=1)
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(unbiased.detach() * factor)
        out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)

    def _global_moments(self, x, dims, shape):
        """(mean, biased variance, count) per channel over every rank's batch, differentiable. Each
        rank's count, mean and sum of squared deviations from that mean (two passes over its own
        batch) are gathered and combined as Chan et al. combine them: a variance from sums of x and
        x^2 (E[x^2] - E[x]^2) loses all of itself in float32 where the mean is large against the
        spread (a mean of 1e4 and a variance of 1 gave 2.55). The ranks' rows are combined in rank
        order on every rank, so every rank computes the same bits."""
        count = x.numel() // x.shape[1]
        if count:
            local_mean = x.mean(dims)
            local_m2 = (x - local_mean.view(shape)).square().sum(dims)
        else:  # an empty batch on this rank adds nothing
            local_mean = local_m2 = x.sum(dims)
        counts = torch.full((1,), float(count), dtype=x.dtype, device=x.device)
        mine = torch.cat([local_mean, local_m2, counts]).unsqueeze(0)
        rows = _EveryRanksRow.apply(mine, self.process_set)
        c = x.shape[1]
        means, m2s, counts = rows[:, :c], rows[:, c:2 * c], rows[:, 2 * c:]
        n = counts.sum()
        mean = (means * counts).sum(0) / n
        m2 = m2s.sum(0) + (counts * (means - mean).square()).sum(0)
        return mean, m2 / n, n
