"""Model, optimizer and object broadcasts, as horovod.torch.functions."""

import io
import inspect
import pickle

import torch

from ddl.common import objects
from ddl.torch import mpi_ops as ops
from ddl.torch.process_sets import ProcessSet, global_process_set


def broadcast_parameters(params, root_rank, process_set=global_process_set):
    """Overwrites every rank's parameters with root_rank's. `params` is a state_dict, named_parameters(),
    a list of (name, tensor) or a list of tensors (model.parameters()).

    Each tensor is broadcast in place (broadcast_async_) under the name broadcast_parameters.NAME
    (a tensor without a name: its place in the list), every broadcast started before any is waited for.

    Arguments:
        params: a dict (a state_dict, its entries taken in the order of their names), or an iterable
            of (name, tensor) pairs or of tensors; an entry whose value is None or not a tensor is
            skipped, and of a torch.nn.Parameter its data is overwritten.
        root_rank: the world rank whose values every rank gets (it must be in the process set).
        process_set: the ProcessSet to broadcast over (every rank of it must call this).

    Raises:
        ValueError for params of another kind and as broadcast_async_; from the broadcasts,
        RuntimeError when ranks disagree on a tensor's shape or dtype, HorovodInternalError when a
        rank times out or dies.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, list) or hasattr(params, "__iter__"):
        items = [(i, p) if torch.is_tensor(p) else p for i, p in enumerate(params)]
        if any(not (isinstance(p, tuple) and len(p) == 2) for p in items):
            raise ValueError("broadcast_parameters takes a state_dict, a list of (name, tensor) pairs or a list of tensors")
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}")
    handles = []
    try:
        for name, p in items:
            if p is None:
                continue
            tensor = p.data if isinstance(p, torch.nn.Parameter) else p
            if not torch.is_tensor(tensor):
                continue
            handles.append(ops.broadcast_async_(tensor, root_rank, name=f"broadcast_parameters.{name}",
                                                process_set=process_set))
    except BaseException:  # a name twice, a bad root: the broadcasts already started are waited for
        for h in handles:
            ops._settle(h)
        raise
    for i, h in enumerate(handles):
        try:
            ops.synchronize(h)
        except BaseException:  # the rest are waited for too, so that their names are free again
            for rest in handles[i + 1:]:
                ops._settle(rest)
            raise


def broadcast_optimizer_state(optimizer, root_rank, model=None, process_set=global_process_set):
    """Makes every rank's optimizer state (and hyper-parameters) root_rank's. An optimizer that has not
    stepped yet gets its state created first, with zero gradients, as Horovod does.

    The root's optimizer.state_dict() travels through broadcast_object (named
    "broadcast_optimizer_state"), and every other rank loads it with load_state_dict(). Creating the
    state is one optimizer step with a zero gradient for every parameter that requires one, after
    which the parameters' values and gradients are put back as they were.

    Arguments:
        optimizer: a torch.optim optimizer, or a DistributedOptimizer (torch.optim.LBFGS is refused).
        root_rank: the world rank whose state every rank gets (it must be in the process set).
        model: the module the optimizer trains, or None. As Horovod's: the weights of its sparse
            embeddings (nn.Embedding or nn.EmbeddingBag with sparse=True) get sparse zero gradients
            for the step that creates the state, as torch.optim.SparseAdam's parameters always do.
            (A ProcessSet given here is taken as process_set, as this function's older signature had it.)
        process_set: the ProcessSet to broadcast over (every rank of it must call this).

    Raises:
        ValueError for torch.optim.LBFGS; otherwise as broadcast_object.
    """
    if isinstance(model, ProcessSet):
        model, process_set = None, model
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if len(state_dict["state"]) == 0:
        _create_state(optimizer, _sparse_gradient_parameters(optimizer, model))
        state_dict = optimizer.state_dict()
    # The state travels on the CPU: each rank's load_state_dict moves it to its own parameters' devices.
    # Pickled as the root's CUDA tensors, it would be unpickled onto the root's GPU index on every rank
    # (the whole state on one GPU of a node, or an error where that index is not visible).
    root_state = broadcast_object(_on_cpu(state_dict) if ops._world_rank() == root_rank else None, root_rank,
                                  name="broadcast_optimizer_state", process_set=process_set)
    if ops._world_rank() != root_rank:
        optimizer.load_state_dict(root_state)


def _on_cpu(value):
    """`value` (a state dict's nesting of dicts, lists and tuples) with its tensors copied to the CPU."""
    if torch.is_tensor(value):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_cpu(v) for v in value)
    return value


def _sparse_gradient_parameters(optimizer, model):
    """The ids of the parameters whose gradients are sparse in training: all of SparseAdam's, and the
    weights of `model`'s sparse embeddings."""
    if isinstance(optimizer, torch.optim.SparseAdam):
        return {id(p) for group in optimizer.param_groups for p in group["params"]}
    if model is None:
        return set()
    return {id(m.weight) for m in model.modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse}


def _create_state(optimizer, sparse):
    """One step with zero gradients (sparse ones for the ids in `sparse`), so that the state exists;
    the parameters' values and gradients are put back afterwards."""
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved.append((p, p.data.clone(), p.grad))
            if p.requires_grad:
                zero = torch.zeros_like(p)
                p.grad = zero.to_sparse() if id(p) in sparse else zero
    try:
        with torch.no_grad():
            if getattr(optimizer, "_ddl_distributed", False):  # the wrapped optimizer's own step, no allreduce
                type(optimizer).__mro__[1].step(optimizer)
            else:
                optimizer.step()
    finally:
        for p, data, grad in saved:
            p.data.copy_(data)
            p.grad = grad


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Returns root_rank's `obj` (any object cloudpickle, or else pickle, can serialize) on every rank.

    Two broadcasts, named NAME.length and NAME.data: the length of the root's serialized object
    (torch.save, with cloudpickle where it is installed), then its bytes, which the other ranks read
    back with torch.load.

    Arguments:
        obj: the object on the root; not used on the other ranks.
        root_rank: the world rank whose object every rank gets (it must be in the process set).
        name: the prefix of the broadcasts' names, which every rank must give alike; None:
            "broadcast_object".
        process_set: the ProcessSet to broadcast over (every rank of it must call this).

    Returns:
        on the root `obj` itself; on every other rank the object read back from the root's bytes.

    Raises:
        ValueError before init(), for a process set this rank cannot use, and for a root_rank that is
        not an int or not in the set. Where the root cannot serialize `obj`: on the root the error
        that serializing raised, on the other ranks a RuntimeError naming the root (the bytes are
        then not sent). RuntimeError when ranks disagree on an op, HorovodInternalError when a rank
        times out or dies.
    """
    name = name or "broadcast_object"  # the same on every rank, whatever each passes
    me = ops._world_rank()
    payload, error = objects.serialized(obj, _dumps) if me == root_rank else (b"", None)
    length = torch.tensor([objects.length_of(payload)], dtype=torch.int64)
    ops.broadcast_(length, root_rank, name=f"{name}.length", process_set=process_set)
    objects.raise_if_not_serialized("broadcast_object", [int(length.item())], [root_rank], error)
    data = _as_tensor(payload) if me == root_rank else torch.empty(int(length.item()), dtype=torch.uint8)
    ops.broadcast_(data, root_rank, name=f"{name}.data", process_set=process_set)
    return obj if me == root_rank else _loads(data)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Returns the list of every rank's `obj`, in rank order.

    Two allgathers, named NAME.lengths and NAME.data: each rank's serialized length (torch.save, with
    cloudpickle where it is installed), then every rank's bytes, each read back with torch.load.

    Arguments:
        obj: this rank's object.
        name: the prefix of the allgathers' names, which every rank must give alike; None:
            "allgather_object".
        process_set: the ProcessSet to gather over (every rank of it must call this).

    Returns:
        a list of the set's ranks' objects, in rank order, each read back from the bytes its rank
        sent (this rank's own too).

    Raises:
        ValueError before init() and for a process set this rank cannot use. Where a rank cannot
        serialize its `obj`: on that rank the error that serializing raised, on the others a
        RuntimeError naming the ranks that could not (the bytes are then not sent). RuntimeError when
        ranks disagree on an op, HorovodInternalError when a rank times out or dies.
    """
    name = name or "allgather_object"
    payload, error = objects.serialized(obj, _dumps)
    lengths = ops.synchronize(ops.allgather_async(torch.tensor([objects.length_of(payload)], dtype=torch.int64),
                                                  name=f"{name}.lengths", process_set=process_set)).tolist()
    objects.raise_if_not_serialized("allgather_object", lengths, process_set.ranks, error)
    data = ops.synchronize(ops.allgather_async(_as_tensor(payload), name=f"{name}.data", process_set=process_set))
    out, offset = [], 0
    for n in lengths:
        out.append(_loads(data[offset:offset + n]))
        offset += n
    return out


def _as_tensor(payload):
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8)


def _dumps(obj):
    buf = io.BytesIO()
    torch.save(obj, buf, pickle_module=objects.pickler, pickle_protocol=pickle.HIGHEST_PROTOCOL)
    return buf.getvalue() or b"\0"


def _loads(tensor):
    # Any object travels, as with Horovod's cloudpickle, so not only weights: PyTorch 2.6
    # made weights_only=True the default, which refuses most objects.
    return torch.load(io.BytesIO(tensor.numpy().tobytes()), **_LOAD_ANY_OBJECT)


_LOAD_ANY_OBJECT = {"weights_only": False} if "weights_only" in inspect.signature(torch.load).parameters else {}
