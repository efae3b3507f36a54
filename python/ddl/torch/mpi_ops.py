"""Horovod's collective operations on PyTorch tensors, over libddl.

Host tensors go through libddl's host path (shared memory within a node, Gloo between nodes); CUDA
tensors through its NCCL path on PyTorch's current stream. A named op is "allreduce.NAME", which
ranks agree on in any order, as in Horovod; an unnamed one goes to libddl without a name, and
libddl numbers it ("unnamed.N", counted per process set alike on every rank, whichever path an op
takes on each rank: common/names.py).
"""

import ctypes
import itertools

import torch

from ddl import _lib as L
from ddl.common import basics as _basics
from ddl.common import fastpath as _fast
from ddl.common import dtypes as _dtypes
from ddl.common import host_ops as _host
from ddl.common import op_core as _core
from ddl.common.reductions import Average, Sum, Adasum, Min, Max, Product, REDUCE  # noqa: F401
from ddl.common.rows import alltoall_rows, row_elements
from ddl.common.tensor_adapters import torch_tensors
from ddl.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from ddl.common.names import names as _names
from ddl.common.process_sets import ProcessSet, global_process_set, _registry

_REDUCE = REDUCE
_DTYPES = _dtypes.torch_table()
_TENSORS = torch_tensors()


# ---- checks and small helpers ----

_check_initialized = _basics.check_initialized


def _ddl_dtype(tensor, moves_only=False):
    return _core.libddl_dtype(_TENSORS, tensor, moves_only)


def _is_cuda(tensor):
    if tensor.device.type == "cuda":
        return True
    if tensor.device.type != "cpu":
        raise ValueError(f"tensors on {tensor.device.type} are not supported: move it to the CPU or a CUDA GPU")
    return False


_reduce_op = _host.reduce_op


def _same_device(tensors):
    if len({t.is_cuda for t in tensors}) > 1:
        raise RuntimeError("grouped ops need every tensor on the same device (all CPU or all CUDA)")


_process_set_target = _host.target  # the C handle's set, checked usable by this rank


def _stream_of(tensor):
    return ctypes.c_void_p(torch.cuda.current_stream(tensor.device).cuda_stream)


def _options(process_set, tensor=None, shape=None, prescale=1.0, postscale=1.0, flags=0, group_size=0):
    """libddl's options of an op; a CUDA tensor's op runs on PyTorch's current stream. `group_size`:
    the op is one of a grouped call of that many (op_core.Call.named)."""
    if tensor is not None and tensor.is_cuda:
        return _host.options(process_set, shape, prescale, postscale, flags | L.CUDA_BUFFERS, _stream_of(tensor),
                             group_size)
    return _host.options(process_set, shape, prescale, postscale, flags, group_size=group_size)


# ---- names and handles ----

class _Pending:
    """One handle of the Python API: one or more libddl ops and what turns their buffers into the result."""
    __slots__ = ("c_handles", "finish", "claims", "keep", "collect")

    def __init__(self, c_handles, finish, claims, keep, collect=None):
        self.c_handles = c_handles
        self.finish = finish
        self.claims = claims
        self.keep = keep
        self.collect = collect  # reads results libddl keeps with a handle, before the handles are released


_handle_map = {}
_handle_numbers = itertools.count()
_allreduce_ex = L.lib.ddl_allreduce_ex


def _register(pending):
    handle = next(_handle_numbers)
    _handle_map[handle] = pending
    return handle


_wait_all = L.wait_all


def _release_claims(claims):
    for key, full in claims:
        _names.release(key, full)


