"""libddl's C API through ctypes: finding the library, the prototypes, statuses and dtypes."""

import ctypes
import os
import sys

# ddl_status
SUCCESS, INVALID_ARGUMENT, NOT_INITIALIZED, MISMATCH, TIMEOUT, PEER_FAILED, BOOTSTRAP, INTERNAL, UNSUPPORTED = range(9)
# ddl_dtype
FLOAT16, BFLOAT16, FLOAT32, FLOAT64, INT32, INT64, UINT8, INT8, INT16 = range(9)
BOOL, UINT16, UINT32, UINT64 = range(9, 13)  # moved only (broadcast, allgather, alltoall)
# ddl_reduce_op
SUM, AVERAGE, MIN, MAX, PRODUCT = range(5)
# op flags
COMPRESS_FP16 = 1
CUDA_BUFFERS = 2
BLOCKING = 4  # DDL_BLOCKING: the op runs to completion on the calling thread
ORDERED = 8  # DDL_ORDERED: the op's name is its place in an order the caller counts (a torch group's ops)


class OpOptions(ctypes.Structure):
    _fields_ = [
        ("process_set", ctypes.c_void_p),
        ("prescale", ctypes.c_double),
        ("postscale", ctypes.c_double),
        ("flags", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("shape", ctypes.POINTER(ctypes.c_longlong)),
        ("ndim", ctypes.c_int),
        ("group_size", ctypes.c_uint),  # a part of a grouped call of this many ops (0: not grouped)
        ("call_site", ctypes.c_char_p),  # "train.py:42" under DDL_CHECK_CALL_SITES=1 (common/call_sites.py)
    ]


# ddl_store: a key-value store the program shares with its peers (ddl_init_with_store)
STORE_DELIVER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
STORE_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
STORE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_longlong, STORE_DELIVER,
                             ctypes.c_void_p)


class Store(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("set", STORE_SET), ("get", STORE_GET)]


