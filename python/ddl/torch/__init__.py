"""ddl.torch: Horovod's PyTorch API over libddl.

    import ddl.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Names, signatures, defaults and exceptions follow horovod.torch 0.28, so Horovod scripts run with
one changed import. Start the program with `ddl run` (or mpirun / srun --mpi=pmix).
"""

import atexit
import ctypes
import os
import sys

import torch

from ddl import _lib as L
from ddl.torch import mpi_ops as _ops
from ddl.torch import _autograd as _ag
from ddl.torch.compression import Compression
from ddl.torch.mpi_ops import (Average, Sum, Adasum, Min, Max, Product, HorovodInternalError, HostsUpdatedInterrupt,
                               allreduce_async, allreduce_async_, allreduce_, grouped_allreduce_async,
                               grouped_allreduce_async_, grouped_allreduce_, allgather_async,
                               grouped_allgather_async, broadcast_async, broadcast_async_, broadcast_, alltoall_async,
                               reducescatter_async, grouped_reducescatter_async, sparse_allreduce_async, barrier,
                               poll, synchronize)
from ddl.torch.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set
from ddl.torch import process_sets as _process_sets

# Horovod's variables, honoured as aliases of libddl's when the DDL_* one is not set.
_ENV_ALIASES = {"HOROVOD_FUSION_THRESHOLD": "DDL_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME": "DDL_CYCLE_TIME_MS",
                "HOROVOD_TIMELINE": "DDL_TIMELINE"}

_topology = {}
_exit_state = {"hooked": False, "uncaught": False}


def _finalize_at_exit():
    """Under a PMIx launcher (mpirun, srun --mpi=pmix) a process that exits without finalizing is
    reported as failed, so leave cleanly at exit, as Horovod does; but not after an uncaught
    exception, where finalizing would wait for peers that may be waiting for this rank. Under
    `ddl run` nothing needs it, and a failing rank should exit at once."""
    if _exit_state["uncaught"] or not L.lib.ddl_is_initialized():
        return
    try:
        shutdown()
    except Exception:
        pass


def _hook_exit():
    if _exit_state["hooked"] or "DDL_STORE_ADDR" in os.environ or "PMIX_RANK" not in os.environ:
        return
    _exit_state["hooked"] = True
    previous = sys.excepthook

    def excepthook(*args):
        _exit_state["uncaught"] = True
        previous(*args)
    sys.excepthook = excepthook
    atexit.register(_finalize_at_exit)


def _apply_env_aliases():
    for horovod, ddl in _ENV_ALIASES.items():
        value = os.environ.get(horovod)
        # HOROVOD_TIMELINE=DYNAMIC means "started later with start_timeline()".
        if value and ddl not in os.environ and not (horovod == "HOROVOD_TIMELINE" and value == "DYNAMIC"):
            os.environ[ddl] = value


def init(comm=None, process_sets=None):
    """Joins the world (a no-op if already initialized). `process_sets` are added right away."""
    if comm is not None:
        raise ValueError("ddl.torch.init() takes no MPI communicator: start the workers with `ddl run`, mpirun or srun")
    if not L.lib.ddl_is_initialized():
        _apply_env_aliases()
        status = L.lib.ddl_init()
        if status != L.SUCCESS:
            L.raise_for(status)
        _learn_topology()
        _process_sets._reset_global(_topology["size"])
        _hook_exit()
    for ps in process_sets or []:
        if ps.process_set_id is None:
            add_process_set(ps)


def _learn_topology():
    """Sizes of the world and its nodes; cross_size and is_homogeneous need every rank's placement."""
    rank, size = L.int_out(L.lib.ddl_rank), L.int_out(L.lib.ddl_size)
    local_rank, local_size = L.int_out(L.lib.ddl_local_rank), L.int_out(L.lib.ddl_local_size)
    node_rank = L.int_out(L.lib.ddl_node_rank)
    mine = torch.tensor([local_rank, local_size, node_rank], dtype=torch.int64)
    everyone = torch.empty(3 * size, dtype=torch.int64)
    status = L.lib.ddl_allgatherv_ex(b"ddl.torch.topology", mine.data_ptr(), everyone.data_ptr(),
                                     (ctypes.c_size_t * size)(*([3] * size)), L.INT64, None, ctypes.byref(h := ctypes.c_void_p()))
    if status != L.SUCCESS:
        L.raise_for(status)
    _ops._wait_all([h])
    rows = everyone.view(size, 3).tolist()
    _topology.update(rank=rank, size=size, local_rank=local_rank, local_size=local_size, cross_rank=node_rank,
                     cross_size=sum(1 for r in rows if r[0] == local_rank),
                     homogeneous=len({r[1] for r in rows}) == 1)


