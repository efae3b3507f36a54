"""A torch.distributed backend named "ddl": torch's collectives over libddl.

    import ddl.distributed                      # (import ddl.torch does it too) registers "ddl"
    torch.distributed.init_process_group("ddl")  # under ddl run, srun --mpi=pmix or mpirun
    torch.distributed.init_process_group("ddl", rank=r, world_size=n, init_method=...)  # mp.spawn, torchrun

Under a launcher libddl's world is the launcher's; started any other way (mp.spawn, torchrun, a
plain srun with torch's variables) it is made through the store torch hands the backend.

DDP, Lightning (DDPStrategy(process_group_backend="ddl")) and torch.distributed's public
collectives then run on libddl: shared memory within a node, Gloo between nodes, NCCL for CUDA
tensors on the tensor's current stream. Every process group (the default one and each new_group)
is a libddl process set made by its members alone, with torch's timeout. Ops return at once; a
thread of the group waits for libddl and completes each op's future, so DDP's gradient buckets
reduce while backward goes on. Ranks must issue a group's ops in the same order (as with gloo and
NCCL): an op is named by its place in that order.
"""

import atexit
import contextlib
import ctypes
import datetime
import functools
import os
import queue
import secrets
import sys
import threading
import time
import weakref
import zlib

import torch
import torch.distributed as dist

from ddl import _lib as L
from ddl.common import basics as _basics
from ddl.common import call_sites
from ddl.common import dtypes as _dtypes
from ddl.common import op_core as _core
from ddl.common.tensor_adapters import torch_tensors
from ddl.common import program_store as _program_store
from ddl.common import exceptions as _exceptions  # noqa: F401  (registers the statuses' exception types)

BACKEND_NAME = "ddl"

_DTYPES = _dtypes.torch_table()
_MOVED = _dtypes.torch_moved_table()
_TENSORS = torch_tensors()

_NAMELESS_REDUCE_OPS = "BAND, BOR, BXOR and PREMUL_SUM"


def _reduce_ops():
    ops = {dist.ReduceOp.SUM: L.SUM, dist.ReduceOp.PRODUCT: L.PRODUCT, dist.ReduceOp.MIN: L.MIN,
           dist.ReduceOp.MAX: L.MAX}
    if hasattr(dist.ReduceOp, "AVG"):
        ops[dist.ReduceOp.AVG] = L.AVERAGE
    return ops


_REDUCE = _reduce_ops()


def _libddl_op(reduce_op):
    for torch_op, ddl_op in _REDUCE.items():
        if reduce_op == torch_op:
            return ddl_op
    shown = getattr(reduce_op, "op", reduce_op)  # torch 2.x's ReduceOp prints as an object; its .op names it
    raise ValueError(f"the ddl backend reduces with SUM, AVG, PRODUCT, MIN and MAX, not {shown} "
                     f"({_NAMELESS_REDUCE_OPS} are not in libddl): use a gloo group for that op")


def _check(tensor):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"the ddl backend takes tensors, not {type(tensor).__name__}")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"the ddl backend takes CPU and CUDA tensors, not {tensor.device.type} ones")


def _dense(tensor):
    """The tensor as libddl reads and writes it: itself, or for a strided one (transposed, sliced,
    channels_last) a contiguous copy, whose result _write_back() copies into it, as gloo does."""
    _check(tensor)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


def _write_back(tensors, dense):
    for tensor, copy in zip(tensors, dense):
        if copy is not tensor:
            tensor, copy = _one_of_each_alias(tensor, copy)
            tensor.copy_(copy)


def _one_of_each_alias(tensor, value):
    """An expanded tensor (a dimension of stride 0) holds each of its elements once however often it
    shows it, and the results for the aliases are alike (they reduced the same input): one of them
    is written, as gloo writes it, where copy_ refuses to write one place several times."""
    for dim in range(tensor.dim()):
        if tensor.stride(dim) == 0 and tensor.size(dim) > 1:
            tensor, value = tensor.narrow(dim, 0, 1), value.narrow(dim, 0, 1)
    return tensor, value


def _reducible(tensor, op):
    """(tensor as libddl reduces it, its libddl dtype): complex numbers as pairs of reals for SUM/AVG.
    `tensor` is one _dense gave (checked, contiguous)."""
    if tensor.is_complex():
        if op not in (L.SUM, L.AVERAGE):
            raise ValueError("complex tensors reduce with SUM or AVG only")
        tensor = torch.view_as_real(tensor)
    try:
        return tensor, _DTYPES[tensor.dtype]
    except KeyError:
        raise ValueError(f"the ddl backend cannot reduce {tensor.dtype} tensors: use one of "
                         f"{_dtypes.SUPPORTED}, complex") from None


def _movable(tensor):
    """(tensor as libddl moves it, its libddl dtype): any dtype, as bytes where libddl has no type for it
    (bool and torch's unsigned 16-64 bit types have one, which ranks agree on). `tensor` is one
    _dense gave (checked, contiguous)."""
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        dtype = _MOVED.get(tensor.dtype)
    if dtype is not None:
        return tensor, dtype
    return tensor.view(torch.uint8) if tensor.dim() > 0 else tensor.reshape(1).view(torch.uint8), L.UINT8


_NOTHING = ctypes.create_string_buffer(16)  # where an empty tensor (data_ptr 0) points: libddl refuses NULL


def _pointer(tensor):
    return ctypes.c_void_p(tensor.data_ptr() or ctypes.addressof(_NOTHING))


def _same_device(tensors):
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"the tensors of one ddl op must share a device, not {sorted(map(str, devices))}")


def _single(tensors, what):
    if len(tensors) != 1:
        raise ValueError(f"the ddl backend's {what} takes one tensor per rank (one device per process), "
                         f"not {len(tensors)}")
    return tensors[0]


