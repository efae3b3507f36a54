"""Blocking collectives on host (numpy) arrays, for faces whose tensors reach libddl through numpy
(TensorFlow, Keras). Each call claims its op names, submits every array of the call to libddl at once
(so a group of gradients is one fused round, not one round trip per tensor), waits, and returns new
arrays. Names: an explicit one is used as given ("allreduce.NAME"); None counts up alike on every rank.
"""

import ctypes

import numpy as np

from ddl import _lib as L
from ddl.common import basics
from ddl.common import call_sites
from ddl.common import dtypes
from ddl.common import op_core
from ddl.common.reductions import Average, Sum, Adasum, Min, Max, Product, REDUCE, reduce_op, reducescatter_op  # noqa: F401
from ddl.common.rows import alltoall_rows, row_elements
from ddl.common.tensor_adapters import numpy_tensors
from ddl.common.names import names
from ddl.common.process_sets import ProcessSet, _registry, global_process_set

_DTYPES = dtypes.BY_NAME
NUMPY = numpy_tensors()


# Where data only moves (allgather, broadcast, alltoall), a dtype libddl does not reduce (bool, uint16,
# uint32, uint64) travels as a view of the integer type of its size, while ranks agree on its own type
# (dtypes.MOVED_BY_NAME): a uint32 on one rank never pairs with an int32 on another.
_SAME_SIZE = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def movable(array):
    """`array` viewed as a dtype libddl can move (the same bytes), or itself when libddl has its dtype.

    Arguments:
        array: a numpy array.

    Returns:
        `array` itself when libddl has its dtype; else, for a boolean or integer dtype, a view of it as
        the type of its size that libddl moves (uint8, int16, int32 or int64).

    Raises:
        ValueError for any other dtype (complex, object, string, ...).
    """
    if array.dtype.name in _DTYPES:
        return array
    same = _SAME_SIZE.get(array.dtype.itemsize) if array.dtype.kind in "biu" else None
    if same is None:
        raise ValueError(f"tensors of type {array.dtype.name} cannot be moved: use a boolean, integer or "
                         f"floating type")
    return array.view(same)


def ddl_dtype(array, moves_only=False):
    """libddl's dtype of a numpy array; bool travels as uint8 where data only moves.

    Arguments:
        array: a numpy array.
        moves_only: True where the data only moves (allgather, broadcast, alltoall): bool and the
            unsigned 16-64 bit types then have types of their own.

    Returns:
        libddl's dtype code (ddl._lib.FLOAT16, ...).

    Raises:
        ValueError for a dtype libddl has no type for (bool among them unless moves_only).
    """
    return op_core.libddl_dtype(NUMPY, array, moves_only)


def target(process_set):
    """Checks that `process_set` is usable by this rank and returns it.

    Arguments:
        process_set: a ProcessSet.

    Returns:
        `process_set`.

    Raises:
        ValueError before init(), for anything that is not a ProcessSet (None included), and for a set
        not added (with add_process_set()), removed since, or without this rank.
    """
    basics.check_initialized()
    if process_set is global_process_set:  # every rank is in the world: nothing more to check (a hot path)
        return process_set
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set must be a ProcessSet, not {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise ValueError(f"{process_set} was not added: call hvd.add_process_set() on every rank first")
    if process_set.process_set_id != 0 and process_set.process_set_id not in _registry:
        raise ValueError(f"{process_set} was removed")
    if not process_set.included():
        raise ValueError(f"rank {basics.world_rank()} is not in {process_set}: call this op only on its ranks")
    return process_set


def root_in_set(root_rank, process_set):
    """The set rank of world rank `root_rank`.

    Arguments:
        root_rank: a world rank (an int or a numpy integer; not a bool).
        process_set: the ProcessSet the rank is to be in.

    Returns:
        the rank of `root_rank` within `process_set` (the world rank itself for the world's set).

    Raises:
        ValueError for a root_rank that is not an int, or that is not a rank of the set.
    """
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)):
        raise ValueError(f"root_rank must be an int, not {type(root_rank).__name__}")
    root_rank = int(root_rank)
    if process_set.process_set_id == 0:
        if not 0 <= root_rank < process_set.size():
            raise ValueError(f"root_rank {root_rank} is not a rank of the world of {process_set.size()}")
        return root_rank
    if root_rank not in process_set.ranks:
        raise ValueError(f"root_rank {root_rank} is not in {process_set}")
    return process_set.ranks.index(root_rank)


