"""libddl's per-op calls on the faces' hot paths (docs/python-overhead.md).

    handle = allreduce(name, send, recv, count, dtype, op, options_address)   # ddl_allreduce_ex (name: bytes or None)
    status = wait(handle)                                                     # ddl_wait, GIL released

    handle = allreduce_tensor(tensor, output, average, name, op, prescale, postscale, process_set)
                                 # a whole allreduce_async(_) of the common case, or None (bind_tensor_path)
    done = poll(handle_map, handle)  # True/False, None for no record: lookup and tests as one step

    allreduce_async_, synchronize = tensor_entries(allreduce_async_, synchronize, raise_for)
                                     # the face's own two, compiled around its Python ones (tensor_entries)

`allreduce` raises Refused(status) when libddl refuses the op (ddl_last_error() says why). Handles are
ints, which the ctypes prototypes of ddl_wait and ddl_test take as well.

The calls are compiled (ddl/_fastpath.c, CPython's stable ABI, no framework) where that module was
built and loads; otherwise they go through ctypes, with the same results and about 1 µs more per
submit. DDL_PYTHON_FASTPATH=0 takes ctypes anyway (the tests run both). `compiled` says which, and
`why_not_compiled` why not.
"""

import ctypes
import os
import threading

from ddl import _lib as L
from ddl.common import call_sites


class _CtypesRefused(Exception):
    """libddl refused the op; args[0] is its ddl_status."""


def _load_compiled():
    """(the compiled module, None) or (None, why not)."""
    if os.environ.get("DDL_PYTHON_FASTPATH", "1") == "0":
        return None, "DDL_PYTHON_FASTPATH=0"
    if call_sites.ENABLED:  # the compiled path's options are shared by every call of a shape
        return None, "DDL_CHECK_CALL_SITES=1"
    try:
        from ddl import _fastpath
    except ImportError as error:  # not built (no Python headers at build time), or a Python older than 3.10
        return None, f"ddl/_fastpath does not load: {error}"
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    _fastpath.bind(address(L.lib.ddl_allreduce_ex), address(L.lib.ddl_wait), address(L.lib.ddl_test))
    return _fastpath, None


def _ctypes_allreduce():
    # A prototype of its own that takes the options' address as an int (the shared one takes
    # POINTER(OpOptions)); lib[...] makes a new function object, lib.name would be the shared one.
    fn = L.lib["ddl_allreduce_ex"]
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                   ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int

    def allreduce(name, send, recv, count, dtype, op, options):
        handle = ctypes.c_void_p()
        status = fn(name, send, recv, count, dtype, op, options, ctypes.byref(handle))
        if status != L.SUCCESS:
            raise _CtypesRefused(status)
        return handle.value

    return allreduce


# Held by a face's synchronize() while it takes a record out of its handle map, and by the ctypes
# poll() across its lookup and tests (ddl_test through ctypes releases the GIL): so no handle is
# tested after another thread freed it. The compiled poll() needs no lock: it runs under the GIL.
registry_lock = threading.Lock()


def _ctypes_poll(handle_map, number):
    with registry_lock:
        record = handle_map.get(number)
        if record is None:
            return None
        done = ctypes.c_int(0)
        for handle in (record.handle,) if type(record) is TensorRecord else record.c_handles:
            if L.lib.ddl_test(handle, ctypes.byref(done)) != L.SUCCESS or not done.value:
                return False
        return True


class _NoTensorRecord(tuple):
    """Where the module is not compiled no op is a TensorRecord: this type is never made."""


_compiled, why_not_compiled = _load_compiled()
compiled = _compiled is not None
if compiled:
    allreduce, wait, Refused, poll = _compiled.allreduce, _compiled.wait, _compiled.Refused, _compiled.poll
    # The record of an op of the compiled tensor path in a face's handle map: a named tuple
    # (handle, output, input, name) made in C.
    TensorRecord = _compiled.TensorRecord
else:
    allreduce, wait, Refused, poll = _ctypes_allreduce(), L.lib.ddl_wait, _CtypesRefused, _ctypes_poll
    TensorRecord = _NoTensorRecord


def _not_common(*args):
    return None


def bind_tensor_path(dtypes, ops, world_options, world_set, taken, handle_map, handle_numbers):
    """allreduce_tensor compiled and bound to a face's tables, or a function that always answers None
    (take the general path) where the module is not compiled. The ops it starts are finished by the
    compiled synchronize (tensor_entries).

    dtypes: the face's dtype -> ddl_dtype; ops: Horovod's op (None: the default) -> ddl_reduce_op;
    world_options: shape -> (address, object) of the world's plain options (host_ops.world_plain_addresses);
    world_set: the global process set; taken: the names in flight in it (names.taken_in(0));
    handle_map, handle_numbers: the face's handle registry, where each op goes as a TensorRecord.
    One face binds it: ddl.torch."""
    if not compiled:
        return _not_common
    _compiled.bind_tensor_path(dtypes, ops, world_options, world_set, taken, handle_map, handle_numbers)
    return _compiled.allreduce_tensor


def tensor_entries(allreduce_async_, synchronize, raise_for):
    """The face's allreduce_async_ and synchronize: compiled functions that take the common case
    (allreduce_tensor's, and the finishing of its ops) themselves and call the given Python
    functions, with the arguments as given, for everything else; or the given functions themselves
    where the module is not compiled. raise_for(status) raises the face's exception for an op that failed. Bind the
    tensor path first."""
    if not compiled:
        return allreduce_async_, synchronize
    _compiled.bind_entries(allreduce_async_, synchronize, raise_for)
    return _compiled.allreduce_async_, _compiled.synchronize