def _start(kind, name, process_set, launch, parts=1, grouped=False):
    """Claims a name, runs `launch(call)` -> (finish, keep[, collect]), registers the handle.

    `call` (op_core.Call) names the call's `parts` libddl ops (NAME.i where `grouped`) and submits
    them (call.submit); every check only this rank might fail belongs in `launch`, so that where it
    raises, the parts it did not submit still take their places on every rank (Call.abandon)."""
    target = _process_set_target(process_set)
    claim = _names.claim(kind, name, target)
    call = _core.Call.named(claim[1], parts, grouped, target)
    try:
        finish, keep, *collect = launch(call)
    except BaseException as error:
        call.abandon(error)
        _names.release(*claim)
        raise
    return _register(_Pending(call.handles, finish, [claim], keep, *collect))


def _c_handles_of(pending):
    """The libddl handles of a registered op: a _Pending's, or the compiled tensor path's one (a
    fastpath.TensorRecord)."""
    return (pending.handle,) if type(pending) is _fast.TensorRecord else pending.c_handles


def _unknown_handle(handle):
    """The error for a handle synchronize/poll does not know. sparse_allreduce_async (as Horovod's)
    returns a callable, which is called for its result, not synchronized."""
    if callable(handle):
        return ValueError("this handle is sparse_allreduce_async's callable: call it (handle()) for the result "
                          "instead of passing it to synchronize or poll")
    return ValueError(f"handle {handle} was not returned by an async op, or was already synchronized")


def poll(handle):
    """True when the operation behind `handle` has finished (synchronize() then returns at once).
    Safe against synchronize() of the same handle on another thread (fastpath.poll)."""
    done = _fast.poll(_handle_map, handle)
    if done is None:
        raise _unknown_handle(handle)
    return done


def synchronize(handle):
    """Waits for the operation behind `handle` and returns its output (what the op's docstring
    says). Raises ValueError for a handle that no op returned or that was synchronized already, and
    the op's failure if it failed (RuntimeError for a mismatch between ranks, HorovodInternalError
    for a timeout or a rank that died)."""
    # Where ddl/_fastpath is compiled, synchronize is its function, which finishes the ops of the
    # compiled tensor path itself and calls this for every other handle (see the end of this file).
    with _fast.registry_lock:
        pending = _handle_map.pop(handle, None)
    if pending is None:
        raise _unknown_handle(handle)
    if type(pending) is _fast.TensorRecord:  # an op of the compiled tensor path
        status = _fast.wait(pending.handle)
        _names.release(global_process_set.process_set_id, pending.name)
        if status != L.SUCCESS:
            L.raise_for(status)
        return pending.output
    if pending.collect is None and len(pending.c_handles) == 1:  # one op, as each gradient's: the short way
        status = _fast.wait(pending.c_handles[0])
        _release_claims(pending.claims)
        if status != L.SUCCESS:
            L.raise_for(status)
    else:
        try:
            if pending.collect is not None:
                pending.collect()
        finally:
            try:
                _wait_all(pending.c_handles)
            finally:
                _release_claims(pending.claims)
    finish = pending.finish
    return finish if isinstance(finish, torch.Tensor) else finish()


def _drop_all_handles():
    """After libddl has finalized (and so failed what was still in flight): frees the handles left.
    Each record leaves the map before its handles are freed (the wait releases the GIL, and another
    thread may be synchronizing meanwhile), so none is freed twice."""
    while _handle_map:
        try:
            with _fast.registry_lock:
                _, pending = _handle_map.popitem()
        except KeyError:  # another thread took the last one
            break
        for h in _c_handles_of(pending):
            L.lib.ddl_wait(h)


_basics.on_shutdown(_drop_all_handles)


# ---- allreduce ----

def _scale_like_horovod(tensor, factor):
    """tensor * factor as Horovod computes it: integers in float64; float16 on the CPU in float32,
    on a GPU with the factor first rounded to float16 (Horovod's CUDA kernel scales in half)."""
    if factor == 1.0:
        return tensor
    if not tensor.is_floating_point():
        return (tensor.double() * factor).to(tensor.dtype)
    if tensor.dtype in (torch.float16, torch.bfloat16):
        if tensor.is_cuda:
            return tensor * torch.tensor(factor, dtype=tensor.dtype).item()
        return (tensor.float() * factor).to(tensor.dtype)
    return tensor * factor