# libddl copies an op's options when the op is submitted, so one options structure serves every op
# with the same set, shape, scaling and flags: a training step's gradients find theirs here instead
# of building a ctypes structure per op (the largest piece of a call's cost, docs/python-overhead.md).
_options_cache = {}
_OPTIONS_CACHE_LIMIT = 4096


def options(process_set, shape=None, prescale=1.0, postscale=1.0, flags=0, stream=None, group_size=0):
    """libddl's options of an op (the shape is kept alive with them). Shared: never change one.
    `group_size`: the op is one of a grouped call of that many, which every rank must agree on.
    Under DDL_CHECK_CALL_SITES=1 each op's options are its own, with its caller's place."""
    if stream is not None or call_sites.ENABLED:
        return _new_options(process_set, shape, prescale, postscale, flags, stream, group_size)
    if shape is not None and not isinstance(shape, tuple):
        shape = tuple(shape)
    prescale, postscale = float(prescale), float(postscale)  # numpy scalars and the like: hashable, exact
    key = (process_set._c_handle, shape, prescale, postscale, flags, group_size)
    opts = _options_cache.get(key)
    if opts is None:
        if len(_options_cache) >= _OPTIONS_CACHE_LIMIT:
            _options_cache.clear()
        opts = _options_cache[key] = _new_options(process_set, shape, prescale, postscale, flags, None, group_size)
    return opts


_world_plain_options = {}  # shape -> options: the world's set, no scaling, no flags (most gradients)
world_plain_addresses = {}  # shape -> (address, options), for the compiled tensor path (common/fastpath.py)


def world_options(shape, prescale=1.0, postscale=1.0):
    """options(global_process_set, shape, prescale, postscale) with one dict lookup for the common case.

    Arguments:
        shape, prescale, postscale: as options.

    Returns:
        the options of an op in the world's set; without scaling (and without DDL_CHECK_CALL_SITES=1)
        one shared structure per shape, which is also listed in world_plain_addresses. Shared: never
        change one.
    """
    if prescale == 1.0 and postscale == 1.0 and not call_sites.ENABLED:
        opts = _world_plain_options.get(shape)
        if opts is None:
            if len(_world_plain_options) >= _OPTIONS_CACHE_LIMIT:
                _world_plain_options.clear()
                world_plain_addresses.clear()
            opts = _world_plain_options[tuple(shape)] = options(global_process_set, shape)
            world_plain_addresses[tuple(shape)] = (opts._address, opts)
        return opts
    return options(global_process_set, shape, prescale, postscale)


def _new_options(process_set, shape, prescale, postscale, flags, stream, group_size=0):
    opts = L.OpOptions()
    opts.group_size = group_size
    if call_sites.ENABLED:
        opts.call_site = call_sites.caller()
    opts.process_set = process_set._c_handle
    opts.prescale = prescale
    opts.postscale = postscale
    opts.flags = flags
    opts.stream = stream
    if shape:
        dims = (ctypes.c_longlong * len(shape))(*shape)
        opts.shape = dims
        opts.ndim = len(shape)
        opts._keep = dims
    opts._ref = ctypes.byref(opts)  # what the C calls take, made once
    opts._address = ctypes.addressof(opts)  # what the fast path's calls take (common/fastpath.py)
    return opts


def _ptr(array):
    return array.ctypes.data_as(ctypes.c_void_p)


def _contiguous(array):
    array = np.asarray(array)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def take_places_failing(kind, name, process_set, error, count=1, grouped=False):
    """Raises `error`, a face's own check that failed before its call reached host_ops (ddl.tensorflow's
    splits dtype), after the call's numbered parts took their places failing with it, as a check
    inside _run's call has them."""
    def refuse(_call):
        raise error
    _run(kind, name, process_set, count, grouped, refuse)


def _run(kind, name, process_set, count, grouped, submit_all):
    """Claims the op's name and runs `submit_all(call)`, which checks what only this rank might get
    wrong and submits the call's `count` ops through `call` (op_core.Call; NAME.i where `grouped` or
    count > 1); then waits for every handle (so nothing stays in flight when one fails) and raises
    the first failure: the submission's own, else the first op's that failed. Where `submit_all`
    raises, the ops it did not submit still take their places on every rank (Call.abandon)."""
    claim = names.claim(kind, name, process_set)
    call = op_core.Call.named(claim[1], count, grouped, process_set)
    try:
        submit_all(call)
    except BaseException as error:
        call.abandon(error)
        names.release(*claim)
        raise
    try:
        L.wait_all(call.handles)
    finally:
        names.release(*claim)


# ---- allreduce ----

def grouped_allreduce(arrays, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None,
                      kind="grouped_allreduce"):
    """Reduces every array of `arrays` over the process set in one libddl round; returns new arrays.

    Blocking: every array's op is submitted to libddl, then each one is waited for.

    Arguments:
        arrays: numpy arrays (or values np.asarray takes) of uint8, int8, int16, int32, int64, float16,
            bfloat16, float32 or float64; each must have the same shape and dtype on every rank.
        name: the op's name ("KIND.NAME"), which every rank must give alike; a group's arrays are
            NAME.0, NAME.1, ... None: unnamed ops, which libddl numbers alike on every rank.
        op: Average, Sum, Min, Max or Product (not checked here: another is a KeyError; the faces
            check it with reduce_op).
        prescale, postscale: each rank's input is multiplied by the first before the reduction, the
            result by the second after it.
        process_set: the ProcessSet to reduce over (checked by target(): None is a ValueError).
        kind: the kind the name is claimed under; other than "allreduce", the ops are one grouped call
            of len(arrays) for libddl, which every rank must agree on.

    Returns:
        a list of new arrays, in the order of `arrays` (an empty list, and no op, for no arrays).

    Raises:
        ValueError before init(), for a process set target() refuses, a dtype libddl has no type for,
        or a name already in flight on this rank; RuntimeError when ranks disagree on an op;
        HorovodInternalError when a rank times out or fails. Every op is waited for before the first
        failure is raised.
    """
    ps = target(process_set)
    inputs = [_contiguous(a) for a in arrays]
    outputs = [np.empty_like(a) for a in inputs]
    keep = []

    def submit_all(call):
        dtypes = [ddl_dtype(a) for a in inputs]
        for i, (src, dst, dtype) in enumerate(zip(inputs, outputs, dtypes)):
            opts = options(ps, src.shape, prescale, postscale, group_size=call.group_size)
            keep.append(opts)
            call.submit(L.lib.ddl_allreduce_ex, call.name(i), _ptr(src), _ptr(dst), src.size, dtype, REDUCE[op],
                        ctypes.byref(opts))

    if inputs:
        _run(kind, name, ps, len(inputs), kind != "allreduce", submit_all)
    return outputs


def allreduce(array, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None):
    """One allreduce on this thread (libddl's blocking fast path when the op is unnamed).

    The op is submitted with DDL_BLOCKING and runs to completion in this call.

    Arguments:
        array: a numpy array (or a value np.asarray takes) of a dtype grouped_allreduce takes.
        name: the op's name ("allreduce.NAME"), claimed for the call; None: an unnamed op.
        op, prescale, postscale, process_set: as grouped_allreduce.

    Returns:
        a new array of `array`'s shape and dtype holding the reduction.

    Raises: as grouped_allreduce.
    """
    ps = target(process_set)
    src = _contiguous(array)
    dtype = _DTYPES.get(NUMPY.dtype_of(src))
    if dtype is None:  # raised by the general path, where the op still takes its place on every rank
        return grouped_allreduce([src], name, op, prescale, postscale, process_set, kind="allreduce")[0]
    out = np.empty_like(src)
    opts = options(ps, src.shape, prescale, postscale, L.BLOCKING)
    claim = names.claim("allreduce", name, ps) if name is not None else None
    try:
        status = L.lib.ddl_allreduce_ex(claim[1].encode() if claim else None, _ptr(src), _ptr(out), src.size, dtype,
                                        REDUCE[op], ctypes.byref(opts), None)
    finally:
        if claim:
            names.release(*claim)
    if status != L.SUCCESS:
        L.raise_for(status)
    return out


