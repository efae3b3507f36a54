"""ddl.torch: Horovod's PyTorch API over libddl.

    import ddl.torch as hvd
    hvd.init()
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)

Names, signatures, defaults and exceptions follow horovod.torch 0.28, so Horovod scripts run with
one changed import. Start the program with `ddl run` (or mpirun / srun --mpi=pmix, or torchrun and
mp.spawn: see init).
"""

import torch

from ddl.common import basics as _basics
from ddl.common import host_ops as _host
from ddl.common.basics import (shutdown, is_initialized, rank, size, local_rank, local_size,  # noqa: F401
                               cross_rank, cross_size, is_homogeneous, mpi_threads_supported, mpi_built, mpi_enabled,
                               gloo_built, gloo_enabled, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
                               start_timeline, stop_timeline)
from ddl import distributed as _distributed  # noqa: F401  (registers torch.distributed's "ddl" backend)
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


def init(comm=None, process_sets=None):
    """Joins the world: the one `ddl run`, mpirun or srun --mpi=pmix started; else (torchrun, mp.spawn,
    a plain srun with torch's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) through torch's store:
    the default group's if init_process_group ran first, else torch's env:// rendezvous. Without any
    of these the world is this process alone. A no-op once initialized. `process_sets` (ProcessSet
    objects or rank lists, or "dynamic": none now) are added right away; `comm` may list every rank
    of the world, or be an MPI communicator of it (ddl cannot run on a part of the world)."""
    if not _basics.is_initialized() and not _basics.launcher_gives_world():
        _distributed.join_through_torch_environment()
    _basics.init(comm, process_sets)


def join(device=-1):
    """Waits until every rank has joined, meanwhile adding zeros to the other ranks' allreduces (so ranks
    with fewer batches need not invent any). Returns the last rank to join. Broadcasts and allgathers
    fail on every rank while some rank waits here."""
    _basics.require("rank")
    if device >= 0 and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    return _basics.join()


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
    """Returns the reductions of `tensors` over the process set (default op: Average), reduced
    together under one handle (fused where libddl can); differentiable.

    Blocks until the results are there. The gradient is a grouped allreduce of the incoming
    gradients with the same op and factors.

    Arguments:
        tensors: a list of tensors, all on one device, each of a dtype allreduce_async takes.
        average, name, op, prescale_factor, postscale_factor, process_set: as allreduce_async; a named
            group names its parts NAME.0, NAME.1, ..., and ranks must give groups of the same size.
        compression: Compression.none (the default) or Compression.fp16: each tensor is compressed
            before the reduction and its result decompressed after it.

    Returns:
        the list of reduced tensors (new ones), in the order of `tensors`.

    Raises:
        as allreduce_async (its synchronize() errors included); RuntimeError for tensors on different
        devices.
    """
    op = _ops._reduce_op(op, average)
    pairs = [compression.compress(t) for t in tensors]
    reduced = _ag.GroupedAllreduceFn.apply(name, op, prescale_factor, postscale_factor, process_set,
                                           *[p[0] for p in pairs])
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates every rank's `tensor` along the first dimension (which may differ by rank)."""
    return _ag.AllgatherFn.apply(tensor, name, process_set)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Gathers every tensor of `tensors` from every rank along the first dimension, all under one
    handle; differentiable.

    Blocks until the results are there. The gradient of each is the incoming gradient averaged over
    the set, of which this rank keeps its own rows.

    Arguments:
        tensors: a list of tensors, all on one device, each as allgather_async takes it (its first
            dimension may differ by rank, every other must agree).
        name, process_set: as allgather_async; a named group names its parts NAME.0, NAME.1, ..., and
            ranks must give groups of the same size.

    Returns:
        the list of gathered tensors (new ones, the ranks' rows in rank order), in the order of
        `tensors`.

    Raises:
        as allgather_async (its synchronize() errors included); RuntimeError for tensors on different
        devices.
    """
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
    """Reduces `tensor` over the process set and returns this rank's rows of the first dimension:
    rank r gets rows [offset_r, offset_r + n_r), the first (rows % size) ranks one row more than the
    others; differentiable.

    Blocks until the result is there. The gradient is every rank's incoming gradient gathered (an
    allgather), then reduced over the set with the forward's op and factors.

    Arguments:
        tensor: at least one dimension, of the same shape and dtype on every rank.
        name, process_set, prescale_factor, postscale_factor: as reducescatter_async.
        compression: Compression.none (the default) or Compression.fp16: `tensor` is compressed before
            the op and the result decompressed after it.
        op: Sum or Average (the default), as Horovod's; Adasum is a NotImplementedError, any other op a
            ValueError.

    Returns:
        this rank's share: a new tensor of its rows.

    Raises:
        ValueError before init(), for a process set this rank cannot use, a 0-d tensor, and a dtype,
        device or op no rank could run; NotImplementedError for Adasum; RuntimeError when ranks
        disagree on the op, HorovodInternalError when a rank times out or dies.
    """
    op = _host.reducescatter_op(_ops._reduce_op(op, None))
    compressed, ctx = compression.compress(tensor)
    return compression.decompress(_ag.ReducescatterFn.apply(compressed, name, op, prescale_factor, postscale_factor,
                                                            process_set), ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces and scatters every tensor of `tensors` as reducescatter does, all under one handle;
    differentiable as reducescatter.

    Arguments:
        tensors: a list of tensors, all on one device, each as reducescatter takes it.
        name, compression, op, process_set, prescale_factor, postscale_factor: as reducescatter; a
            named group names its parts NAME.0, NAME.1, ..., and ranks must give groups of the same
            size.

    Returns:
        the list of this rank's shares (new tensors), in the order of `tensors`.

    Raises:
        as reducescatter; RuntimeError for tensors on different devices.
    """
    op = _host.reducescatter_op(_ops._reduce_op(op, None))
    pairs = [compression.compress(t) for t in tensors]
    out = _ag.GroupedReducescatterFn.apply(name, op, prescale_factor, postscale_factor, process_set,
                                           *[p[0] for p in pairs])
    return [compression.decompress(r, p[1]) for r, p in zip(out, pairs)]


from ddl.torch.functions import broadcast_parameters, broadcast_optimizer_state, broadcast_object, allgather_object  # noqa: E402
from ddl.torch.optimizer import DistributedOptimizer  # noqa: E402
from ddl.torch.sync_batch_norm import SyncBatchNorm  # noqa: E402