class _Op:
    """One launched op: its libddl handles, what makes its result, its outcome (and a torch future of
    it), and the buffers libddl uses (kept alive until it is done). Completed once, by whoever claims
    it first: the caller waiting on it, or the group's completer thread.

    The future is made only when asked for (get_future(), a C++ caller's Work, a chained op): a
    blocking call never asks, and making and completing a torch future costs more than the rest of
    a small op on a GPU (torch 2.x asks CUDA for devices and streams in both)."""
    __slots__ = ("handles", "tested", "finish", "_future", "keep", "stream", "claimed", "queued", "lock", "done", "value",
                 "error", "__weakref__")

    def __init__(self, handles, finish, keep, stream=None, future=None, tested=None):
        self.handles, self.finish, self.keep = handles, finish, keep
        # What says the op is done (ddl_test) before anyone claims it: its handles, or those that
        # finish() reads and releases itself (an any-count gather's, kept until ddl_gathered).
        self.tested = handles if tested is None else tested
        self.stream = stream  # a CUDA op's: the caller's current stream, which the result copies go on too
        self._future = future  # given: whoever made it completes it, not complete()
        self.claimed = self.queued = self.done = False
        self.value = self.error = None
        self.lock = threading.Lock()  # the GIL alone does not make test-and-set atomic on Python <= 3.10

    @property
    def future(self):
        """The op's torch future, made now if nobody asked before (and completed at once if the op is)."""
        with self.lock:
            if self._future is None:
                self._future = _OpFuture(self)
                if self.done:  # nothing can be waiting on a future just made: completing it here is safe
                    _set_outcome(self._future, self.value, self.error)
            return self._future

    def finished(self):
        return self.done or (self._future is not None and self._future.done())

    def outcome(self):
        """The result, once the op is complete (waiting for whoever claimed it); raises its error."""
        if not self.done:
            return self.future.wait()
        if self.error is not None:
            raise self.error
        return self.value

    def claim(self):
        with self.lock:
            if self.claimed:
                return False
            self.claimed = True
            return True

    def claim_if_done(self):
        """Claims the op if libddl has finished it. Its handles are only tested while nobody has
        claimed it: whoever claims it waits on them, which frees them."""
        done = ctypes.c_int(0)
        with self.lock:
            if self.claimed:
                return False
            for handle in self.tested:
                if L.lib.ddl_test(handle, ctypes.byref(done)) != L.SUCCESS or not done.value:
                    return False
            self.claimed = True
            return True

    def settle(self):
        """Completes the op here unless someone has already claimed it."""
        if self.claim():
            self.complete()

    def complete(self):
        """Waits for libddl (the GIL released) and completes the future with the result or error."""
        try:
            L.wait_all(self.handles)
            # Results are written as gloo writes them: unseen by autograd, on any thread. A CUDA op's
            # copies into its outputs go on the stream the caller enqueued it on (this thread's own
            # would be the device's default stream), so that the caller's next kernels follow them.
            with torch.no_grad(), _on_stream(self.stream):
                value, error = self.finish(), None
        except BaseException as failure:  # the op's caller gets it from Work.wait()
            value, error = None, failure
        with self.lock:
            self.value, self.error = value, error
            future = self._future
            if future is None:
                self.done = True  # a future made later is completed as it is made
        if future is not None:
            # `done` only once the future is complete: whoever sees it may read the future at once
            # (wait() then get_future().value(), as with torch's own backends).
            try:
                _set_outcome(future, value, error)
            finally:
                self.done = True
        self.keep = None


class _OpFuture(torch.futures.Future):
    """An op's torch future, whose wait() completes the op on the waiting thread when nobody has
    claimed it: a then-callback of an earlier op's future runs on the group's thread, and an op queued
    behind that one (its future waited for in the callback) could otherwise be completed by no thread."""

    def __init__(self, op):
        super().__init__()
        self._ddl_op = weakref.ref(op)  # the op holds its future: no cycle

    def wait(self):
        op = self._ddl_op()
        if op is not None and not op.done:
            op.settle()
        return super().wait()


def _any_memory_shared(tensors):
    """Whether two of `tensors` reach the same bytes (the same tensor twice, or overlapping views):
    each one's span from its lowest to its highest element, compared."""
    spans = []
    for t in tensors:
        if t.numel() == 0:
            continue
        extent = 1 + sum((n - 1) * stride for n, stride in zip(t.shape, t.stride()))  # torch's strides are >= 0
        spans.append((t.data_ptr(), t.data_ptr() + extent * t.element_size()))
    spans.sort()
    return any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))


def _set_outcome(future, value, error):
    if error is None:
        future.set_result(value)
    else:  # torch's futures take Exceptions only: a KeyboardInterrupt and the like goes as its repr
        future.set_exception(error if isinstance(error, Exception) else RuntimeError(repr(error)))


_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _is_current(stream):
    """Whether `stream` is its device's current stream (asked without making a torch Stream object)."""
    return _raw_current_stream is not None and _raw_current_stream(stream.device_index) == stream.cuda_stream


def _on_stream(stream):
    """A context making `stream` current, or none where it is current already (the caller of a blocking
    op completes it on its own thread): entering torch.cuda.stream costs ~9 µs on torch 2.x."""
    if stream is None or _is_current(stream):
        return contextlib.nullcontext()
    return torch.cuda.stream(stream)


def _follow(stream):
    """The caller's current stream waits for `stream` (a CUDA op's, where its result copies went), as
    torch promises of Work.wait(): the caller's next kernels see the result even when the op was
    started on a side stream."""
    if stream is not None and not _is_current(stream):
        torch.cuda.current_stream(stream.device).wait_stream(stream)


class _Completer:
    """A thread that waits for a group's libddl ops in order and completes their futures."""

    def __init__(self, label):
        self._queue = queue.SimpleQueue()
        self._stopping = False
        self._issued = []  # weak references to the group's ops, in issue order (see unfinished_issued)
        self._thread = threading.Thread(target=self._run, name=f"ddl-{label}", daemon=True)
        self._thread.start()
        for ended in [c for c in _live_completers if not c._thread.is_alive()]:
            _live_completers.discard(ended)
        _live_completers.add(self)

    def note_issued(self, op):
        """Remembers `op` for the group's next barrier, which waits for it (unfinished_issued)."""
        if len(self._issued) >= 64:
            self._issued = [ref for ref in self._issued if (o := ref()) is not None and not o.finished()]
        self._issued.append(weakref.ref(op))

    def unfinished_issued(self):
        """The group's ops issued so far and not finished yet, in issue order; forgotten here."""
        issued, self._issued = self._issued, []
        return [o for o in (ref() for ref in issued) if o is not None and not o.finished()]

    def add(self, op):
        """Has the thread complete `op` (unless its caller claims it first); once per op. Once the
        thread is stopping (its group destroyed, or the process exiting), or on the thread itself
        (a future's callback asking for another op's future), the op is completed here instead."""
        if op.queued or op.claimed:
            return
        if self._stopping or threading.current_thread() is self._thread:
            op.settle()
            return
        op.queued = True
        self._queue.put(op)

    def _run(self):
        while True:
            op = self._queue.get()
            if op is None:
                return  # stays in _live_completers: exit joins it (see _stop_completers)
            try:
                op.settle()
            except BaseException as error:  # never let one op end the thread: later futures would hang
                print(f"ddl: the ddl backend's thread for a group failed completing an op: {error!r}",
                      file=sys.stderr, flush=True)

    def drain(self):
        """Ends the thread after every op of its group not waited for yet, and waits for that (unless
        called on the thread itself)."""
        for op, op_completer in list(_unqueued_ops.items()):
            if op_completer is self:
                self.add(op)
        self.stop()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def stop(self):
        """Asks the thread to end after the ops already queued; idempotent."""
        if not self._stopping:
            self._stopping = True
            self._queue.put(None)