# ---- allgather ----

def grouped_allgather(arrays, name=None, process_set=None, kind="grouped_allgather"):
    """Concatenates every rank's arrays along the first dimension (which may differ by rank).

    Blocking: every array's op is submitted to libddl, then the gathered rows of each are read.

    Arguments:
        arrays: numpy arrays (or values np.asarray takes) of a dtype libddl has, or of any boolean or
            integer dtype (moved as its bytes: movable()); each one's first dimension may differ by
            rank, every other must agree (a 0-d array counts as one row).
        name: as grouped_allreduce.
        process_set: the ProcessSet to gather over (checked by target(): None is a ValueError).
        kind: the kind the name is claimed under; other than "allgather", the ops are one grouped call
            of len(arrays) for libddl, which every rank must agree on.

    Returns:
        a list of new arrays, in the order of `arrays`: each one the ranks' rows in rank order, of its
        array's dtype (an empty list, and no op, for no arrays).

    Raises:
        ValueError before init(), for a process set target() refuses, a dtype that cannot be moved, or
        a name already in flight on this rank; RuntimeError when ranks disagree on an op (the
        trailing shape, the dtype); HorovodInternalError when a rank times out or fails.
    """
    ps = target(process_set)
    n = ps.size()
    inputs = []
    for a in arrays:
        a = _contiguous(a)
        inputs.append(a.reshape(1) if a.ndim == 0 else a)
    results = [None] * len(inputs)
    keep = []

    def submit_all(call):
        datas = [movable(a) for a in inputs]
        dtypes = [ddl_dtype(a, moves_only=True) for a in inputs]
        for i, (src, data, dtype) in enumerate(zip(inputs, datas, dtypes)):
            opts = options(ps, src.shape[1:], group_size=call.group_size)
            payload, payload_dtype = op_core.any_count_payload(NUMPY, data, dtype, src.shape, [src.shape[0]])
            keep.append((opts, payload))
            call.submit(L.lib.ddl_allgather_any_ex, call.name(i), _ptr(payload), payload.size, payload_dtype,
                        ctypes.byref(opts))
        # The gathered rows live with their handles: read them (ddl_gathered waits) before _run
        # releases the handles.
        for i, h in enumerate(call.handles):
            out, _ = op_core.read_gathered(NUMPY, h, n, datas[i], inputs[i].shape[1:])
            results[i] = NUMPY.as_dtype_of(out, inputs[i])

    if inputs:
        _run(kind, name, ps, len(inputs), kind != "allgather", submit_all)
    return results


def allgather(array, name=None, process_set=None):
    """Concatenates every rank's `array` along the first dimension (which may differ by rank).

    Arguments:
        array: as one array of grouped_allgather.
        name: the op's name ("allgather.NAME"), which every rank must give alike; None: an unnamed op.
        process_set: as grouped_allgather.

    Returns:
        a new array of the ranks' rows in rank order, of `array`'s dtype.

    Raises: as grouped_allgather.
    """
    return grouped_allgather([array], name, process_set, kind="allgather")[0]


# ---- broadcast ----

