"""Gradient compression's shape, as horovod's Compression: a face subclasses Compressor for what
travels in its framework's tensors (FP16Compressor), NoneCompressor sends tensors as they are."""


class Compressor:
    """Turns a tensor into what is sent, and back."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor
