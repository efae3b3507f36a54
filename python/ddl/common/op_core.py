"""What every face's ops do alike, whatever their tensors: libddl's dtype of a tensor, the payload of an
op whose rows differ by rank, reading what such an op gathered, alltoall's splits, and submitting a
call's ops all or none. Each function takes the face's tensor adapter (common/tensor_adapters.py)
where it touches a tensor, so ddl.torch, the torch.distributed backend and the numpy path under
TensorFlow and Keras share one copy.
"""

import ctypes

from ddl import _lib as L
from ddl.common import dtypes
from ddl.common.rows import row_elements, rows_of


def libddl_dtype(tensors, t, moves_only=False):
    """libddl's dtype code of tensor `t` (of the adapter `tensors`).

    Arguments:
        tensors: the face's tensor adapter.
        t: a tensor of that face.
        moves_only: True where the data only moves (allgather, broadcast, alltoall): booleans then
            travel as uint8.

    Returns:
        libddl's dtype code (ddl._lib.FLOAT32, ...).

    Raises:
        ValueError naming the type and the types libddl has, for a dtype it has no type for (booleans
        among them unless moves_only).
    """
    if moves_only and tensors.is_bool(t):
        return L.UINT8
    code = tensors.table.get(tensors.dtype_of(t))
    if code is None:
        raise dtypes.unsupported(tensors.type_name(t))
    return code


def any_count_payload(tensors, data, dtype, shape, rows_per_destination):
    """What an allgather-any or alltoall-any of `data` (a tensor of `shape`) sends, and its dtype code.

    Arguments:
        tensors: the face's tensor adapter.
        data: the tensor's data as libddl moves it (of libddl dtype `dtype`).
        shape: the tensor's shape (its rows are the first dimension).
        rows_per_destination: how many rows go to each destination (one entry for an allgather).

    Returns:
        (payload, dtype code): `data` itself; or, where a row has no elements, the int64 row counts,
        since element counts of 0 cannot say how many rows there were (common/rows.py).
    """
    if row_elements(shape):
        return data, dtype
    return tensors.int64(rows_per_destination), L.INT64


def read_gathered(tensors, handle, n, like, trailing):
    """What an allgather-any's or alltoall-any's `handle` received (ddl_gathered waits for it).

    Arguments:
        tensors: the face's tensor adapter.
        handle: the op's C handle, not yet released.
        n: the size of the op's process set.
        like: a host tensor of the dtype the result is to have (the result is made on the host, as
            libddl keeps what it gathered in host memory).
        trailing: the shape of one row (every dimension after the first).

    Returns:
        (out, rows): a new tensor of every rank's rows in rank order, and each rank's row count.

    Raises:
        the face's exception for a failed op.
    """
    trailing = tuple(trailing)
    counts, data = L.gathered(handle, n)
    rows = rows_of(counts, row_elements((0,) + trailing), data)
    out = tensors.empty(like, (sum(rows),) + trailing)
    nbytes = tensors.nbytes(out)
    if nbytes:
        ctypes.memmove(tensors.address(out), data, nbytes)
    return out, rows


def alltoall_splits(tensors, splits):
    """alltoall's `splits` (a tensor of the face's) as a list of ints, or None for None.

    Raises:
        ValueError for splits that do not hold integers (Horovod takes int32; any integer type is
        taken here).
    """
    if splits is None:
        return None
    if not tensors.is_integer(splits):
        raise ValueError(f"splits must hold integers ({tensors.int32_name}), not {tensors.type_name(splits)}")
    return tensors.ints(splits)


def submit_each(items, submit_one):
    """Submits one op per item, all or none: `submit_one(item)` submits one and returns its C handle.

    Returns:
        the handles, in the order of `items`.

    Raises:
        whatever a submission raised, after waiting for the ops already submitted, so that none
        stays in flight (libddl may still be reading their buffers).
    """
    handles = []
    try:
        for item in items:
            handles.append(submit_one(item))
    except BaseException:
        L.wait_quietly(handles)
        raise
    return handles
