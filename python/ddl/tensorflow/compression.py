"""Gradient compression as horovod.tensorflow.Compression: none, or fp16 on the wire."""

import tensorflow as tf

from ddl.common.compression import Compressor, NoneCompressor  # noqa: F401


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 and come back in their own type; others are untouched."""

    @staticmethod
    def compress(tensor):
        if tensor.dtype.is_floating and tensor.dtype != tf.float16:
            return tf.cast(tensor, tf.float16), tensor.dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None else tf.cast(tensor, ctx)


class Compression:
    """The compressions that the `compression` argument takes (of allreduce, grouped_allreduce,
    reducescatter, grouped_reducescatter, DistributedOptimizer, DistributedGradientTape), as
    horovod.tensorflow.Compression.

    A compressor's compress(tensor) returns (what is sent, a context) and decompress(tensor, context)
    turns the result back.

    Attributes:
        none: NoneCompressor: tensors are sent as they are.
        fp16: FP16Compressor: floating-point tensors other than float16 are sent as float16 and their
            results cast back to the tensor's own dtype; other tensors are sent as they are.
    """
    none = NoneCompressor
    fp16 = FP16Compressor