# The ops handed to torch's Python functions and not yet waited or queued -> their groups' threads.
_unqueued_ops = weakref.WeakKeyDictionary()

# Every completer whose thread may still run, stopped or not: a destroyed group's thread can still be
# completing its last future when the interpreter exits.
_live_completers = set()


@atexit.register
def _stop_completers():
    """Ends the groups' threads before the interpreter does: CPython ends a daemon thread that is
    still there at exit by unwinding its stack, which aborts the process ("terminate called without
    an active exception") when the thread is inside torch's C++ (completing a future)."""
    # Works never waited: libddl must be done with their buffers first.
    for op, op_completer in list(_unqueued_ops.items()):
        op_completer.add(op)
    completers = list(_live_completers)
    for completer in completers:
        completer.stop()
    for completer in completers:
        completer._thread.join(timeout=10)
        _live_completers.discard(completer)


class _RaisingWork(torch._C._distributed_c10d.Work):
    """The Work torch's Python functions get: its wait() raises the op's error. (torch's own
    future-wrapping Work returns from wait() as if the op had succeeded, which would leave
    all_reduce's tensor as it was without a word.) A blocking call (all_reduce with async_op=False
    waits at once) completes the op on the caller's thread, with no hand-over to the group's thread;
    the thread takes the op when its future is asked for, or when the Work is dropped unwaited."""

    def __init__(self, op, completer):
        super().__init__()
        self._op = op
        self._completer = completer
        if not op.claimed:
            _unqueued_ops[op] = completer

    def wait(self, timeout=None):
        """Waits for the op and raises its error. With a `timeout` (torch's timedelta; 0, its
        default, is none) an op still running then raises RuntimeError; a later wait() can still
        complete it."""
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 0.0
        if seconds > 0 and not self._completes_within(seconds):
            raise RuntimeError(f"ddl: Work.wait timed out after {seconds * 1000:.0f} ms; the op is still running "
                               "(its peers have not all joined it)")
        self._op.settle()
        self._op.outcome()  # raises the op's error
        _follow(self._op.stream)
        return True

    def _completes_within(self, seconds):
        deadline = time.monotonic() + seconds
        pause = 5e-5
        while not self.is_completed():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.01)
        return True

    def get_future(self):
        self._completer.add(self._op)
        return self._op.future

    def is_completed(self):
        if not self._op.finished() and self._op.claim_if_done():
            self._op.complete()
        return self._op.finished()

    def is_success(self):
        if not self.is_completed():
            return False
        try:
            self._op.outcome()
        except Exception:
            return False
        return True

    def result(self):
        self.wait()
        return self._op.outcome()

    def __del__(self):
        op = getattr(self, "_op", None)
        if op is not None:
            self._completer.add(op)  # the thread keeps the buffers until libddl is done with them


_PYTHON_API = os.path.join("torch", "distributed", "distributed_c10d.py")


