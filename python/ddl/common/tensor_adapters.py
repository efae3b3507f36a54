"""Each face's tensors as the op core (common/op_core.py) sees them: the few things it asks of a tensor,
answered once per tensor type. NUMPY serves TensorFlow and Keras, whose tensors reach libddl as numpy
arrays (common/host_ops.py); torch_tensors() serves ddl.torch and the torch.distributed backend. Each
is made on first use, so that importing a face never imports the other's framework (the backend runs
without numpy).

An adapter has:
    table: {the face's dtype: libddl's dtype code}
    dtype_of(t): the key of `t`'s dtype in table; type_name(t): how an error names it
    is_bool(t), is_integer(t): whether `t` holds booleans, or integers (not booleans)
    address(t), nbytes(t): where `t`'s (contiguous) data lies and how many bytes it has
    empty(like, shape): a new tensor of `like`'s dtype and device, C-contiguous
    as_dtype_of(t, like): `t`'s bytes viewed as `like`'s dtype
    int64(values): a new host tensor of the ints `values`
    ints(t): `t`'s elements as a flat list of Python ints
    int32_name: how an error names the 32-bit integer type
"""

import functools

from ddl.common import dtypes


class _NumpyTensors:
    table = dtypes.BY_NAME
    moved = dtypes.MOVED_BY_NAME
    int32_name = "int32"

    def __init__(self):
        import numpy  # only the numpy path (TensorFlow, Keras, and ddl.torch's host ops) makes this adapter
        self._np = numpy

    @staticmethod
    def dtype_of(a):
        return a.dtype.name

    @staticmethod
    def type_name(a):
        return a.dtype.name

    @staticmethod
    def is_bool(a):
        return a.dtype.kind == "b"

    @staticmethod
    def is_integer(a):
        return a.dtype.kind in "iu"

    @staticmethod
    def address(a):
        return a.ctypes.data

    @staticmethod
    def nbytes(a):
        return a.nbytes

    def empty(self, like, shape):
        return self._np.empty(shape, dtype=like.dtype)

    @staticmethod
    def as_dtype_of(a, like):
        return a if a.dtype == like.dtype else a.view(like.dtype)

    def int64(self, values):
        return self._np.asarray(values, dtype=self._np.int64)

    @staticmethod
    def ints(a):
        return [int(v) for v in a.reshape(-1)]


@functools.lru_cache(maxsize=None)
def numpy_tensors():
    """The adapter of numpy arrays (made on first use)."""
    return _NumpyTensors()


class _TorchTensors:
    int32_name = "torch.int32"

    def __init__(self):
        import torch  # only the torch faces make this adapter
        self._torch = torch
        self.table = dtypes.torch_table()
        self.moved = dtypes.torch_moved_table()

    @staticmethod
    def dtype_of(t):
        return t.dtype

    @staticmethod
    def type_name(t):
        return str(t.dtype)

    def is_bool(self, t):
        return t.dtype == self._torch.bool

    def is_integer(self, t):
        return not (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == self._torch.bool)

    @staticmethod
    def address(t):
        return t.data_ptr()

    @staticmethod
    def nbytes(t):
        return t.numel() * t.element_size()

    @staticmethod
    def empty(like, shape):
        return like.new_empty(shape)

    @staticmethod
    def as_dtype_of(t, like):
        return t if t.dtype == like.dtype else t.view(like.dtype)

    def int64(self, values):
        return self._torch.tensor(values, dtype=self._torch.int64)

    @staticmethod
    def ints(t):
        return [int(v) for v in t.flatten().tolist()]


@functools.lru_cache(maxsize=None)
def torch_tensors():
    """The adapter of torch tensors (made on first use: torch is imported only by the torch faces)."""
    return _TorchTensors()