def _candidates():
    """Where this package's libddl is: $DDL_LIBRARY, beside an installed package (PREFIX/lib), the build
    tree, then the loader's path. A place is tried only where the package's own layout puts it, so a
    package copied elsewhere (pip install --target) never pairs with some other libddl nearby."""
    explicit = os.environ.get("DDL_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.dirname(os.path.abspath(__file__))
    packages = os.path.dirname(here)
    found = []
    # PREFIX/lib/python3.X/site-packages/ddl (pip: a venv, conda env, --user or --prefix) or
    # PREFIX/lib/python3/dist-packages/ddl (cmake --install): libddl is in PREFIX/lib.
    if os.path.basename(packages) in ("site-packages", "dist-packages") and \
            os.path.basename(os.path.dirname(packages)).startswith("python3"):
        found.append(os.path.join(packages, "..", "..", "libddl.so.0"))
    if os.path.basename(packages) == "python":  # BUILD/python/ddl: BUILD/runtime
        found.append(os.path.join(packages, "..", "runtime", "libddl.so.0"))
    found.append("libddl.so.0")  # the loader's path: LD_LIBRARY_PATH (module load ddl)
    return found


def _why_not_loaded(errors):
    """The hint for a libddl that did not load, from what the loader said."""
    said = " ".join(errors)
    if "libcudart" in said:
        return ("this libddl was built with CUDA and needs the CUDA runtime (libcudart) it was built against: "
                "load your site's CUDA module (module load cuda) or put its lib folder on LD_LIBRARY_PATH; "
                "for CPU-only nodes without CUDA, install ddl built with -DDDL_WITH_NCCL=OFF")
    if os.environ.get("DDL_LIBRARY"):
        return "DDL_LIBRARY does not name a libddl that loads: point it at a libddl.so.0, or unset it"
    if not any(os.sep in path and os.path.exists(path.split(":")[0]) for path in errors):
        return ("no libddl is installed with this package (pip install --target leaves a wheel's library out): "
                "install ddl into a venv or conda env, with pip install --prefix, or with cmake --install; "
                "or set DDL_LIBRARY to the path of its libddl.so.0")
    return "set DDL_LIBRARY to the path of libddl.so.0, or reinstall ddl"


def _load():
    errors = []
    for path in _candidates():
        try:
            library = ctypes.CDLL(os.path.normpath(path) if os.sep in path else path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        _check_version(library, path)
        return library
    raise ImportError(f"ddl: cannot load libddl: {_why_not_loaded(errors)} (tried: {'; '.join(errors)})")


def _check_version(library, path):
    """A libddl of another version than this package's (an older install on LD_LIBRARY_PATH, another
    prefix's) has other prototypes and behaviour: refused, naming both."""
    from ddl import __version__
    library.ddl_version.restype = ctypes.c_char_p
    theirs = library.ddl_version().decode()
    if theirs != __version__:
        raise ImportError(f"ddl: the libddl loaded from {path} is version {theirs}, this package {__version__}: "
                          "reinstall ddl so that both match, or set DDL_LIBRARY to this version's libddl.so.0")


lib = _load()

_c = ctypes
_status = _c.c_int
_handle_p = _c.POINTER(_c.c_void_p)
_size_p = _c.POINTER(_c.c_size_t)
_opts_p = _c.POINTER(OpOptions)

_PROTOTYPES = {
    "ddl_init": ([], _status),
    "ddl_init_with_store": ([_c.c_int, _c.c_int, _c.POINTER(Store)], _status),
    "ddl_world_source": ([], _c.c_char_p),
    "ddl_finalize": ([], _status),
    "ddl_is_initialized": ([], _c.c_int),
    "ddl_rank": ([_c.POINTER(_c.c_int)], _status),
    "ddl_size": ([_c.POINTER(_c.c_int)], _status),
    "ddl_local_rank": ([_c.POINTER(_c.c_int)], _status),
    "ddl_local_size": ([_c.POINTER(_c.c_int)], _status),
    "ddl_node_rank": ([_c.POINTER(_c.c_int)], _status),
    "ddl_last_error": ([], _c.c_char_p),
    "ddl_nccl_version": ([], _c.c_char_p),
    "ddl_nccl_path": ([], _c.c_char_p),
    "ddl_nccl_origin": ([], _c.c_char_p),
    "ddl_nccl_error": ([], _c.c_char_p),
    "ddl_has_pmix": ([], _c.c_int),
    "ddl_wait": ([_c.c_void_p], _status),
    "ddl_test": ([_c.c_void_p, _c.POINTER(_c.c_int)], _status),
    "ddl_process_set_create": ([_c.POINTER(_c.c_int), _c.c_int, _handle_p], _status),
    "ddl_process_set_create_among": ([_c.POINTER(_c.c_int), _c.c_int, _c.c_char_p, _c.c_double, _handle_p], _status),
    "ddl_process_set_destroy": ([_c.c_void_p], _status),
    "ddl_process_set_rank": ([_c.c_void_p, _c.POINTER(_c.c_int)], _status),
    "ddl_process_set_size": ([_c.c_void_p, _c.POINTER(_c.c_int)], _status),
    "ddl_allreduce_ex": ([_c.c_char_p, _c.c_void_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_broadcast_ex": ([_c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_int, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_allgatherv_ex": ([_c.c_char_p, _c.c_void_p, _c.c_void_p, _size_p, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_alltoallv_ex": ([_c.c_char_p, _c.c_void_p, _size_p, _c.c_void_p, _size_p, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_allgather_any_ex": ([_c.c_char_p, _c.c_void_p, _c.c_size_t, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_gathered": ([_c.c_void_p, _size_p, _c.POINTER(_c.c_void_p)], _status),
    "ddl_alltoall_any_ex": ([_c.c_char_p, _c.c_void_p, _size_p, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_reducescatter_ex": ([_c.c_char_p, _c.c_void_p, _c.c_void_p, _size_p, _c.c_int, _c.c_int, _opts_p, _handle_p], _status),
    "ddl_barrier_ex": ([_c.c_void_p, _handle_p], _status),
    "ddl_fail_ex": ([_c.c_char_p, _c.c_char_p, _opts_p, _handle_p], _status),
    "ddl_join": ([_c.c_void_p, _c.POINTER(_c.c_int)], _status),
    "ddl_timeline_start": ([_c.c_char_p], _status),
    "ddl_timeline_stop": ([], _status),
}

for _name, (_args, _ret) in _PROTOTYPES.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.argtypes = _args
        _fn.restype = _ret


def last_error():
    return lib.ddl_last_error().decode(errors="replace")


def int_out(fn, *args):
    """Calls a getter `fn(..., int*)` and returns the int, or raises on failure."""
    v = _c.c_int(0)
    status = fn(*args, _c.byref(v))
    if status != SUCCESS:
        raise_for(status)
    return v.value


class DdlError(RuntimeError):
    """A failure inside libddl that is not one of Horovod's own error kinds."""


_raisers = {}


def register_raisers(mapping):
    """ddl.torch maps statuses to Horovod's exception types."""
    _raisers.update(mapping)


def raise_for(status, message=None):
    """Raises the exception the face registered for `status`; it carries the status as `ddl_status`."""
    message = message or last_error()
    error = _raisers.get(status, DdlError)(message)
    error.ddl_status = status
    raise error


def size_array(values):
    """A size_t[] of `values`, as the ddl_*_ex functions take counts."""
    return (_c.c_size_t * len(values))(*values)


def submit(fn, *args):
    """Calls a ddl_*_ex function whose last argument is the handle it makes; returns the handle (an
    int, as the compiled path's handles: ddl_wait takes both alike), raising the face's exception for
    an op refused at once."""
    h = _c.c_void_p()
    status = fn(*args, _c.byref(h))
    if status != SUCCESS:
        raise_for(status)
    return h.value


def wait_all(handles):
    """Waits for every handle, so that none stays in flight when one failed, then raises the first failure."""
    failure = None
    for h in handles:
        status = lib.ddl_wait(h)
        if status != SUCCESS and failure is None:
            failure = (status, last_error())
    if failure:
        raise_for(*failure)


def gathered(handle, n):
    """What ddl_gathered keeps with an allgather-any's or alltoall-any's handle (which stays unreleased):
    the `n` per-rank element counts and the address of the elements, raising for a failed op."""
    counts = (_c.c_size_t * n)()
    data = _c.c_void_p()
    status = lib.ddl_gathered(handle, counts, _c.byref(data))
    if status != SUCCESS:
        raise_for(status)
    return list(counts), data


def wait_quietly(handles):
    """Waits for every handle, ignoring how the ops ended: the clean-up after a failure of one's own."""
    for h in handles:
        lib.ddl_wait(h)
