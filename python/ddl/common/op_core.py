"""What every face's ops do alike, whatever their tensors: libddl's dtype of a tensor, the payload of an
op whose rows differ by rank, reading what such an op gathered, alltoall's splits, and a call's ops,
each of which takes its place in the order on every rank (Call). Each function takes the face's
tensor adapter (common/tensor_adapters.py) where it touches a tensor, so ddl.torch, the
torch.distributed backend and the numpy path under TensorFlow and Keras share one copy.
"""

import ctypes
import threading

from ddl import _lib as L
from ddl.common import dtypes
from ddl.common.rows import row_elements, rows_of


def libddl_dtype(tensors, t, moves_only=False):
    """libddl's dtype code of tensor `t` (of the adapter `tensors`).

    Arguments:
        tensors: the face's tensor adapter.
        t: a tensor of that face.
        moves_only: True where the data only moves (allgather, broadcast, alltoall): booleans and
            unsigned 16-64 bit integers then have types of their own (the adapter's `moved`).

    Returns:
        libddl's dtype code (ddl._lib.FLOAT32, ...).

    Raises:
        ValueError naming the type and the types libddl has, for a dtype it has no type for (booleans
        among them unless moves_only).
    """
    code = tensors.table.get(tensors.dtype_of(t))
    if code is None and moves_only:
        code = tensors.moved.get(tensors.dtype_of(t))
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


def part_names(full, count, grouped):
    """libddl's name of each part of a call named `full` (a str; None: unnamed): the name itself for
    one op, NAME.0, NAME.1, ... for a grouped call's; all None for an unnamed call, whose parts
    libddl numbers one by one."""
    if count == 1 and not grouped:
        return [None if full is None else full.encode()]
    return [None if full is None else f"{full}.{i}".encode() for i in range(count)]


class Call:
    """The libddl ops one call of a face makes (its parts: one op, or one per tensor of a grouped
    call), each of which takes its place in the process set's order whatever happens on this rank.

    Where this rank cannot submit them all (a check only it fails: a dtype, a device, its splits, a
    root; an interrupt), abandon() has each numbered part (an unnamed one, or one whose name is its
    place in an order the face counts) not yet handed to libddl take its place failing with the
    error (ddl_fail_ex): the other ranks' calls then fail with this rank's reason instead of pairing
    with this rank's next call and returning its data. A part libddl refused has taken its place
    itself. A named part takes none: its name stays free to submit again at once, and the other
    ranks' op of that name waits for it (or for DDL_TIMEOUT), as before.

    Arguments:
        names: each part's libddl name (bytes; None: the next unnamed number), in submission order.
        process_set: the parts' process set (a ProcessSet that target() accepted).
        flags: DDL_ORDERED where the names are places in an order the face counts.
        group_size: the parts' group size (count of a grouped call, else 0), which ranks agree on.
    """

    __slots__ = ("names", "process_set", "flags", "group_size", "attempted", "handles")

    def __init__(self, names, process_set, flags=0, group_size=0):
        self.names = names
        self.process_set = process_set
        self.flags = flags
        self.group_size = group_size
        self.attempted = 0  # parts handed to libddl, submitted or refused
        self.handles = []   # the submitted parts' handles

    @classmethod
    def named(cls, full, count, grouped, process_set):
        """The Call of `count` parts of a call claimed as `full` (None: unnamed): part_names' names,
        and the group size every rank must agree on (count where `grouped`, else 0: a single op)."""
        return cls(part_names(full, count, grouped), process_set, group_size=count if grouped else 0)

    def name(self, i):
        """libddl's name of part `i`."""
        return self.names[i]

    def submit(self, fn, *args):
        """L.submit(fn, *args) for the next part: its handle, also kept in self.handles; raises the
        face's exception for a part libddl refused."""
        self.attempted += 1
        handle = L.submit(fn, *args)
        if handle is not None:  # None: a DDL_BLOCKING op, done already
            self.handles.append(handle)
        return handle

    def abandon(self, error):
        """After `error`: the numbered parts not handed to libddl take their places failing with it,
        and the submitted ones are waited for (libddl may still be reading their buffers). The
        failing parts are not waited for: they complete once every rank has reached them, and are
        released later (_release_done)."""
        reason = (str(error) or type(error).__name__).encode(errors="replace")
        options = L.OpOptions(self.process_set._c_handle, 1.0, 1.0, self.flags, None, None, 0, self.group_size)
        failing = []
        for name in self.names[self.attempted:]:
            if name is not None and not self.flags & L.ORDERED:
                continue
            handle = ctypes.c_void_p()
            if L.lib.ddl_fail_ex(name, reason, ctypes.byref(options), ctypes.byref(handle)) == L.SUCCESS:
                failing.append(handle.value)
        self.attempted = len(self.names)
        L.wait_quietly(self.handles)
        _release_done(failing)


_failing = []  # handles of parts that take their places failing (Call.abandon), until they are done
_failing_lock = threading.Lock()


def _release_done(more):
    """Adds the handles `more` to those failing, and releases (ddl_wait) those whose ops are done."""
    done = ctypes.c_int()
    with _failing_lock:  # ddl_test and ddl_wait let go of the GIL: another thread may be here
        _failing.extend(more)
        for h in list(_failing):
            if L.lib.ddl_test(h, ctypes.byref(done)) != L.SUCCESS or done.value:
                _failing.remove(h)
                L.lib.ddl_wait(h)
