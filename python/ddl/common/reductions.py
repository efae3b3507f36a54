"""Horovod's reductions, alike in every face: the constants, what libddl calls them, and the rules
for which op a call may use."""

from ddl import _lib as L

# Horovod's reduction constants (the same values as horovod.torch and horovod.tensorflow).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
REDUCE = {Average: L.AVERAGE, Sum: L.SUM, Min: L.MIN, Max: L.MAX, Product: L.PRODUCT}


def reduce_op(op, average, default=Average):
    """Horovod's op from `op` and the deprecated `average` (which may not be given together).

    Raises ValueError for both at once or an unknown op, NotImplementedError for Adasum."""
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return Average if average else Sum
    op = default if op is None else op
    refuse_adasum(op)
    if op not in REDUCE:
        raise ValueError(f"unknown reduction op {op!r}: use hvd.Average, Sum, Min, Max or Product")
    return op


def refuse_adasum(op):
    """Raises NotImplementedError when `op` is Adasum, which ddl does not implement (every face's words)."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not supported by ddl: use op=hvd.Average or hvd.Sum")


def reducescatter_op(op):
    """`op` if a reducescatter may reduce with it: Sum or Average, as Horovod's; else ValueError."""
    if op not in (Average, Sum):
        raise ValueError("reducescatter reduces with hvd.Sum or hvd.Average only (as Horovod's)")
    return op