def shutdown():
    """Leaves the world (every rank must call it); init() may be called again afterwards."""
    if not L.lib.ddl_is_initialized():
        return
    _ops._drop_all_handles()
    _process_sets._forget_all()
    status = L.lib.ddl_finalize()
    _topology.clear()
    if status != L.SUCCESS:
        L.raise_for(status)


def is_initialized():
    return bool(L.lib.ddl_is_initialized())


def _require(key):
    if not L.lib.ddl_is_initialized() or key not in _topology:
        raise ValueError("ddl.torch has not been initialized; call hvd.init() first")
    return _topology[key]


def rank():
    return _require("rank")


def size():
    return _require("size")


def local_rank():
    return _require("local_rank")


def local_size():
    return _require("local_size")


def cross_rank():
    return _require("cross_rank")


def cross_size():
    return _require("cross_size")


def is_homogeneous():
    return _require("homogeneous")


def _nccl_version_code():
    text = L.lib.ddl_nccl_version().decode()
    if not text:
        return 0
    major, minor, patch = (int(p) for p in text.split(".")[:3])
    return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch


def mpi_threads_supported():
    return False


def mpi_built():
    return False


def mpi_enabled():
    return False


def gloo_built():
    return True


def gloo_enabled():
    return True


def nccl_built():
    """NCCL's version code (e.g. 22805) when libddl was built with NCCL, else 0: as Horovod."""
    return _nccl_version_code()


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return _nccl_version_code() > 0


def rocm_built():
    return False


def start_timeline(file_path, mark_cycles=False):
    """Starts writing a Chrome-trace timeline of the ops to `file_path`: rank 0 writes it, or every rank
    its own when the path holds "%r" (replaced by the rank)."""
    _require("rank")
    status = L.lib.ddl_timeline_start(os.fsencode(file_path))
    if status != L.SUCCESS:
        L.raise_for(status)


def stop_timeline():
    """Stops the timeline and closes its file."""
    _require("rank")
    status = L.lib.ddl_timeline_stop()
    if status != L.SUCCESS:
        L.raise_for(status)


def join(device=-1):
    """Waits until every rank has joined, meanwhile adding zeros to the other ranks' allreduces (so ranks
    with fewer batches need not invent any). Returns the last rank to join. Broadcasts and allgathers
    fail on every rank while some rank waits here."""
    _require("rank")
    if device >= 0 and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    last = ctypes.c_int(-1)
    status = L.lib.ddl_join(None, ctypes.byref(last))
    if status != L.SUCCESS:
        L.raise_for(status)
    _ops._names.restart_counting()
    return last.value


# ---- the differentiable, synchronous forms ----

def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Returns the reduction of `tensor` over the process set (default op: Average); differentiable."""
    op = _ops._reduce_op(op, average)
    compressed, ctx = compression.compress(tensor)
    if compressed.requires_grad and torch.is_grad_enabled():
        summed = _ag.AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    else:  # no graph to record: skip autograd's bookkeeping (most of a small op's Python cost)
        output = torch.empty_like(compressed, memory_format=torch.contiguous_format)
        summed = _ops.allreduce_now(compressed, output, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(summed, ctx)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    op = _ops._reduce_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _ag.GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor, process_set,
                                           *[p[0] for p in pairs])
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension (which may differ by rank)."""
    return _ag.AllgatherFn.apply(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(_ag.GroupedAllgatherFn.apply(name, process_set, *tensors))


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank (root_rank is a world rank)."""
    return _ag.BroadcastFn.apply(tensor, root_rank, name, process_set)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Sends splits[j] rows to rank j (equal splits by default). Returns the received rows, and with
    `splits` given also the received splits."""
    output, received = _ag.AlltoallFn.apply(tensor, splits, name, process_set)
    return output if splits is None else (output, received)


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    op = _ops._reduce_op(op, None)
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(_ag.ReducescatterFn.apply(compressed, name, op, prescale_factor, postscale_factor,
                                                            process_set), ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    op = _ops._reduce_op(op, None)
    pairs = [compression.compress(t) for t in tensors]
    out = _ag.GroupedReducescatterFn.apply(name, op, prescale_factor, postscale_factor, process_set,
                                           *[p[0] for p in pairs])
    return [compression.decompress(r, p[1]) for r, p in zip(out, pairs)]


from ddl.torch.functions import broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object  # noqa: E402
from ddl.torch.optimizer import DistributedOptimizer  # noqa: E402
from ddl.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402
