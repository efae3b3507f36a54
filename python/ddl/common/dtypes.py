"""The element types libddl reduces and moves, by name, and each face's table of them."""

import functools

from ddl import _lib as L

# libddl's dtypes by their name in numpy, TensorFlow and torch alike.
BY_NAME = {"float16": L.FLOAT16, "bfloat16": L.BFLOAT16, "float32": L.FLOAT32, "float64": L.FLOAT64,
           "int32": L.INT32, "int64": L.INT64, "uint8": L.UINT8, "int8": L.INT8, "int16": L.INT16}
SUPPORTED = "uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64"
# What libddl moves but does not reduce (broadcast, allgather, alltoall), by name: told apart from
# the types of their size, so that a bool on one rank never pairs with a uint8 on another.
MOVED_BY_NAME = {"bool": L.BOOL, "uint16": L.UINT16, "uint32": L.UINT32, "uint64": L.UINT64}

def unsupported(type_name):
    """The error for a tensor of `type_name` that libddl has no type for (every face's words)."""
    return ValueError(f"tensors of type {type_name} are not supported: use one of {SUPPORTED}")


@functools.lru_cache(maxsize=None)
def torch_table():
    """{torch.dtype: libddl dtype}, for the torch faces (made on first use: torch is imported only by them)."""
    import torch
    return {getattr(torch, name): code for name, code in BY_NAME.items()}


@functools.lru_cache(maxsize=None)
def torch_moved_table():
    """{torch.dtype: libddl dtype} of what the torch faces move but do not reduce (torch before 2.3
    has no uint16/32/64)."""
    import torch
    return {getattr(torch, name): code for name, code in MOVED_BY_NAME.items() if hasattr(torch, name)}
