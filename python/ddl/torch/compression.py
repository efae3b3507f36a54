"""Gradient compression, as horovod.torch.compression: what travels in the allreduce."""

import torch

from ddl.common.compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Floating-point tensors travel as float16 (half the bytes); others are left alone."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating_point:
            return tensor.type(torch.float16), tensor.dtype
        return tensor, tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.type(ctx) if ctx is not None and ctx.is_floating_point else tensor


class Compression:
    """The compressions that the `compression` argument takes (of allreduce, grouped_allreduce,
    reducescatter, grouped_reducescatter, DistributedOptimizer), as horovod.torch.Compression.

    A compressor's compress(tensor) returns (what is sent, a context) and decompress(tensor, context)
    turns the result back.

    Attributes:
        none: NoneCompressor: tensors are sent as they are.
        fp16: FP16Compressor: floating-point tensors are sent as float16 and their results cast back
            to the tensor's own dtype; other tensors are sent as they are.
    """
    none = NoneCompressor
    fp16 = FP16Compressor