@torch.no_grad()
def _copy_into(output, result):
    """Writes an op's result into the caller's tensor. Outside autograd: the in-place ops' tensor may
    be a leaf that requires grad (a Parameter, as broadcast_parameters gives), which autograd refuses
    to change in place; the ops' gradients are their autograd Functions' business."""
    output.copy_(result)
    return output


def _average_scaled_once(op, postscale, size):
    """(op, postscale) for a reduction whose postscale runs after it, here: an Average with a
    postscale is a Sum scaled once by postscale / size, as Horovod computes it (libddl does so on
    the host). Averaged first, the result would be rounded twice: 3 summed over 2 ranks and scaled
    by 3 is 4, not (3 // 2) * 3 = 3."""
    if op == Average and postscale != 1.0:
        return Sum, postscale / size
    return op, postscale


def _launch_allreduce(call, i, tensor, output, op, prescale, postscale, flags=0):
    """Submits part `i` of `call`: an allreduce of `tensor` into `output` (both contiguous).

    Returns (finish_fn or None, temporaries): the caller keeps the temporaries alive until the part
    completes, since libddl reads them later, from its own thread."""
    dtype = _ddl_dtype(tensor)
    cuda = _is_cuda(tensor)
    if cuda and (prescale != 1.0 or postscale != 1.0 or dtype == L.INT16):
        op, postscale = _average_scaled_once(op, postscale, call.process_set.size())
        if dtype == L.INT16:  # NCCL has no int16: reduce a staged int32 copy
            staged = tensor.to(torch.int32)
            scaled = _scale_like_horovod(staged, prescale)
            _launch_allreduce(call, i, scaled, staged, op, 1.0, 1.0)
            return lambda: _copy_into(output, _scale_like_horovod(staged, postscale)), (staged, scaled)
        scaled = _scale_like_horovod(tensor, prescale).contiguous()
        _launch_allreduce(call, i, scaled, output, op, 1.0, 1.0)
        return lambda: _copy_into(output, _scale_like_horovod(output, postscale)), (scaled,)
    opts = _options(call.process_set, tensor, tuple(tensor.shape), prescale, postscale, flags, call.group_size)
    call.submit(L.lib.ddl_allreduce_ex, call.name(i), tensor.data_ptr(), output.data_ptr(), tensor.numel(), dtype,
                _REDUCE[op], ctypes.byref(opts))
    return None, (opts,)


def _allreduce_group_async(kind, tensors, outputs, name, op, prescale, postscale, process_set, flags=0):
    """Starts one allreduce per tensor (fused by libddl) under one handle; the outputs are returned."""

    def launch(call):
        _same_device(tensors)
        finishers, keep = [], []
        for i, (tensor, out) in enumerate(zip(tensors, outputs)):
            src = tensor.contiguous()
            dst = out if out.is_contiguous() else out.contiguous()
            after, temporaries = _launch_allreduce(call, i, src, dst, op, prescale, postscale, flags)
            keep.append((src, dst, temporaries))
            finishers.append((after, out, dst))

        def finish():
            results = []
            for after, out, dst in finishers:
                if after is not None:
                    after()
                if dst.data_ptr() != out.data_ptr():
                    _copy_into(out, dst)
                results.append(out)
            return results
        return finish, keep

    return _start(kind, name, process_set, launch, len(tensors), kind == "grouped_allreduce")


def _single(handle_of_group):
    pending = _handle_map[handle_of_group]
    group_finish = pending.finish
    pending.finish = lambda: group_finish()[0]
    return handle_of_group