def _torch_caller():
    """The frame of torch's Python function that called into this module, or None (a C++ caller)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.endswith(_PYTHON_API):
        return frame
    return None


def _work(op, completer, caller, overlaps=False):
    """A Work for the op's caller (`caller`: the frame of _torch_caller()). torch's Python functions
    (all_reduce, ...) get one whose wait() raises. C++ callers get torch's own, the only kind torch
    1.13's C++ can wait on; but its wait() returns as if the op had succeeded when it failed, so an op
    a C++ caller waits for (DDP's parameter broadcast and checks) is done here first, raising its error
    to that caller. Only an op whose caller reads its future (`overlaps`: DDP's gradient allreduce,
    which overlaps backward) goes on, with a future that fails in C++ terms (_failing_in_cpp)."""
    completer.note_issued(op)
    if caller is not None:
        return _RaisingWork(op, completer)
    if not overlaps:
        op.settle()
        op.outcome()  # raises the op's error
    completer.add(op)
    return torch._C._distributed_c10d._create_work_from_future(_failing_in_cpp(op.future))


def _failing_in_cpp(future):
    """`future` as torch's C++ is to read it. torch.futures.Future.set_exception keeps the error as the
    future's value (Python's wait() raises it), which DDP's reducer would take for the result and
    crash on; a `then` callback that raises fails the future it makes in C++ terms (value() throws)."""
    return future.then(_result_or_raise)


def _result_or_raise(future):
    return future.wait()


def _in_step(kinds):
    """An op of ProcessGroupDDL, which takes one place of the group's sequence per kind of
    `kinds(*args)` ("allreduce", ...; a str: one place of that kind). Where it raises before it has
    taken them all (a check that only this rank failed: a dtype, a size, a root; or a part that
    libddl refused, which took its own place), it takes the rest failing with that error before
    raising it, so the members stay in step: otherwise this rank's next op would pair with the
    others' this one, and both would return the other call's data."""
    def decorate(method):
        @functools.wraps(method)
        def op(self, *args, **kwargs):
            before = self._sequence
            try:
                return method(self, *args, **kwargs)
            except Exception as error:
                try:
                    expected = [kinds] if isinstance(kinds, str) else kinds(*args, **kwargs)
                except Exception:  # arguments the op itself could not read either
                    expected = []
                self._take_places_failing(expected[self._sequence - before:], error)
                raise
        return op
    return decorate


def _allreduce_places(tensors, *_, **__):
    """An all_reduce's places: two for a sparse tensor's (its indices' and values' gathers)."""
    if any(t.is_sparse for t in tensors):
        return ["allreduce.sparse"] * 2
    return ["allreduce"] * len(tensors)


def _broadcast_places(tensors, *_, **__):
    return ["broadcast"] * len(tensors)


class ProcessGroupDDL(dist.ProcessGroup):
    """One torch process group as one libddl process set (see the module's doc)."""

    def __init__(self, rank, size, world_ranks, key, timeout):
        super().__init__(rank, size)
        self._world_ranks = list(world_ranks)
        ranks = (ctypes.c_int * size)(*self._world_ranks)
        handle = ctypes.c_void_p()
        status = L.lib.ddl_process_set_create_among(ranks, size, key.encode(), timeout.total_seconds(),
                                                    ctypes.byref(handle))
        if status != L.SUCCESS:
            L.raise_for(status)
        self._set = handle.value
        self._sequence = 0
        self._calling = threading.local()  # what the op being launched on this thread may do (see _launch)
        self._completer = _Completer(key)

    def getBackendName(self):
        return BACKEND_NAME

    # torch 2.x names every group and asks the group for it (destroy_process_group(group), functional
    # collectives); a group made in Python has no C++ backend to hold the name, so it is kept here.
    def _set_group_name(self, name):
        self._group_name = name

    setGroupName = _set_group_name

    def getGroupName(self):
        return getattr(self, "_group_name", "")

    group_name = property(getGroupName)

    # torch 2.x asks a group made by a creator for its backend of a device when the group is bound
    # to one (init_process_group(device_id=...), which Lightning passes on GPUs, and new_group under
    # such a default group). A group made in Python has no C++ backends registered: this group
    # serves both devices itself, and cannot be split (torch then makes subgroups with new_group).
    supports_splitting = False

    def _get_backend(self, device):
        device_type = torch.device(device).type
        if device_type not in ("cpu", "cuda"):
            raise RuntimeError(f"No backend type associated with device type {device_type}: backend '{BACKEND_NAME}' "
                               "serves cpu and cuda tensors")
        return self

    def shutdown(self):
        """Ends the group as gloo's does: its ops still in flight finish first (their peers arrive, or
        the group's timeout, init_process_group's timeout=, fails them), so that a rank does not go on to leave, and take torch's store with
        it, while a peer still needs it. torch 2.8+'s destroy_process_group calls this; a dropped
        group (torch 1.13's destroy_process_group) does it too. libddl's world, if made through this
        group's store, lets go of it (rank 0's server must close for init_process_group to listen
        on its port again) and stays for the next default group."""
        self._completer.drain()
        _program_store.release(getattr(self, "_store", None))

    def abort(self):
        """torch's abort: the group's thread ends after the ops already handed to it; nothing waits."""
        self._completer.stop()

    def __del__(self, _is_finalizing=sys.is_finalizing):
        # Not while the interpreter ends (_stop_completers has ended the threads; the module's globals,
        # sys among them, may be gone: hence the bound default), nor for a group whose making failed
        # before it had a thread.
        if not _is_finalizing() and getattr(self, "_completer", None) is not None:
            self.shutdown()

    # ---- the machinery every op shares ----

    def _name(self, kind):
        self._sequence += 1
        return f"{kind}.{self._sequence}".encode()

    def _options(self, tensor, may_block=False):
        """libddl's options of an op on `tensor`. `may_block`: the op is one libddl can run on this
        thread at once (DDL_BLOCKING), which it does when the caller waits at once: a CUDA op is then
        enqueued by this thread and done on the GPU when the call returns, with no hand-over to
        libddl's thread and back."""
        options = self._sequence_options()
        if call_sites.ENABLED:
            options.call_site = call_sites.caller()
        if tensor.is_cuda:
            stream = torch.cuda.current_stream(tensor.device)
            options.flags |= L.CUDA_BUFFERS
            options.stream = stream.cuda_stream
            self._calling.stream = stream
        if may_block and getattr(self._calling, "waits", False):
            options.flags |= L.BLOCKING
        return options

    def _reduction(self, view, op):
        """(libddl op, options) of a reduction of `view`, which may run at once (see _options). AVG of
        float16 host tensors is a SUM of each input premultiplied by 1/size, as NCCL computes a
        floating-point AVG: summed first, 60000 + 60000 overflows float16 where NCCL gives 60000.
        (ddl.torch's Average sums first, as Horovod's does.)"""
        options = self._options(view, may_block=True)
        if op == L.AVERAGE and view.dtype == torch.float16 and not view.is_cuda:
            op, options.prescale = L.SUM, 1.0 / self.size()
        return op, options

    def _launch(self, submit_all, finish, *keep, overlaps=False):
        """Runs `submit_all(handles)`, which appends each libddl op's handle it starts; returns the
        Work whose future `finish()` completes once they all have finished. `keep`: the buffers the
        ops use, held until then. When the caller is one of torch's functions called with
        async_op=False (it waits at once), the ops that can run on this thread do (see _options)."""
        handles = []
        caller = _torch_caller()
        # torch's collectives called with async_op=False wait for the Work they get before anything else.
        self._calling.waits = caller is not None and caller.f_locals.get("async_op") is False
        self._calling.stream = None  # a CUDA op's stream, which _options notes
        try:
            submit_all(handles)
        except BaseException:
            L.wait_quietly(handles)
            raise
        finally:
            self._calling.waits = False
        stream, self._calling.stream = self._calling.stream, None
        return _work(_Op(handles, finish, keep, stream), self._completer, caller, overlaps)

    def _sequence_options(self):
        """Options of an op of this group on host buffers. The group's ops are named by their place in
        its sequence (DDL_ORDERED): libddl then fails every later one at once after one fails, rather
        than let it pair with another call of a peer."""
        return L.OpOptions(self._set, 1.0, 1.0, L.ORDERED, None, None, 0)

    def _fail_in_step(self, kind, error):
        """Raises `error`, a check only this rank can make (the root's lists), after taking the op's
        place in the group's sequence with it (_take_places_failing)."""
        self._take_places_failing([kind], error)
        raise error

    def _take_places_failing(self, kinds, error):
        """Takes the next places of the group's sequence, one for an op of each kind of `kinds`,
        failing with `error` (ddl_fail_ex): the other members' ops there fail with the same reason
        instead of waiting for the timeout or pairing with this rank's next call, and the sequence
        stays in step on every rank. Returns once every member has reached them."""
        handles = []
        options = self._sequence_options()
        reason = (str(error) or type(error).__name__).encode(errors="replace")
        for kind in kinds:
            handle = ctypes.c_void_p()
            if L.lib.ddl_fail_ex(self._name(kind), reason, ctypes.byref(options), ctypes.byref(handle)) == L.SUCCESS:
                handles.append(handle.value)
        L.wait_quietly(handles)  # each fails, as it should, once every member reached it

    @staticmethod
    def _submit(handles, fn, *args):
        handle = L.submit(fn, *args)
        if handle is not None:  # None: a DDL_BLOCKING op, done already
            handles.append(handle)

    # ---- reductions ----

    def allreduce(self, tensors, opts=None):
        # all_reduce_multigpu's list would need every tensor of every rank in each result.
        _single(tensors, "all_reduce")
        return self._allreduce_each(tensors, opts)

    @_in_step(_allreduce_places)
    def _allreduce_each(self, tensors, opts=None):
        """Each of `tensors` reduced across the group on its own (all_reduce's one, all_reduce_coalesced's list)."""
        op = _libddl_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        _same_device(tensors)
        if any(t.is_sparse for t in tensors):
            return self._sparse_allreduce(_single(tensors, "all_reduce of sparse tensors"), op)
        dense = [_dense(t) for t in tensors]
        views = [_reducible(t, op) for t in dense]

        def submit(handles):
            for view, dtype in views:
                view_op, options = self._reduction(view, op)
                self._submit(handles, L.lib.ddl_allreduce_ex, self._name("allreduce"), _pointer(view), _pointer(view),
                             view.numel(), dtype, view_op, ctypes.byref(options))

        return self._launch(submit, lambda: _write_back(tensors, dense) or tensors, views, overlaps=True)

    def _sparse_allreduce(self, tensor, op):
        """SUM of a sparse COO tensor, as gloo's: every rank's indices and values are gathered (their
        numbers of entries differ by rank) and summed here, duplicates added by coalesce(); the result
        is written into `tensor` (its number of entries changes). Ranks must agree on the tensor's
        size, which the values' op carries as its shape."""
        if op != L.SUM:
            raise ValueError("the ddl backend reduces sparse tensors with SUM only, as gloo does")
        if tensor.layout != torch.sparse_coo or tensor.sparse_dim() == 0:
            raise ValueError("the ddl backend reduces sparse COO tensors with at least one sparse dimension, "
                             f"not this {tensor.layout} one of {tensor.sparse_dim()}")
        local = tensor.detach().coalesce().cpu()  # gathered through host memory, as libddl's any-count ops are
        indices = local._indices().t().contiguous()  # one row of sparse_dim indices per entry
        entry_shape = tuple(local._values().shape[1:])  # the dense part of one entry
        values, dtype = _movable(local._values().contiguous().reshape(-1))
        # The values' op carries the tensor's size and its dtype's name (values libddl has no type for
        # move as bytes), so ranks that disagree on either fail the op together.
        size = tuple(tensor.shape)
        described = size + (zlib.crc32(str(local.dtype).encode()),)
        n = self.size()
        handles = []

        def submit(payload, payload_dtype, shape):
            options = self._sequence_options()
            dims = (ctypes.c_longlong * len(shape))(*shape)
            options.shape, options.ndim = dims, len(shape)
            self._submit(handles, L.lib.ddl_allgather_any_ex, self._name("allreduce.sparse"), _pointer(payload),
                         payload.numel(), payload_dtype, ctypes.byref(options))

        try:
            submit(indices, L.INT64, (local.sparse_dim(),))
            submit(values, dtype, described)
        except BaseException:
            L.wait_quietly(handles)
            raise

        def read(handle, like):
            """Every rank's elements of one op, in rank order, as a 1-D tensor of `like`'s dtype."""
            return _core.read_gathered(_TENSORS, handle, n, like, ())[0]

        def finish():
            try:
                every_index, every_value = read(handles[0], indices), read(handles[1], values)
            finally:
                L.wait_quietly(handles)
            entries = every_index.numel() // local.sparse_dim()
            every_value = every_value.view(local.dtype).reshape((entries,) + entry_shape)
            total = torch.sparse_coo_tensor(every_index.reshape(entries, local.sparse_dim()).t(), every_value, size)
            tensor.copy_(total.coalesce().to(tensor.device))
            return [tensor]

        stream = torch.cuda.current_stream(tensor.device) if tensor.is_cuda else None  # the result's copy goes on it
        return _work(_Op([], finish, (indices, values), stream, tested=list(handles)), self._completer, _torch_caller())

    def allreduce_coalesced(self, tensors, opts=None):
        # libddl fuses ops submitted together, so the tensors go as separate ops, one place of the
        # group's sequence each on every rank. Where two share memory ([t, t], or views that overlap)
        # each op would add into the other's result: copies are reduced then and written back, as
        # gloo's one flat buffer gives, in as many places as a rank whose tensors share nothing takes.
        if not _any_memory_shared(tensors):
            return self._allreduce_each(tensors, opts)
        copies = [t.detach().clone() for t in tensors]
        work = self._allreduce_each(copies, opts)
        return self._then(work, lambda: self._copy_back(copies, tensors))

    def _root(self, opts, what):
        """opts.rootRank, a rank of this group; otherwise no rank would be the root, and the op a
        silent no-op (gloo refuses it too)."""
        root = opts.rootRank
        if not 0 <= root < self.size():
            raise ValueError(f"{what}: invalid root rank {root} for a group of {self.size()}")
        return root

    @_in_step("reduce")
    def reduce(self, tensors, opts):
        tensor = _single(tensors, "reduce")
        root = self._root(opts, "reduce")
        op = _libddl_op(opts.reduceOp)
        dense = _dense(tensor)
        view, dtype = _reducible(dense, op)
        result = torch.empty_like(view)

        def submit(handles):
            view_op, options = self._reduction(view, op)
            # The root is part of what ranks agree on, as a broadcast's is: ranks that name different
            # roots fail with a mismatch naming them, rather than each taking itself for the root.
            # (Told as part of the call site, a mismatch there also puts the group out of step, as a
            # timeout would: gloo's reduce waits for its timeout.)
            site = f"reduce(dst={root})".encode()
            options.call_site = site if options.call_site is None else options.call_site + b", " + site
            self._submit(handles, L.lib.ddl_allreduce_ex, self._name("reduce"), _pointer(view), _pointer(result),
                         view.numel(), dtype, view_op, ctypes.byref(options))

        def finish():
            if self.rank() == root:
                view.copy_(result)
                _write_back([tensor], [dense])
            return tensors

        return self._launch(submit, finish, view, result)

    @_in_step("reducescatter")
    def _reduce_scatter_base(self, output, input, opts=None):
        op = _libddl_op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM)
        _same_device([output, input])
        if input.numel() != output.numel() * self.size():
            raise ValueError(f"reduce_scatter_tensor: the input has {input.numel()} elements; it needs the output's "
                             f"{output.numel()} times the group's {self.size()}")
        if output.dtype != input.dtype:
            raise ValueError(f"reduce_scatter_tensor: the output's dtype ({output.dtype}) must be the input's ({input.dtype})")
        dense = _dense(output)
        send, dtype = _reducible(_dense(input), op)
        recv, _ = _reducible(dense, op)
        counts = L.size_array([recv.numel()] * self.size())

        def submit(handles):
            send_op, options = self._reduction(send, op)
            self._submit(handles, L.lib.ddl_reducescatter_ex, self._name("reducescatter"), _pointer(send),
                         _pointer(recv), counts, dtype, send_op, ctypes.byref(options))

        return self._launch(submit, lambda: _write_back([output], [dense]) or [output], send, recv)

    @_in_step("reducescatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        output = _single(output_tensors, "reduce_scatter")
        inputs = _single(input_tensors, "reduce_scatter")
        if len(inputs) != self.size():
            raise ValueError(f"reduce_scatter takes one input per rank of the group ({self.size()}), not {len(inputs)}")
        if any(t.shape != output.shape or t.dtype != output.dtype for t in inputs):
            raise ValueError("reduce_scatter: every input must have the output's shape and dtype")
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self._reduce_scatter_base(output, flat, opts)

    # ---- moves ----

    @_in_step(_broadcast_places)
    def broadcast(self, tensors, opts):
        root = opts.rootRank
        _single(tensors, "broadcast")  # broadcast_multigpu's list and its src_tensor
        _same_device(tensors)
        dense = [_dense(t) for t in tensors]
        views = [_movable(t) for t in dense]

        def submit(handles):
            for view, dtype in views:
                self._submit(handles, L.lib.ddl_broadcast_ex, self._name("broadcast"), _pointer(view), view.numel(),
                             dtype, root, ctypes.byref(self._options(view, may_block=True)))

        return self._launch(submit, lambda: _write_back(tensors, dense) or tensors, views)

    @_in_step("allgather")
    def _allgather_base(self, output, input, opts=None):
        _same_device([output, input])
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"all_gather_into_tensor: the output has {output.numel()} elements; it needs the "
                             f"input's {input.numel()} times the group's {self.size()}")
        if output.dtype != input.dtype:
            raise ValueError("all_gather_into_tensor: the output's dtype must be the input's")
        dense = _dense(output)
        send, dtype = _movable(_dense(input))
        recv, _ = _movable(dense)
        counts = L.size_array([send.numel()] * self.size())

        def submit(handles):
            self._submit(handles, L.lib.ddl_allgatherv_ex, self._name("allgather"), _pointer(send), _pointer(recv),
                         counts, dtype, ctypes.byref(self._options(send, may_block=True)))

        return self._launch(submit, lambda: _write_back([output], [dense]) or [output], send, recv)

    @_in_step("allgather")
    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs = _single(output_tensors, "all_gather")
        input = _single(input_tensors, "all_gather")
        if len(outputs) != self.size():
            raise ValueError(f"all_gather takes one output per rank of the group ({self.size()}), not {len(outputs)}")
        for index, t in enumerate(outputs):  # as gloo's check: the shape, not only the number of elements
            if t.shape != input.shape or t.dtype != input.dtype:
                raise ValueError(f"all_gather: every output must have the input's shape and dtype ({tuple(input.shape)}, "
                                 f"{input.dtype}); output {index} has {tuple(t.shape)}, {t.dtype}")
        gathered = torch.empty((self.size() * input.numel(),), dtype=input.dtype, device=input.device)
        work = self._allgather_base(gathered, input.contiguous())
        # The future's value is the list of outputs, as gloo's (not the list holding it).
        return self._then(work, lambda: self._split_into(gathered, outputs, outputs))

    @_in_step("allgather")
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """torch's all_gather_coalesced: every rank's list of tensors (of one dtype) into
        output_lists[rank], as one all_gather of each rank's list flattened."""
        if len(output_lists) != self.size():
            raise ValueError(f"all_gather_coalesced takes one output list per rank of the group ({self.size()}), "
                             f"not {len(output_lists)}")
        if not input_list:
            raise ValueError("all_gather_coalesced: the input list is empty")
        dtype = input_list[0].dtype
        outputs = [out for outs in output_lists for out in outs]
        if any(t.dtype != dtype for t in [*input_list, *outputs]):
            raise ValueError("all_gather_coalesced: every input and output tensor must have one dtype")
        for outs in output_lists:
            if len(outs) != len(input_list) or any(o.numel() != i.numel() for o, i in zip(outs, input_list)):
                raise ValueError("all_gather_coalesced: each rank's output list must match the input list in length "
                                 "and in each tensor's number of elements")
        _same_device([*input_list, *outputs])
        flat = torch.cat([t.reshape(-1) for t in input_list])
        gathered = torch.empty((self.size() * flat.numel(),), dtype=dtype, device=flat.device)
        work = self._allgather_base(gathered, flat)

        def finish():
            n = flat.numel()
            for rank, outs in enumerate(output_lists):
                self._split_into(gathered[rank * n:(rank + 1) * n], outs, None)
            return output_lists
        return self._then(work, finish)

    @_in_step("alltoall")
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        _same_device([output, input])
        if output.dtype != input.dtype:
            self._fail_in_step("alltoall", ValueError(f"all_to_all_single: the output's dtype ({output.dtype}) must be the "
                                                      f"input's ({input.dtype})"))
        dense = _dense(output)
        send, dtype = _movable(_dense(input))
        recv, _ = _movable(dense)
        try:
            send_counts = self._split_counts(input, send, input_split_sizes, "input")
            recv_counts = self._split_counts(output, recv, output_split_sizes, "output")
        except ValueError as error:  # this rank's own sizes: its peers learn it in the op's place
            self._fail_in_step("alltoall", error)

        def submit(handles):
            self._submit(handles, L.lib.ddl_alltoallv_ex, self._name("alltoall"), _pointer(send), L.size_array(send_counts),
                         _pointer(recv), L.size_array(recv_counts), dtype, ctypes.byref(self._options(send)))

        return self._launch(submit, lambda: _write_back([output], [dense]) or [output], send, recv)

    def _split_counts(self, tensor, view, split_sizes, which):
        """Elements (of the libddl view) for each rank: the first dimension's split, or equal parts."""
        size = self.size()
        rows = tensor.shape[0] if tensor.dim() > 0 else 1
        per_row = view.numel() // rows if rows else 0
        if not split_sizes:
            if rows % size:
                raise ValueError(f"all_to_all_single: the {which}'s first dimension ({rows}) does not divide by the "
                                 f"group's {size}: pass {which}_split_sizes")
            return [rows // size * per_row] * size
        if len(split_sizes) != size or sum(split_sizes) != rows:
            raise ValueError(f"all_to_all_single: {which}_split_sizes {list(split_sizes)} must be {size} numbers "
                             f"that add up to the {which}'s first dimension ({rows})")
        return [s * per_row for s in split_sizes]

    @_in_step("alltoall")
    def alltoall(self, output_tensors, input_tensors, opts=None):
        size = self.size()
        if len(output_tensors) != size or len(input_tensors) != size:
            raise ValueError(f"all_to_all takes one input and one output per rank of the group ({size})")
        _same_device(list(output_tensors) + list(input_tensors))
        dtypes = {t.dtype for t in list(output_tensors) + list(input_tensors)}
        if len(dtypes) != 1:
            self._fail_in_step("alltoall", ValueError("all_to_all: the inputs and outputs must share one dtype"))
        send = torch.cat([t.reshape(-1) for t in input_tensors])
        recv = torch.empty((sum(t.numel() for t in output_tensors),), dtype=send.dtype, device=send.device)
        send_view, dtype = _movable(_dense(send))
        recv_view, _ = _movable(recv)
        scale = send.element_size() // send_view.element_size()  # libddl's elements per tensor element
        send_counts = [t.numel() * scale for t in input_tensors]
        recv_counts = [t.numel() * scale for t in output_tensors]

        def submit(handles):
            self._submit(handles, L.lib.ddl_alltoallv_ex, self._name("alltoall"), _pointer(send_view),
                         L.size_array(send_counts), _pointer(recv_view), L.size_array(recv_counts), dtype,
                         ctypes.byref(self._options(send_view)))

        def finish():
            self._split_into(recv, output_tensors, None)
            return list(output_tensors)

        return self._launch(submit, finish, send_view, recv_view)

    @_in_step("gather")
    def gather(self, output_tensors, input_tensors, opts):
        input = _single(input_tensors, "gather")
        root = self._root(opts, "gather")
        size = self.size()
        outputs = output_tensors[0] if self.rank() == root else []
        if self.rank() == root and len(outputs) != size:
            self._fail_in_step("gather", ValueError(f"gather: the root takes one output per rank of the group ({size}), "
                                                    f"not {len(outputs)}"))
        if self.rank() == root and any(t.numel() != input.numel() or t.dtype != input.dtype for t in outputs):
            self._fail_in_step("gather", ValueError("gather: every tensor of the root's gather_list must have the "
                                                    "input's size and dtype"))
        send, dtype = _movable(_dense(input))
        recv = torch.empty((size * send.numel() if self.rank() == root else 0,), dtype=send.dtype, device=send.device)
        send_counts = [send.numel() if r == root else 0 for r in range(size)]
        recv_counts = [send.numel() if self.rank() == root else 0 for _ in range(size)]

        def submit(handles):
            self._submit(handles, L.lib.ddl_alltoallv_ex, self._name("gather"), _pointer(send), L.size_array(send_counts),
                         _pointer(recv), L.size_array(recv_counts), dtype, ctypes.byref(self._options(send)))

        def finish():
            if self.rank() == root:
                gathered = recv.view(input.dtype) if recv.dtype != input.dtype else recv
                self._split_into(gathered, outputs, None)
            return outputs  # the root's outputs, none elsewhere: gloo's future value

        return self._launch(submit, finish, send, recv)

    @_in_step("scatter")
    def scatter(self, output_tensors, input_tensors, opts):
        output = _single(output_tensors, "scatter")
        root = self._root(opts, "scatter")
        size = self.size()
        dense = _dense(output)
        recv, dtype = _movable(dense)
        if self.rank() == root:
            inputs = _single(input_tensors, "scatter")
            if len(inputs) != size or any(t.numel() != output.numel() or t.dtype != output.dtype for t in inputs):
                self._fail_in_step("scatter", ValueError(f"scatter: the root takes {size} inputs of the output's size "
                                                         "and dtype"))
            send, _ = _movable(_dense(torch.cat([t.reshape(-1) for t in inputs])))
        else:
            send = torch.empty((0,), dtype=recv.dtype, device=recv.device)
        send_counts = [recv.numel() if self.rank() == root else 0 for _ in range(size)]
        recv_counts = [recv.numel() if r == root else 0 for r in range(size)]

        def submit(handles):
            self._submit(handles, L.lib.ddl_alltoallv_ex, self._name("scatter"), _pointer(send), L.size_array(send_counts),
                         _pointer(recv), L.size_array(recv_counts), dtype, ctypes.byref(self._options(recv)))

        return self._launch(submit, lambda: _write_back([output], [dense]) or [output], send, recv)

    # torch 2.x's coalescing manager and functional collectives (all_gather_into_tensor and
    # reduce_scatter_tensor on a group) reach a group through these two.
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(output, input) for output, input in zip(outputs, inputs)]
        return self._after_all(works, lambda: list(outputs))

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(output, input, opts) for output, input in zip(outputs, inputs)]
        return self._after_all(works, lambda: list(outputs))

    def barrier(self, opts=None):
        # As gloo's and nccl's, a barrier completes after the group's ops issued before it: the
        # Work of an async all_reduce is done, its tensor written, once barrier() has returned.
        earlier = self._completer.unfinished_issued()

        def after_earlier():
            for op in earlier:
                op.settle()  # completed here unless some other thread has claimed it
                try:
                    op.outcome()
                except BaseException:  # its own Work reports it
                    pass
            return []

        def submit(handles):
            handle = ctypes.c_void_p()
            status = L.lib.ddl_barrier_ex(ctypes.c_void_p(self._set), ctypes.byref(handle))
            if status != L.SUCCESS:
                L.raise_for(status)
            handles.append(handle)

        return self._launch(submit, after_earlier)

    # ---- what libddl does not have ----

    def _no_point_to_point(self, *args, **kwargs):
        raise ValueError("the ddl backend has no point-to-point send/recv: use a gloo group for them "
                         "(torch.distributed.new_group(backend='gloo'))")

    send = recv = recv_anysource = _no_point_to_point

    # ---- helpers ----

    @staticmethod
    def _split_into(flat, outputs, result):
        offset = 0
        for out in outputs:
            n = out.numel()
            out.copy_(flat[offset:offset + n].view(out.shape))
            offset += n
        return result

    @staticmethod
    def _copy_back(copies, tensors):
        with torch.no_grad():
            for tensor, value in zip(tensors, copies):
                tensor.copy_(value)
        return list(tensors)

    def _after_all(self, works, finish):
        """A Work that completes, with `finish()`, after every one of `works` (raising the first error).
        `finish()` often runs on the group's thread: a CUDA op's copies go on its caller's stream."""
        future = torch.futures.Future()
        stream = next((w._op.stream for w in works if getattr(getattr(w, "_op", None), "stream", None) is not None), None)

        def chain(done):
            try:
                for each in done.value():
                    each.value()
                with torch.no_grad(), _on_stream(stream):
                    value = finish()
            except BaseException as error:
                _set_outcome(future, None, error)
            else:
                future.set_result(value)

        torch.futures.collect_all([work.get_future() for work in works]).then(chain)
        chained = _Op((), None, None, future=future)
        chained.claimed = True  # `chain` completes its future: nobody else may
        return _work(chained, self._completer, _torch_caller())

    def _then(self, work, finish):
        """A Work that completes, with `finish()`, after `work`."""
        return self._after_all([work], finish)


