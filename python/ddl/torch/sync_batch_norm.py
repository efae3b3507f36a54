"""SyncBatchNorm: batch statistics over every rank of the process set, with gradients through them."""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ddl.torch import _autograd as ag
from ddl.torch import mpi_ops as ops
from ddl.torch.process_sets import global_process_set


class SyncBatchNorm(_BatchNorm):
    """Like torch.nn.BatchNorm*d, but in training the mean and variance are those of the whole batch
    across the ranks of `process_set`. Works on CPU and CUDA tensors."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training:
            return super().forward(input)
        if self.momentum is None:
            self.num_batches_tracked += 1
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
            if self.track_running_stats:
                self.num_batches_tracked += 1
        dims = [0] + list(range(2, input.dim()))
        # Statistics in float32 at least: sums of squares of float16 activations overflow at 65504.
        x = input.to(torch.promote_types(input.dtype, torch.float32))
        count = torch.tensor([input.numel() // input.shape[1]], dtype=x.dtype, device=input.device)
        local = torch.cat([x.sum(dims), (x * x).sum(dims), count])
        # The sums of every rank, differentiable: backward sums the gradients of every rank's sums.
        total = ag.AllreduceFn.apply(local, None, ops.Sum, 1.0, 1.0, self.process_set)
        c = input.shape[1]
        n = total[2 * c]
        mean = total[:c] / n
        var = total[c:2 * c] / n - mean * mean
        if self.track_running_stats:
            with torch.no_grad():
                unbiased = var * n / torch.clamp(n - 1, min=1)
                self.running_mean.mul_(1 - factor).add_(mean.detach() * factor)
                self.running_var.mul_(1 - factor).add_(unbiased.detach() * factor)
        shape = [1, c] + [1] * (input.dim() - 2)
        var = torch.clamp(var, min=0)  # E[x^2] - E[x]^2 may round below zero
        out = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
