"""Ops whose first dimension may differ by rank (allgather, alltoall, reducescatter) count rows."""

import ctypes


def row_elements(shape):
    """The elements of one row (of the first dimension) of a tensor of `shape`."""
    n = 1
    for d in shape[1:]:
        n *= d
    return n


# Rows of no elements (a tensor of shape (k, 0)): counts of elements, all 0, cannot say how many rows
# each rank has, so such an op sends row counts instead, one int64 per destination (each face's
# payload), and its result is an empty tensor of the gathered rows (of shape (rows, 0), not (0, 0)).
def row_counts_received(ptr, total):
    """The `total` int64 row counts at `ptr` (ddl_gathered's data) that ranks sent as such a payload."""
    return list((ctypes.c_int64 * total).from_address(ptr.value)) if total else []


def rows_of(counts, row, data):
    """Each rank's rows in a gathered result: from its element `counts`, or where a row has no
    elements (`row` 0) from the row counts at `data`."""
    return [c // row for c in counts] if row else row_counts_received(data, sum(counts))


def alltoall_rows(splits, first_dim, n):
    """The rows an alltoall of a tensor whose first dimension is `first_dim` sends to each of the `n`
    ranks: `splits` (a list of ints), or equal shares when None. Raises ValueError naming what is wrong."""
    if splits is None:
        if first_dim % n != 0:
            raise ValueError(f"alltoall without splits needs the first dimension ({first_dim}) to be a multiple "
                             f"of the number of ranks ({n}), or give splits")
        return [first_dim // n] * n
    if len(splits) != n or any(s < 0 for s in splits):
        raise ValueError(f"splits must hold {n} non-negative entries, one per rank, not {splits}")
    if sum(splits) > first_dim:
        raise ValueError(f"the sum of splits ({sum(splits)}) exceeds the first dimension of the tensor ({first_dim})")
    return splits