# ---- creating groups ----

_KEY_IN_STORE = "ddl_set_key"


def _key_for(options, rank):
    """A libddl set key every member of the new group derives alike: torch's group id and a nonce
    the group's rank 0 puts into the group's store (torch gives each group a store of its own over
    the world's). torch's group ids start again after destroy_process_group(), and it never calls
    the backend on non-members, so nothing a process counts itself would agree across ranks."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(options.group_id))[:150]
    store = options.store  # torch 1.13 and 2.x give every backend the group's prefix store
    # A store can outlive a group of its name (a store passed to init_process_group again, a group
    # made again under the same name): each making has its own slot, counted by arrivals, so that
    # no member reads the nonce of an earlier one. No member makes the next before all of this one
    # have arrived (making the set waits for all of them).
    making = (store.add(_KEY_IN_STORE + ".arrivals", 1) - 1) // options.group_size
    slot = f"{_KEY_IN_STORE}.{making}"
    if rank == 0:
        store.set(slot, secrets.token_hex(8))
    return f"torch.{safe}.{store.get(slot).decode()}"


def _ensure_libddl(options):
    """libddl's world for a new group: the launcher's (ddl run, mpirun, srun --mpi=pmix) where one gave
    it, else the one torch's store makes (mp.spawn, torchrun, a plain srun). A world of another size
    than the launcher's is the program's own: workers that one launched process started with
    mp.spawn (PyTorch's ImageNet example under srun or ddl run), which join through torch's store."""
    if not L.lib.ddl_is_initialized():
        _refuse_a_rank_the_launcher_did_not_give(options)
        if dist.is_initialized() and options.group_size != dist.get_world_size():
            # libddl starts by joining the whole world, which the ranks outside this group never do.
            raise RuntimeError(f"the first 'ddl' group must hold every rank: this one holds {options.group_size} of "
                               f"{dist.get_world_size()}. Make a 'ddl' group of every rank first (new_group(backend='ddl') "
                               "called by every rank with every rank, or init_process_group('ddl')), then this one")
        if (_basics.launcher_gives_world() and _basics.launcher_world_size() in (None, options.group_size)
                and not _basics.started_by_multiprocessing()):
            _basics.init()
        elif dist.is_initialized():  # a "ddl" group under another backend's default group
            _join_through_default_group()
        else:
            _basics.init_through_store(options.store, options.group_rank, options.group_size)
    elif not dist.is_initialized() and _program_store.joined_through_store():
        _program_store.use(options.store)  # the default group made again: its store is the one now
    if dist.is_initialized():
        return
    size = L.int_out(L.lib.ddl_size)
    if size != options.group_size:
        raise ValueError(f"init_process_group asked for a world of {options.group_size} ranks, but this process was "
                         f"started in one of {size} ({_basics.world_source()}): pass world_size={size} or leave it "
                         "out")


def _refuse_a_rank_the_launcher_did_not_give(options):
    """A process a launched one started itself (Lightning's subprocess launcher, a script's own
    Popen) inherits the launcher's variables: in a world of the launcher's size with another rank
    than the launcher's, it would join the launcher's world in another process's place and wait
    there for DDL_TIMEOUT. Refused at once. (multiprocessing's children join through the store.)"""
    given = _basics.launcher_rank()
    if (dist.is_initialized() or not _basics.launcher_gives_world() or _basics.started_by_multiprocessing()
            or given is None or _basics.launcher_world_size() not in (None, options.group_size) or given == options.group_rank):
        return
    raise ValueError(f"init_process_group: torch's rank {options.group_rank} of {options.group_size} is not the rank the "
                     f"launcher gave this process ({given}): it was started by a process the "
                     "launcher started (Lightning's own launcher, a subprocess) and inherited its variables. Let the "
                     "launcher start every rank (Lightning: devices=1 per launched process, or num_nodes and devices that "
                     "match the launcher's tasks), or leave rank and world_size out")


def _join_through_default_group():
    """libddl's world through the store of torch's default group (made by another backend)."""
    get_store = getattr(dist.distributed_c10d, "_get_default_store", None)
    if get_store is None:
        raise RuntimeError("this torch does not give its default group's store, which libddl's world would be made "
                           "through: start the program with ddl run, or init_process_group('ddl') first")
    _basics.init_through_store(get_store(), dist.get_rank(), dist.get_world_size())


def join_through_torch_environment():
    """hvd.init() in a program no launcher gave a world: the store of torch's default group if
    init_process_group ran, else torch's env:// rendezvous where RANK, WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT are set (torchrun, mp.spawn scripts, site srun recipes). Otherwise nothing: the world
    is this process alone."""
    if dist.is_initialized():
        _join_through_default_group()
    elif all(os.environ.get(v) for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        # Bounded by DDL_TIMEOUT: torch's own default (30 min) left a rank whose peer never came
        # waiting there that long.
        timeout = _ddl_timeout()
        try:
            store, rank, size = next(dist.rendezvous("env://", timeout=timeout))
        except (RuntimeError, TimeoutError) as e:  # torch 1.13 raises RuntimeError, later ones a subclass
            raise RuntimeError(f"hvd.init(): torch's env:// rendezvous at {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
                               f"(RANK={os.environ['RANK']}, WORLD_SIZE={os.environ['WORLD_SIZE']}) did not complete within "
                               f"DDL_TIMEOUT ({timeout.total_seconds():g} s): {e}") from e
        _basics.init_through_store(store, rank, size)


def _ddl_timeout():
    """DDL_TIMEOUT as libddl reads it (seconds; 300 when unset); a value libddl refuses is left for
    it to name, and counts as the default here."""
    try:
        seconds = float(os.environ.get("DDL_TIMEOUT") or 300)
    except ValueError:
        seconds = 300.0
    if not 0.001 <= seconds <= 365 * 24 * 3600:
        seconds = 300.0
    return datetime.timedelta(seconds=seconds)


def _create_process_group(options, pg_options=None):
    """torch's creator for backend "ddl" (the extended API: it names the group and its ranks)."""
    rank, size = options.group_rank, options.group_size
    _ensure_libddl(options)
    world_rank = L.int_out(L.lib.ddl_rank)
    world_ranks = list(options.global_ranks_in_group) or list(range(size))
    if len(world_ranks) != size or world_ranks[rank] != world_rank:
        raise ValueError(f"torch's rank {rank} of {size} is libddl's rank {world_rank} "
                         f"({_basics.world_source()}): under a launcher (ddl run, srun --mpi=pmix, mpirun) let "
                         "init_process_group take rank and world_size from the environment")
    timeout = options.timeout if isinstance(options.timeout, datetime.timedelta) else datetime.timedelta(minutes=30)
    group = ProcessGroupDDL(rank, size, world_ranks, _key_for(options, rank), timeout)
    # Kept as gloo's group keeps it: torch's store (rank 0's server among them) stays up until the
    # group is gone, after its ops. Dropped at destroy_process_group while a peer still polls it in
    # init_process_group's barrier, it would leave that peer with "Broken pipe".
    group._store = options.store
    return group


def _register():
    if hasattr(dist.Backend, BACKEND_NAME.upper()) or BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    try:  # torch 2.x: the devices it serves
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"])
    except TypeError:  # torch 1.13
        dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True)


if dist.is_available():
    _register()
