"""The differentiable forms of the collectives, with the gradients Horovod defines for them."""

import torch

from ddl.torch import mpi_ops as ops


class AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return ops.synchronize(ops.allreduce_async(tensor, None, name, op, prescale, postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        reduced = ops.synchronize(ops.allreduce_async(grad.contiguous(), None, None, op, prescale, postscale, process_set))
        return reduced, None, None, None, None, None


class GroupedAllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(ops.synchronize(ops.grouped_allreduce_async(list(tensors), None, name, op, prescale, postscale,
                                                                 process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = ops.synchronize(ops.grouped_allreduce_async([g.contiguous() for g in grads], None, None, op, prescale,
                                                              postscale, process_set))
        return (None, None, None, None, None, *reduced)


def _own_rows(grad, first_dim, process_set):
    """This rank's rows of an allgathered gradient, after averaging it over the set."""
    reduced = ops.synchronize(ops.allreduce_async(grad.contiguous(), op=ops.Average, process_set=process_set))
    dims = ops.synchronize(ops.allgather_async(torch.tensor([first_dim], dtype=torch.int64), process_set=process_set))
    offset = int(dims[:process_set.rank()].sum().item())
    return reduced.narrow(0, offset, first_dim)


class AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.first_dim = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return ops.synchronize(ops.allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        return _own_rows(grad, ctx.first_dim, ctx.process_set), None, None


class GroupedAllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.first_dims = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(ops.synchronize(ops.grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *[_own_rows(g, d, ctx.process_set) for g, d in zip(grads, ctx.first_dims)])


class BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return ops.synchronize(ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = ops.synchronize(ops.allreduce_async(grad.contiguous(), op=ops.Average, process_set=ctx.process_set))
        me = ops._world_rank()
        if me != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None, None


class AlltoallFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        ctx.process_set = process_set
        output, received = ops.synchronize(ops.alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _unused):
        back, _ = ops.synchronize(ops.alltoall_async(grad.contiguous(), ctx.received.cpu().to(torch.int32),
                                                     process_set=ctx.process_set))
        return back, None, None, None


class ReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return ops.synchronize(ops.reducescatter_async(tensor, name, op, process_set, prescale, postscale))

    @staticmethod
    def backward(ctx, grad):
        return (_reducescatter_grad(grad, *ctx.args), None, None, None, None, None)


class GroupedReducescatterFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(ops.synchronize(ops.grouped_reducescatter_async(list(tensors), name, op, process_set, prescale,
                                                                     postscale)))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, None, None, None, *[_reducescatter_grad(g, *ctx.args) for g in grads])


def _reducescatter_grad(grad, op, prescale, postscale, process_set):
    """Horovod's gradient of a reducescatter: every rank's block gradients gathered, then reduced over
    the ranks with the forward's op and scaling."""
    gathered = ops.synchronize(ops.allgather_async(grad.contiguous(), process_set=process_set))
    return ops.synchronize(ops.allreduce_async(gathered, op=op, prescale_factor=prescale, postscale_factor=postscale,
                                               process_set=process_set))