def grouped_broadcast(arrays, root_rank, name=None, process_set=None, kind="broadcast"):
    """root_rank's arrays (root_rank is a world rank) on every rank of the set, as new arrays.

    Blocking: every array's op is submitted to libddl, then each one is waited for.

    Arguments:
        arrays: on the root the data; on the other ranks numpy arrays (or values np.asarray takes) of
            the same shapes and dtypes. A dtype libddl has, or any boolean or integer dtype (moved as
            its bytes: movable()).
        root_rank: the world rank whose arrays every rank gets (it must be in the process set).
        name: the op's name ("KIND.NAME"), which every rank must give alike; with more than one array
            they are NAME.0, NAME.1, ... None: unnamed ops.
        process_set: the ProcessSet to broadcast over (checked by target(): None is a ValueError).
        kind: the kind the name is claimed under; other than "broadcast", the ops are one grouped call
            of len(arrays) for libddl, which every rank must agree on.

    Returns:
        a list of new C-contiguous arrays holding the root's values, in the order of `arrays` (an
        empty list, and no op, for no arrays).

    Raises:
        ValueError before init(), for a process set target() refuses, a root_rank that is not an int
        or not in the set, a dtype that cannot be moved, or a name already in flight on this rank;
        RuntimeError when ranks disagree on an op; HorovodInternalError when a rank times out or fails.
    """
    ps = target(process_set)
    outputs = [np.array(a, copy=True, order="C") for a in arrays]
    keep = []

    def submit_all(call):
        root = root_in_set(root_rank, ps)
        datas = [movable(o) for o in outputs]
        dtypes = [ddl_dtype(o, moves_only=True) for o in outputs]
        for i, (data, dtype) in enumerate(zip(datas, dtypes)):
            opts = options(ps, data.shape, group_size=call.group_size)
            keep.append(opts)
            call.submit(L.lib.ddl_broadcast_ex, call.name(i), _ptr(data), data.size, dtype, root, ctypes.byref(opts))

    if outputs:
        _run(kind, name, ps, len(outputs), kind != "broadcast", submit_all)
    return outputs


def broadcast(array, root_rank, name=None, process_set=None):
    """root_rank's `array` (root_rank is a world rank) on every rank of the set, as a new array.

    Arguments:
        array: as one array of grouped_broadcast.
        root_rank, process_set: as grouped_broadcast.
        name: the op's name ("broadcast.NAME"), which every rank must give alike; None: an unnamed op.

    Returns:
        a new C-contiguous array holding the root's values.

    Raises: as grouped_broadcast.
    """
    return grouped_broadcast([array], root_rank, name, process_set)[0]


# ---- alltoall ----

def alltoall(array, splits=None, name=None, process_set=None):
    """Rows splits[j] go to rank j of the set (equal splits when None). Returns (output, received_splits).

    Blocking: the op is submitted to libddl and waited for.

    Arguments:
        array: a numpy array (or a value np.asarray takes) of at least one dimension, of a dtype
            grouped_allgather takes; its rows (first dimension) are what is split.
        splits: how many rows go to each rank of the set (integers, one per rank, non-negative,
            summing to at most the first dimension); None: equal blocks (the first dimension must then
            be a multiple of the set's size).
        name: the op's name ("alltoall.NAME"), which every rank must give alike; None: an unnamed op.
        process_set: the ProcessSet (checked by target(): None is a ValueError).

    Returns:
        (output, received_splits): a new array of the rows every rank sent this one, in rank order, of
        `array`'s dtype; and an int32 array of how many rows came from each rank.

    Raises:
        ValueError before init(), for a process set target() refuses, a 0-d array, splits that are not
        integers or do not fit the rows, a dtype that cannot be moved, or a name already in flight on
        this rank; RuntimeError when ranks disagree on the op; HorovodInternalError when a rank times
        out or fails.
    """
    ps = target(process_set)
    n = ps.size()
    src = _contiguous(array)
    box = []

    def submit_all(call):
        if src.ndim == 0:
            raise ValueError("alltoall needs a tensor of at least one dimension")
        send = alltoall_rows(op_core.alltoall_splits(NUMPY, None if splits is None else np.asarray(splits)), src.shape[0], n)
        data = movable(src)
        row = row_elements(src.shape)
        payload, dtype = op_core.any_count_payload(NUMPY, data, ddl_dtype(src, moves_only=True), src.shape, send)
        sizes = [s * row for s in send] if row else [1] * n
        opts = options(ps, src.shape[1:])
        handle = call.submit(L.lib.ddl_alltoall_any_ex, call.name(0), _ptr(payload), L.size_array(sizes), dtype,
                             ctypes.byref(opts))
        box.append(op_core.read_gathered(NUMPY, handle, n, data, src.shape[1:]))

    _run("alltoall", name, ps, 1, False, submit_all)
    out, received = box[0]
    return NUMPY.as_dtype_of(out, src), np.asarray(received, dtype=np.int32)