def _allreduce_one_async(tensor, output, name, op, prescale, postscale, process_set):
    """One allreduce: contiguous host tensors of libddl's dtypes take a short path (this is every
    gradient of a DistributedOptimizer step, where each step of it counts); the rest go through
    the general one, which also raises for what cannot be reduced."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None or not tensor.is_cpu or not tensor.is_contiguous() or not output.is_contiguous():
        return _single(_allreduce_group_async("allreduce", [tensor], [output], name, op, prescale, postscale,
                                              process_set))
    if process_set is global_process_set and name is not None:
        # A named op in the world's set (every gradient of a DistributedOptimizer step) leaves the
        # check for init to libddl, which refuses an op before it: that saves a C call per op. An
        # unnamed op checks first, since its claim counts, and the count must stay alike on every rank.
        target, opts = process_set, _host.world_options(tensor.shape, prescale, postscale)
    else:
        target = _process_set_target(process_set)
        opts = _host.options(target, tensor.shape, prescale, postscale)
    claim = _names.claim("allreduce", name, target)
    try:
        h = _fast.allreduce(_names.encoded(claim[1]), tensor.data_ptr(), output.data_ptr(), tensor.numel(), dtype,
                            _REDUCE[op], opts._address)
        return _register(_Pending((h,), output, (claim,), (tensor, opts)))
    except _fast.Refused as refused:
        status = refused.args[0]  # raised below, outside this handler: the Refused is no part of the story
    except BaseException:
        _names.release(*claim)
        raise
    _names.release(*claim)
    _check_initialized()  # Horovod's words for an op before init
    L.raise_for(status)


# A whole allreduce_async(_) in one compiled call where it is the common case (a named, contiguous host
# tensor in the world's set, no scaling: every gradient of a DistributedOptimizer step); None otherwise.
_allreduce_tensor = _fast.bind_tensor_path(_DTYPES, {None: L.AVERAGE, **_REDUCE}, _host.world_plain_addresses,
                                       global_process_set, _names.taken_in(global_process_set.process_set_id),
                                       _handle_map, _handle_numbers)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce of `tensor` into a new tensor and returns a handle at once.

    Arguments:
        tensor: a CPU or CUDA tensor of uint8, int8, int16, int32, int64, float16, bfloat16, float32
            or float64 (int16 on CUDA goes through an int32 copy: NCCL has none).
        average: deprecated; True is op=Average, False op=Sum (not together with op).
        name: the op's name, which every rank must give alike; ranks may then submit named ops in
            any order. None: the next unnamed op, which ranks must submit in the same order.
        op: Average (the default), Sum, Min, Max or Product (Adasum: NotImplementedError).
        prescale_factor, postscale_factor: each rank's input is multiplied by the first before the
            reduction, the result by the second after it (Average's division comes first).
        process_set: the ProcessSet to reduce over (every rank of it must call this).

    Returns:
        a handle: synchronize(handle) waits and returns the reduced tensor (a new one, of `tensor`'s
        shape, dtype and device); poll(handle) says whether it is done.

    Raises:
        ValueError for an argument no rank could run (a dtype, a device, an op, a name in flight);
        from synchronize(): RuntimeError when ranks disagree on the op (shape, dtype, reduction),
        HorovodInternalError when a rank times out (DDL_TIMEOUT) or dies.
    """
    output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    handle = _allreduce_tensor(tensor, output, average, name, op, prescale_factor, postscale_factor, process_set)
    if handle is not None:
        return handle
    op = _reduce_op(op, average)
    return _allreduce_one_async(tensor, output, name, op, prescale_factor, postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """Starts an in-place allreduce of `tensor` and returns a handle at once.

    As allreduce_async (same arguments and errors), but the result goes into `tensor` itself, which
    must stay untouched until synchronize(handle) returns it.
    """
    # Where ddl/_fastpath is compiled, allreduce_async_ is its function, which takes the compiled
    # tensor path's case itself and calls this for every other (see the end of this file).
    op = _reduce_op(op, average)
    return _allreduce_one_async(tensor, tensor, name, op, prescale_factor, postscale_factor, process_set)


# A gradient's allreduce_async_ and its synchronize, each one compiled call without a Python frame
# around it, where ddl/_fastpath is built; the Python functions above otherwise.
_synchronize_general = synchronize  # the Python one, which also finishes the compiled path's records
allreduce_async_, synchronize = _fast.tensor_entries(allreduce_async_, synchronize, L.raise_for)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """Reduces `tensor` in place over the process set and returns it once done.

    As allreduce_async (same arguments and errors), but blocking: the op runs on this thread.
    """
    return allreduce_now(tensor, tensor, name, _reduce_op(op, average), prescale_factor, postscale_factor, process_set)


def _run_now(kind, fn, name, target, *args):
    """Calls a ddl_*_ex function with DDL_BLOCKING (the op runs on this thread, and in a steady state
    without a negotiation round of its own). An unnamed op stays unnamed for libddl, which numbers
    such ops alike on every rank and so can run them in that steady state too; a named one is
    claimed for the call, as its async form would be."""
    claim = _names.claim(kind, name, target) if name is not None else None
    try:
        status = fn(claim[1].encode() if claim else None, *args, None)
    finally:
        if claim:
            _names.release(*claim)
    if status != L.SUCCESS:
        L.raise_for(status)


def allreduce_now(tensor, output, name, op, prescale, postscale, process_set):
    """A blocking allreduce of `tensor` into `output` (which may be `tensor`); returns `output`.
    Host tensors, and CUDA tensors that NCCL reduces as they are (no scaling, no int16, which the
    asynchronous path stages), run on this thread (DDL_BLOCKING); a CUDA one is done on the GPU when
    this returns, as synchronize() would have it."""
    dtype = _DTYPES.get(tensor.dtype)
    runs_here = tensor.is_cpu or (tensor.is_cuda and prescale == 1.0 and postscale == 1.0 and dtype != L.INT16
                                  and output.device == tensor.device)
    if dtype is None or not runs_here or not tensor.is_contiguous() or not output.is_contiguous():
        return synchronize(_allreduce_one_async(tensor, output, name, op, prescale, postscale, process_set))
    target = _process_set_target(process_set)
    opts = _options(target, tensor, tuple(tensor.shape), prescale, postscale, L.BLOCKING)
    _run_now("allreduce", _allreduce_ex, name, target, tensor.data_ptr(), output.data_ptr(), tensor.numel(), dtype,
             _REDUCE[op], opts._ref)
    return output


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts one allreduce per tensor of `tensors`, reduced together (fused where libddl can), and
    returns one handle for them all.

    Arguments: as allreduce_async, with `tensors` a list of tensors all on one device; a named group
    names its parts NAME.0, NAME.1, ..., and ranks must give groups of the same size.

    Returns:
        a handle: synchronize(handle) returns the list of reduced tensors (new ones), in order.

    Raises: as allreduce_async; RuntimeError for tensors on different devices.
    """
    op = _reduce_op(op, average)
    outputs = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    return _allreduce_group_async("grouped_allreduce", list(tensors), outputs, name, op, prescale_factor,
                                  postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    """As grouped_allreduce_async, but each result goes into its own input tensor; synchronize()
    returns `tensors`."""
    op = _reduce_op(op, average)
    return _allreduce_group_async("grouped_allreduce", list(tensors), list(tensors), name, op, prescale_factor,
                                  postscale_factor, process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """As grouped_allreduce_async_, blocking: returns `tensors`, reduced in place."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


# ---- allgather ----

def _launch_allgather(call, i, tensor):
    """Submits part `i` of `call`: an allgather whose first dimensions may differ by rank (libddl
    exchanges them). Returns (collect, result, keep): collect() reads the gathered rows before the
    handle is released; result() is the gathered tensor."""
    src = tensor.contiguous()
    if src.dim() == 0:
        src = src.reshape(1)
    device = src.device if _is_cuda(src) else None
    data = src.view(torch.uint8) if src.dtype == torch.bool else src
    dtype = _ddl_dtype(src, moves_only=True)
    if device is not None:
        data = data.cpu()  # gathered through the host: NCCL needs every rank's count up front
    payload, payload_dtype = _core.any_count_payload(_TENSORS, data, dtype, src.shape, [src.shape[0]])
    opts = _options(call.process_set, None, tuple(src.shape[1:]), group_size=call.group_size)
    h = call.submit(L.lib.ddl_allgather_any_ex, call.name(i), payload.data_ptr(), payload.numel(), payload_dtype,
                    ctypes.byref(opts))
    box = []
    n = call.process_set.size()  # now: the set may be removed before the op is synchronized

    def collect():
        out = _TENSORS.as_dtype_of(_core.read_gathered(_TENSORS, h, n, data, src.shape[1:])[0], src)
        box.append(out.to(device) if device is not None else out)

    return collect, lambda: box[0], (src, data, payload)


def _allgather_group_async(kind, tensors, name, process_set):
    def launch(call):
        _same_device(tensors)
        collects, results, keep = [], [], []
        for i, tensor in enumerate(tensors):
            collect, result, k = _launch_allgather(call, i, tensor)
            collects.append(collect)
            results.append(result)
            keep.append(k)

        def collect_all():
            for c in collects:
                c()
        return lambda: [r() for r in results], keep, collect_all

    return _start(kind, name, process_set, launch, len(tensors), kind != "allgather")


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts gathering every rank's `tensor` along the first dimension; returns a handle.

    Arguments:
        tensor: a tensor of uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64 or
            bool (moved as bytes; any other dtype is a ValueError); its first dimension may differ by
            rank, every other must agree (a 0-d tensor counts as one row).
        name, process_set: as allreduce_async.

    Returns:
        a handle: synchronize(handle) returns a new tensor of the ranks' rows in rank order, on
        `tensor`'s device.

    Raises: ValueError for bad arguments; from synchronize(), RuntimeError when ranks disagree on
    the trailing shape or dtype, HorovodInternalError when one times out or dies.
    """
    return _single(_allgather_group_async("allgather", [tensor], name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts one allgather per tensor of `tensors` (all on one device) under one handle;
    synchronize() returns the list of gathered tensors, in order. Arguments and errors as
    allgather_async."""
    return _allgather_group_async("grouped_allgather", list(tensors), name, process_set)


# ---- broadcast ----

_root_in_set = _host.root_in_set


def _broadcast_into_async(kind, tensor, output, root_rank, name, process_set):
    def launch(call):
        root = _root_in_set(root_rank, call.process_set)
        buf = output if output.is_contiguous() else output.contiguous()
        if buf is not output or tensor.data_ptr() != output.data_ptr():
            buf.copy_(tensor)
        data = buf.view(torch.uint8) if buf.dtype == torch.bool else buf
        dtype = _ddl_dtype(buf, moves_only=True)
        if dtype == L.INT16 and data.is_cuda:
            data = data.view(torch.float16)  # moved, not reduced
        opts = _options(call.process_set, data, tuple(buf.shape))
        call.submit(L.lib.ddl_broadcast_ex, call.name(0), data.data_ptr(), data.numel(),
                    L.FLOAT16 if data.dtype == torch.float16 else dtype, root, ctypes.byref(opts))

        def finish():
            if buf is not output:
                _copy_into(output, buf)
            return output
        return finish, (tensor, buf, data)

    return _start(kind, name, process_set, launch)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts broadcasting root_rank's `tensor` into a new tensor on every rank; returns a handle.

    Arguments:
        tensor: the data on the root; on the other ranks a tensor of the same shape and dtype.
        root_rank: the world rank whose tensor every rank gets (it must be in the process set).
        name, process_set: as allreduce_async.

    Returns:
        a handle: synchronize(handle) returns the new tensor holding the root's values.

    Raises: ValueError for a root_rank that is not an int or not in the set; from synchronize(),
    RuntimeError when ranks disagree on shape, dtype or root, HorovodInternalError when one times
    out or dies.
    """
    return _broadcast_into_async("broadcast", tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                                 root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """As broadcast_async, but every rank's `tensor` itself receives the root's values;
    synchronize() returns `tensor`."""
    return _broadcast_into_async("broadcast", tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """As broadcast_async_, blocking: returns `tensor`, holding root_rank's values."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.dtype not in _DTYPES:
        return synchronize(broadcast_async_(tensor, root_rank, name, process_set))
    target = _process_set_target(process_set)
    try:
        root = _root_in_set(root_rank, target)
    except ValueError:  # raised by the general path, where the op still takes its place on every rank
        return synchronize(broadcast_async_(tensor, root_rank, name, process_set))
    opts = _options(target, None, tuple(tensor.shape), flags=L.BLOCKING)
    _run_now("broadcast", L.lib.ddl_broadcast_ex, name, target, tensor.data_ptr(), tensor.numel(), _DTYPES[tensor.dtype],
             root, ctypes.byref(opts))
    return tensor


# ---- alltoall ----

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: this rank's rows are cut into blocks, block j going to rank j of the set.

    Arguments:
        tensor: at least one dimension; the rows (first dimension) are what is split.
        splits: how many rows go to each rank (a list or an integer tensor of the set's size, summing
            to at most the first dimension); None: equal blocks (the first dimension must then be a
            multiple of the set's size).
        name, process_set: as allreduce_async.

    Returns:
        a handle: synchronize(handle) returns (output, received_splits): the rows every rank sent
        this one, in rank order, and how many came from each (int32).

    Raises: ValueError for bad splits; from synchronize(), RuntimeError when ranks disagree,
    HorovodInternalError when one times out or dies.
    """
    def launch(call):
        n = call.process_set.size()
        if tensor.dim() == 0:
            raise ValueError("alltoall needs a tensor of at least one dimension")
        given, splits_device = splits, None
        if given is not None:
            splits_tensor = given if torch.is_tensor(given) else torch.tensor(given, dtype=torch.int32)
            given = _core.alltoall_splits(_TENSORS, splits_tensor)
            splits_device = splits_tensor.device
        send_splits = alltoall_rows(given, tensor.shape[0], n)
        src = tensor.contiguous()
        data = src.view(torch.uint8) if src.dtype == torch.bool else src
        dtype = _ddl_dtype(src, moves_only=True)
        cuda = _is_cuda(src)
        if cuda:
            data = data.cpu()  # through the host: what arrives is learnt when the op runs
        row = row_elements(src.shape)
        payload, payload_dtype = _core.any_count_payload(_TENSORS, data, dtype, src.shape, send_splits)
        sizes = [s * row for s in send_splits] if row else [1] * n
        opts = _options(call.process_set, None, tuple(src.shape[1:]))
        # libddl exchanges the counts when the op runs, so submitting never waits for the peers.
        h = call.submit(L.lib.ddl_alltoall_any_ex, call.name(0), payload.data_ptr(), L.size_array(sizes), payload_dtype,
                        ctypes.byref(opts))
        box = []

        def collect():
            box.append(_core.read_gathered(_TENSORS, h, n, data, src.shape[1:]))

        def finish():
            out, recv_splits = box[0]
            result = _TENSORS.as_dtype_of(out, src)
            if cuda:
                result = result.to(src.device)
            received = torch.tensor(recv_splits, dtype=torch.int32)
            if splits_device is not None:
                received = received.to(splits_device)
            return result, received
        return finish, (src, data, payload, opts), collect

    return _start("alltoall", name, process_set, launch)


# ---- reducescatter ----

_scatter_rows = _host.scatter_rows


def _reducescatter_group_async(kind, tensors, name, op, prescale, postscale, process_set):
    def launch(call):
        target = call.process_set
        n, me = target.size(), target.rank()
        for t in tensors:
            if t.dim() == 0:
                raise ValueError("reducescatter needs a tensor of at least one dimension, not a scalar")
            _ddl_dtype(t)
        _same_device(tensors)
        results, keep = [], []
        cuda_op, cuda_postscale = _average_scaled_once(op, postscale, n)  # a CUDA op's postscale runs here, after it
        for i, tensor in enumerate(tensors):
            src = tensor.contiguous()
            cuda = _is_cuda(src)
            rows = _scatter_rows(src.shape[0], n)
            row = row_elements(src.shape)
            dtype = _ddl_dtype(src)  # scaling and staging keep the dtype
            # CUDA tensors are scaled on the GPU, as Horovod does. Equal blocks go through NCCL
            # (ncclReduceScatter) on the current stream; the rest (rows not a multiple of the
            # ranks, int16, which NCCL lacks) reduce through the host.
            on_gpu = cuda and rows[0] == rows[-1] and dtype != L.INT16
            data = _scale_like_horovod(src, prescale) if cuda else src
            if cuda and not on_gpu:
                data = data.cpu()
            out = data.new_empty((rows[me],) + tuple(src.shape[1:]))
            opts = _options(target, data if on_gpu else None, tuple(src.shape), 1.0 if cuda else prescale,
                            1.0 if cuda else postscale, group_size=call.group_size)
            call.submit(L.lib.ddl_reducescatter_ex, call.name(i), data.data_ptr(), out.data_ptr(),
                        L.size_array([r * row for r in rows]), dtype, _REDUCE[cuda_op if cuda else op], ctypes.byref(opts))
            keep.append((src, data, out, opts))
            results.append((out, src.device if cuda else None))
        return lambda: [_scale_like_horovod(o.to(d), cuda_postscale) if d is not None else o for o, d in results], keep

    return _start(kind, name, process_set, launch, len(tensors), kind != "reducescatter")


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing `tensor` over the set's ranks and scattering the first dimension: rank r gets
    rows [offset_r, offset_r + n_r), the first (rows % size) ranks one row more than the others.

    Arguments:
        tensor: at least one dimension, of the same shape and dtype on every rank.
        name, process_set, prescale_factor, postscale_factor: as allreduce_async.
        op: Sum or Average (the default), as Horovod's; others are a ValueError.

    Returns:
        a handle: synchronize(handle) returns this rank's share (a new tensor of its rows).
    """
    op = _host.reducescatter_op(_reduce_op(op, None))
    return _single(_reducescatter_group_async("reducescatter", [tensor], name, op, prescale_factor,
                                              postscale_factor, process_set))


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    """Starts one reducescatter per tensor of `tensors` (all on one device) under one handle;
    synchronize() returns each rank's shares, in order. Arguments and errors as reducescatter_async."""
    op = _host.reducescatter_op(_reduce_op(op, None))
    return _reducescatter_group_async("grouped_reducescatter", list(tensors), name, op, prescale_factor,
                                      postscale_factor, process_set)


# ---- barrier, sparse ----

barrier = _host.barrier


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Reduces a sparse tensor by gathering every rank's indices and values; returns a callable that
    waits and gives the (uncoalesced) sparse result."""
    op = _reduce_op(op, None)
    if op not in (Average, Sum):
        raise ValueError("sparse allreduce supports hvd.Average and hvd.Sum")
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices_handle = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                                     process_set=process_set)
    try:
        values_handle = allgather_async(t._values(), name=f"{name}.values", process_set=process_set)
    except BaseException:
        _settle(indices_handle)
        raise

    def handle():
        try:
            values = synchronize(values_handle)
        except BaseException:
            _settle(indices_handle)
            raise
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, t.size())
    return handle


def _settle(handle):
    """Waits for an op whose result is no longer wanted, so that its name and handle are given back;
    its own failure is dropped (the caller is already raising another)."""
    try:
        synchronize(handle)
    except Exception:
        pass


_world_rank = _basics.world_rank