# ---- reducescatter ----

def scatter_rows(first_dim, n):
    """Rows of each rank after a reducescatter: the first (rows % n) ranks get one more.

    Arguments:
        first_dim: the first dimension of the tensor reduced.
        n: the number of ranks.

    Returns:
        a list of `n` row counts, in rank order, summing to first_dim.
    """
    base, extra = divmod(first_dim, n)
    return [base + (1 if r < extra else 0) for r in range(n)]


def grouped_reducescatter(arrays, name=None, op=Average, prescale=1.0, postscale=1.0, process_set=None,
                          kind="grouped_reducescatter"):
    """Reduces each array over the set and gives this rank its share of the first dimension.

    Blocking: every array's op is submitted to libddl, then each one is waited for. Rank r's share
    is its rows of scatter_rows(first dimension, set size), in rank order.

    Arguments:
        arrays: numpy arrays (or values np.asarray takes) of at least one dimension, of a dtype
            grouped_allreduce takes; each must have the same shape and dtype on every rank.
        name, prescale, postscale: as grouped_allreduce.
        op: as grouped_allreduce (not checked here; the faces limit it to Sum or Average with
            reducescatter_op).
        process_set: the ProcessSet to reduce over (checked by target(): None is a ValueError).
        kind: the kind the name is claimed under; other than "reducescatter", the ops are one grouped
            call of len(arrays) for libddl, which every rank must agree on.

    Returns:
        a list of new arrays, this rank's shares, in the order of `arrays` (an empty list, and no op,
        for no arrays).

    Raises:
        ValueError for a 0-d array, otherwise as grouped_allreduce.
    """
    ps = target(process_set)
    n, me = ps.size(), ps.rank()
    inputs = [_contiguous(a) for a in arrays]
    outputs = []
    keep = []

    def submit_all(call):
        for a in inputs:
            if a.ndim == 0:
                raise ValueError("reducescatter needs a tensor of at least one dimension, not a scalar")
        dtypes = [ddl_dtype(a) for a in inputs]
        outputs.extend(np.empty((scatter_rows(a.shape[0], n)[me],) + a.shape[1:], dtype=a.dtype) for a in inputs)
        for i, (src, dst, dtype) in enumerate(zip(inputs, outputs, dtypes)):
            row = row_elements(src.shape)
            opts = options(ps, src.shape, prescale, postscale, group_size=call.group_size)
            keep.append(opts)
            call.submit(L.lib.ddl_reducescatter_ex, call.name(i), _ptr(src), _ptr(dst),
                        L.size_array([r * row for r in scatter_rows(src.shape[0], n)]), dtype, REDUCE[op],
                        ctypes.byref(opts))

    if inputs:
        _run(kind, name, ps, len(inputs), kind != "reducescatter", submit_all)
    return outputs


# ---- barrier ----

def barrier(process_set=global_process_set):
    """Returns when every rank of the process set has called it (every face's barrier).

    Arguments:
        process_set: the ProcessSet whose ranks wait for each other (every rank of it must call this).

    Raises:
        ValueError before init() and for a process set target() refuses; libddl's failures as
        grouped_allreduce raises them (HorovodInternalError when a rank times out or fails).
    """
    ps = target(process_set)
    status = L.lib.ddl_barrier_ex(ps._c_handle, None)  # a NULL handle: blocking, on this thread
    if status != L.SUCCESS:
        L.raise_for(status)
