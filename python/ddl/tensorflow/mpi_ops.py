"""Horovod's TensorFlow collectives over libddl, eagerly and inside tf.function.

No op is compiled against TensorFlow: eagerly an op hands the tensor's host buffer (numpy) to
ddl.common.host_ops; in a graph it is one `tf.numpy_function` node (stateful, so tf.function keeps
the program's order of collectives), whose output shapes are set from what the op guarantees.
Names: an explicit `name` is used as given; an unnamed op in a graph is named when traced, from the
name of its input tensor in that graph (as Horovod does), so a retrace on one rank gives the same
names; an unnamed eager op counts up alike on every rank. Every op is differentiable
(tf.custom_gradient), with the gradients Horovod defines. Tensors on a GPU travel through the host.
"""

import contextlib
import functools
import re
import threading

import numpy as np
import tensorflow as tf

from ddl import _lib as L
from ddl.common import basics as _basics
from ddl.common import dtypes as _dtypes
from ddl.common import host_ops as H
from ddl.common import exceptions as _exceptions
from ddl.common.process_sets import ProcessSet, global_process_set

Average, Sum, Adasum, Min, Max, Product = H.Average, H.Sum, H.Adasum, H.Min, H.Max, H.Product


class HorovodInternalError(tf.errors.UnknownError, _exceptions.HorovodInternalError):
    """A collective failed because a peer failed, timed out or the world broke: a tf.errors.UnknownError,
    as Horovod's TensorFlow ops report it (and the HorovodInternalError of the shared core)."""

    def __init__(self, message):
        tf.errors.UnknownError.__init__(self, None, None, message)


class InvalidArgument(tf.errors.InvalidArgumentError, ValueError):
    """A bad argument found while an op runs (splits that do not fit its rows, a name in flight...):
    tf.errors.InvalidArgumentError, as Horovod's kernels raise it, and a ValueError as well (so that
    TensorFlow's py_func keeps the code inside a graph, and `except ValueError` still catches it)."""

    def __init__(self, message):
        tf.errors.InvalidArgumentError.__init__(self, None, None, message)


def _tf_error(status, message):
    """The TensorFlow error Horovod's ops raise for a libddl status."""
    if status in (L.MISMATCH, L.NOT_INITIALIZED):
        return tf.errors.FailedPreconditionError(None, None, message)
    if status == L.INVALID_ARGUMENT:
        return InvalidArgument(message)
    if status == L.UNSUPPORTED:
        return tf.errors.UnimplementedError(None, None, message)
    return HorovodInternalError(message)


# A TensorFlow 1 graph run by a Session orders nothing that the graph does not: its executor may start
# independent collectives in different orders on different ranks, and each one holds an executor
# thread while it waits for its peers (Horovod's compiled ops are asynchronous; a tf.numpy_function
# is not). tf.function orders stateful ops, so only Session graphs meet this.
_SESSION_GRAPH_HINT = (" (in a TensorFlow 1 graph run by a Session, TensorFlow may start independent collectives in "
                       "different orders on different ranks, each holding an inter-op thread while it waits: order "
                       "them with tf.control_dependencies, run the step in a tf.function, which keeps the program's "
                       "order, or give the Session more inter-op threads than the graph has independent collectives "
                       "(TF_NUM_INTEROP_THREADS, which ddl sets to 64 when unset, or inter_op_parallelism_threads))")


@contextlib.contextmanager
def _tf_errors(timeout_hint=""):
    """Turns libddl's failures into tf.errors (the message of a timeout ends with `timeout_hint`)."""
    try:
        yield
    except Exception as e:
        status = getattr(e, "ddl_status", None)
        if status == L.TIMEOUT and timeout_hint:
            raise _tf_error(status, str(e) + timeout_hint) from None
        if isinstance(e, tf.errors.OpError):
            raise
        if status is None and isinstance(e, ValueError):  # a check of the op's data, made as it runs
            raise InvalidArgument(str(e)) from None
        if status is None:
            raise
        raise _tf_error(status, str(e)) from None


def _executing_eagerly():
    return tf.executing_eagerly()


def _tape_may_record():
    try:
        from tensorflow.python.eager import tape as tape_lib
        return tape_lib.could_possibly_record()
    except (ImportError, AttributeError):
        return True


def _with_gradient(body, *xs):
    """body(*xs) -> (outputs, gradient function): recorded for autodiff (tf.custom_gradient) unless,
    eagerly, no GradientTape is recording, where recording would only cost time (most of an eager op's)."""
    if _executing_eagerly() and not _tape_may_record():
        return body(*xs)[0]
    return tf.custom_gradient(body)(*xs)


def _normalize_name(name):
    """A tensor's graph name as an op name: ':' and '/' are not kept (as Horovod's names)."""
    return re.sub("[^a-zA-Z0-9_]", "_", name)


def _graph_name(name, tensor, ignore_name_scope=False):
    """The op's name inside a graph: the given one (under the current name scope unless
    ignore_name_scope), or one made from the input tensor's name, fixed when the graph is traced."""
    if name is None:
        return _normalize_name(tensor.name)
    if ignore_name_scope:
        return name
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    return f"{scope}/{name}" if scope else name


_build_order = threading.local()  # .chain: the last node of the call being built, while one is (see below)


def _nodes_in_build_order(fn):
    """Decorates a call that builds several graph nodes (an IndexedSlices' values and indices, a
    group's dense and sparse parts): in a Session graph, each node waits for the one built before it,
    so every rank runs them in the same order (tf.function orders them itself). Nested calls join the
    outer one's order."""
    @functools.wraps(fn)
    def ordered(*args, **kwargs):
        if hasattr(_build_order, "chain"):
            return fn(*args, **kwargs)
        _build_order.chain = None
        try:
            return fn(*args, **kwargs)
        finally:
            del _build_order.chain
    return ordered


def _after_previous_node():
    """Control dependencies that keep this call's nodes in build order (see _nodes_in_build_order)."""
    previous = getattr(_build_order, "chain", None)
    return tf.control_dependencies([previous] if previous is not None and not tf.inside_function() else [])


def _in_xla_context():
    """Whether the graph being built is compiled by XLA, which has no kernel for tf.numpy_function."""
    try:
        from tensorflow.python.ops import control_flow_util
        return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except Exception:  # noqa: BLE001 — a TensorFlow without this internal: let XLA say it
        return False


def _to_numpy(t):
    return t.numpy() if hasattr(t, "numpy") else np.asarray(t)


def _run(fn, tensors, out_dtypes, out_shapes):
    """Runs fn(*numpy arrays) -> list of numpy arrays: at once when eager, as one graph node otherwise.
    Returns a list of tensors of `out_dtypes` with the static shapes `out_shapes`."""
    if not tensors and not out_dtypes:
        return []
    if _executing_eagerly():
        with _tf_errors():
            outs = fn(*[_to_numpy(t) for t in tensors])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outs, out_dtypes)]

    if _in_xla_context():
        raise RuntimeError("ddl's collectives cannot run inside an XLA-compiled function (tf.function(jit_compile="
                           "True), or a Keras step compiled with jit_compile=True): they are host calls XLA cannot "
                           "compile; call them outside it, or drop jit_compile")
    hint = "" if tf.inside_function() else _SESSION_GRAPH_HINT

    def body(*arrays):
        with _tf_errors(hint):
            return [np.asarray(o, dtype=d.as_numpy_dtype) for o, d in zip(fn(*arrays), out_dtypes)]

    with _after_previous_node():
        outs = tf.numpy_function(body, list(tensors), list(out_dtypes), stateful=True)
    if not isinstance(outs, (list, tuple)):
        outs = [outs]
    if hasattr(_build_order, "chain") and outs:
        _build_order.chain = outs[0].op
    for o, shape in zip(outs, out_shapes):
        o.set_shape(shape)
    return list(outs)


def _check_dtype(tensor, moves_only=False):
    if moves_only and (tensor.dtype == tf.bool or tensor.dtype.is_integer):  # moved as bytes (host_ops.movable)
        return
    if tensor.dtype.name not in H._DTYPES:
        raise _dtypes.unsupported(tensor.dtype.name)


def _process_set(process_set):
    """The checked set of an op (host_ops.target); a rank outside it gets InvalidArgument, as
    Horovod's kernels answer "not a member of the provided process set"."""
    try:
        return H.target(process_set)
    except ValueError as e:
        if isinstance(process_set, ProcessSet) and process_set.process_set_id is not None and process_set.included() is False:
            raise InvalidArgument(str(e)) from None
        raise


def _prepare(tensors, name, process_set, ignore_name_scope, moves_only=False):
    """(process set, tensors, op name) of a collective on `tensors`: checked, converted to tensors,
    and the name fixed now when a graph is being traced."""
    ps = _process_set(process_set)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if not _executing_eagerly():  # a graph is refused as it is built; an eager op's checks are host_ops'
        for t in tensors:         # own, where the op still takes its place on every rank (op_core.Call)
            _check_dtype(t, moves_only)
    if not tensors:
        return ps, tensors, None
    return ps, tensors, name if _executing_eagerly() else _graph_name(name, tensors[0], ignore_name_scope)


# ---- allreduce ----

def _allreduce_group(tensors, name, op, prescale, postscale, process_set, grouped, ignore_name_scope=False):
    """Allreduces `tensors` in one libddl call (fused); differentiable. Returns a list of tensors."""
    ps, tensors, op_name = _prepare(tensors, name, process_set, ignore_name_scope)
    if not tensors:
        return []
    kind = "grouped_allreduce" if grouped else "allreduce"

    def forward(*xs):
        def host(*arrays):
            if not grouped:  # libddl's blocking fast path, on this thread
                return [H.allreduce(arrays[0], op_name, op, prescale, postscale, ps)]
            return H.grouped_allreduce(arrays, op_name, op, prescale, postscale, ps, kind=kind)

        ys = _run(host, xs, [x.dtype for x in xs], [x.shape for x in xs])

        def grad(*dys):
            if op not in (Average, Sum):
                raise NotImplementedError("the gradient of an allreduce exists for hvd.Average and hvd.Sum only")
            dys = [tf.zeros_like(x) if dy is None else dy for dy, x in zip(dys, xs)]
            return _allreduce_group(dys, None, op, prescale, postscale, ps, grouped)
        return ys, grad

    return list(_with_gradient(forward, *tensors))


def _refuse_scaled_slices(prescale, postscale):
    """Horovod's allreduce refuses prescale/postscale factors with tf.IndexedSlices."""
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("prescale_factor and postscale_factor are not supported with tf.IndexedSlices")


@_nodes_in_build_order
def _allreduce_sparse(slices, op, process_set, ignore_name_scope, prescale=1.0, postscale=1.0):
    """An IndexedSlices allreduce as Horovod does it: allgather the values and the indices (averaged
    values divided by the set's size). prescale/postscale here serve DistributedGradientTape's
    gradient_predivide_factor, whose sparse gradients must still come out averaged."""
    if op not in (Average, Sum):
        raise NotImplementedError("an allreduce of tf.IndexedSlices supports hvd.Average and hvd.Sum only")
    values = slices.values
    if prescale != 1.0:
        values = values * tf.cast(prescale, values.dtype)
    values = allgather(values, process_set=process_set, ignore_name_scope=ignore_name_scope)
    if postscale != 1.0:
        values = values * tf.cast(postscale, values.dtype)
    indices = allgather(slices.indices, process_set=process_set, ignore_name_scope=ignore_name_scope)
    if op == Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduces `tensor` over the process set and returns the result (default op: Average).
    tf.IndexedSlices are allgathered instead, as Horovod does.

    Eagerly the op runs at once; in a graph it is one node, which runs when the graph does.
    Differentiable: the gradient is an allreduce of the incoming gradient with the same op and factors
    (Average and Sum only: another op's gradient raises NotImplementedError).

    Arguments:
        tensor: a tensor (or a value tf.convert_to_tensor takes) of uint8, int8, int16, int32, int64,
            float16, bfloat16, float32 or float64; or a tf.IndexedSlices, whose values and indices are
            allgathered (the values divided by the set's size for Average).
        average: deprecated; True is op=Average, False op=Sum (not together with op).
        device_dense, device_sparse: accepted for Horovod's signature; not used.
        compression: Compression.none (what None means) or Compression.fp16: `tensor` is compressed
            before the reduction and the result decompressed after it (not used for tf.IndexedSlices).
        op: Average (the default), Sum, Min, Max or Product (Adasum: NotImplementedError); a
            tf.IndexedSlices takes Average or Sum only (NotImplementedError).
        prescale_factor, postscale_factor: each rank's input is multiplied by the first before the
            reduction, the result by the second after it; with a tf.IndexedSlices both must be 1.0
            (NotImplementedError).
        name: the op's name, which every rank must give alike; ranks may then submit named ops in
            any order. In a graph it is put under the current name scope (unless ignore_name_scope),
            and None names the op after its input tensor when the graph is traced; eagerly None is the
            next unnamed op, which ranks must submit in the same order. Not used for tf.IndexedSlices.
        process_set: the ProcessSet to reduce over (every rank of it must call this).
        ignore_name_scope: True: in a graph, `name` is used as given, without the current name scope.

    Returns:
        a tensor of `tensor`'s shape and dtype holding the reduction; for a tf.IndexedSlices, a
        tf.IndexedSlices of every rank's values and indices, in rank order, with its dense_shape.

    Raises:
        ValueError before init() and for an argument no rank could run (a dtype, a process set, an op,
        op together with average); NotImplementedError as said above; RuntimeError inside an
        XLA-compiled function (tf.function(jit_compile=True)). When the op runs:
        tf.errors.FailedPreconditionError when ranks disagree on it (shape, dtype, reduction),
        InvalidArgument (a tf.errors.InvalidArgumentError and a ValueError) for a bad argument found
        then (a name already in flight on this rank), HorovodInternalError (a tf.errors.UnknownError)
        when a rank times out or fails.
    """
    from ddl.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = H.reduce_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        _refuse_scaled_slices(prescale_factor, postscale_factor)
        return _allreduce_sparse(tensor, op, _process_set(process_set), ignore_name_scope)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    reduced = _allreduce_group([compressed], name, op, prescale_factor, postscale_factor, process_set, False,
                               ignore_name_scope)[0]
    return compression.decompress(reduced, ctx)


@_nodes_in_build_order
def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Reduces every tensor of `tensors` over the process set: the dense ones in one libddl round
    (submitted together, fused where libddl can), tf.IndexedSlices allgathered as allreduce does.

    Differentiable as allreduce.

    Arguments: as allreduce, with `tensors` a list of tensors (or tensor-compatible values) and
    tf.IndexedSlices; a named group names its dense parts NAME.0, NAME.1, ..., and ranks must give
    groups of the same size. Unnamed in a graph, the group is named after the first dense tensor it
    reduces.

    Returns:
        the list of results, in the order of `tensors`.

    Raises: as allreduce.
    """
    from ddl.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = H.reduce_op(op, average)
    ps = _process_set(process_set)
    tensors = list(tensors)
    dense_at = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    pairs = [compression.compress(tf.convert_to_tensor(tensors[i])) for i in dense_at]
    reduced = _allreduce_group([p[0] for p in pairs], name, op, prescale_factor, postscale_factor, ps, True,
                               ignore_name_scope)
    out = list(tensors)
    for i, r, p in zip(dense_at, reduced, pairs):
        out[i] = compression.decompress(r, p[1])
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            _refuse_scaled_slices(prescale_factor, postscale_factor)
            out[i] = _allreduce_sparse(t, op, ps, ignore_name_scope)
    return out


# ---- allgather ----

def _allgather_group(tensors, name, process_set, grouped, ignore_name_scope=False):
    ps, tensors, op_name = _prepare(tensors, name, process_set, ignore_name_scope, moves_only=True)
    if not tensors:
        return []
    kind = "grouped_allgather" if grouped else "allgather"

    def forward(*xs):
        def host(*arrays):
            return H.grouped_allgather(arrays, op_name, ps, kind=kind)

        shapes = [tf.TensorShape(None) if x.shape.rank is None else  # a rank unknown when traced stays unknown
                  tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else tf.TensorShape([None]) for x in xs]
        ys = _run(host, xs, [x.dtype for x in xs], shapes)

        def grad(*dys):
            # Horovod: average every rank's gradient, then keep this rank's rows.
            dys = [tf.zeros_like(y) if dy is None else dy for dy, y in zip(dys, ys)]
            summed = _allreduce_group(dys, None, Average, 1.0, 1.0, ps, True)
            first_dims = _allgather_group([tf.reshape(tf.constant(1, tf.int64) if x.shape.rank == 0 else
                                                      tf.shape(x, out_type=tf.int64)[0], [1]) for x in xs],
                                          None, ps, True)
            me = ps.rank()
            out = []
            for x, s, dims in zip(xs, summed, first_dims):
                start = tf.reduce_sum(dims[:me])
                piece = tf.slice(s, tf.concat([[start], tf.zeros([tf.rank(s) - 1], tf.int64)], 0),
                                 tf.concat([dims[me:me + 1], tf.fill([tf.rank(s) - 1], tf.constant(-1, tf.int64))], 0))
                out.append(tf.reshape(piece, tf.shape(x)))
            return out
        return ys, grad

    return list(_with_gradient(forward, *tensors))


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Gathers every rank's `tensor` along the first dimension and returns the concatenation.

    Eagerly the op runs at once; in a graph it is one node. Differentiable: the gradient is the
    incoming gradient averaged over the set, of which this rank keeps its own rows.

    Arguments:
        tensor: a tensor (or a tensor-compatible value) of a dtype allreduce takes, or of any boolean
            or integer type (moved as its bytes); its first dimension may differ by rank, every other
            must agree (a 0-d tensor counts as one row).
        name, ignore_name_scope, process_set: as allreduce.

    Returns:
        a tensor of the ranks' rows in rank order, of `tensor`'s dtype (its static first dimension is
        unknown).

    Raises:
        ValueError before init() and for a dtype or process set no rank could run; RuntimeError inside
        an XLA-compiled function. When the op runs: tf.errors.FailedPreconditionError when ranks
        disagree on the trailing shape or dtype, otherwise as allreduce.
    """
    return _allgather_group([tensor], name, process_set, False, ignore_name_scope)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Gathers every tensor of `tensors` as allgather does, all of them submitted to libddl at once.

    Arguments: as allgather, with `tensors` a list of tensors; a named group names its parts NAME.0,
    NAME.1, ..., and ranks must give groups of the same size. Unnamed in a graph, the group is named
    after its first tensor.

    Returns:
        the list of gathered tensors, in the order of `tensors` (an empty list for no tensors).

    Raises: as allgather.
    """
    return _allgather_group(list(tensors), name, process_set, True, ignore_name_scope)


# ---- broadcast ----

def _broadcast_group(tensors, root_rank, name, process_set, ignore_name_scope=False):
    ps, tensors, op_name = _prepare(tensors, name, process_set, ignore_name_scope, moves_only=True)
    if not _executing_eagerly():  # eagerly host_ops' check (as _prepare's)
        H.root_in_set(root_rank, ps)
    if not tensors:
        return []

    def forward(*xs):
        def host(*arrays):
            return H.grouped_broadcast(arrays, root_rank, op_name, ps)

        ys = _run(host, xs, [x.dtype for x in xs], [x.shape for x in xs])

        def grad(*dys):
            # Horovod: the root gets the average of every rank's gradient, the others zeros.
            dys = [tf.zeros_like(x) if dy is None else dy for dy, x in zip(dys, xs)]
            summed = _allreduce_group(dys, None, Average, 1.0, 1.0, ps, True)
            # The same ops on every rank (a multiply by 1 or 0), so that the graph's later tensor names,
            # from which op names are made, stay equal across ranks.
            keep = 1 if _basics.world_rank() == root_rank else 0
            return [s * tf.cast(keep, s.dtype) for s in summed]
        return ys, grad

    return list(_with_gradient(forward, *tensors))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's `tensor` on every rank of the process set.

    Eagerly the op runs at once; in a graph it is one node. Differentiable: on the root the gradient
    is the incoming gradient averaged over the set, on every other rank zeros.

    Arguments:
        tensor: the data on the root; on the other ranks a tensor of the same shape and dtype (a dtype
            allgather takes).
        root_rank: the world rank whose tensor every rank gets (it must be in the process set).
        name, ignore_name_scope, process_set: as allreduce.

    Returns:
        a new tensor of `tensor`'s shape and dtype holding the root's values.

    Raises:
        ValueError before init(), for a root_rank that is not an int or not in the set, and for a dtype
        or process set no rank could run; RuntimeError inside an XLA-compiled function. When the op
        runs: tf.errors.FailedPreconditionError when ranks disagree on shape, dtype or root, otherwise
        as allreduce.
    """
    return _broadcast_group([tensor], root_rank, name, process_set, ignore_name_scope)[0]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Broadcasts root_rank's values into `variables` in place, all of them in one libddl round.

    Arguments:
        variables: one tf.Variable (or another object with assign()), or a list of them; what each
            one's read_value() gives (the object itself where it has none) is what is sent.
        root_rank: the world rank whose values every rank gets (it must be in the process set).
        name, process_set: as broadcast (in a graph the name is under the current name scope).

    Returns:
        what assign() returns for the variable, or the list of them, in order.

    Raises: as broadcast.
    """
    one = isinstance(variables, tf.Variable) or hasattr(variables, "assign")
    variables = [variables] if one else list(variables)
    values = _broadcast_group([v.read_value() if hasattr(v, "read_value") else v for v in variables], root_rank,
                              name, process_set)
    assigned = [v.assign(x) for v, x in zip(variables, values)]
    return assigned[0] if one else assigned


# ---- alltoall ----

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Sends splits[j] rows of `tensor` to rank j of the process set (equal blocks when splits is
    None) and returns the rows every rank sent this one.

    Eagerly the op runs at once; in a graph it is one node. Differentiable: the gradient goes back
    the way the rows came (an alltoall with the received splits).

    Arguments:
        tensor: at least one dimension, of a dtype allgather takes; the rows (first dimension) are
            what is split.
        splits: how many rows go to each rank (a list or tensor of the set's size, cast to int32,
            non-negative and summing to at most the first dimension); None: equal blocks (the first
            dimension must then be a multiple of the set's size).
        name, ignore_name_scope, process_set: as allreduce.

    Returns:
        the received rows, in rank order, of `tensor`'s dtype; with `splits` given, the pair
        (rows, received_splits), received_splits an int32 tensor of how many rows came from each rank,
        as Horovod's TensorFlow alltoall.

    Raises:
        ValueError before init() and for a dtype or process set no rank could run; RuntimeError inside
        an XLA-compiled function. When the op runs: InvalidArgument for a 0-d tensor or splits that do
        not fit its rows, otherwise as allreduce.
    """
    ps, (tensor,), op_name = _prepare([tensor], name, process_set, ignore_name_scope, moves_only=True)
    split_tensor = tf.zeros([0], tf.int32) if splits is None else tf.convert_to_tensor(splits)
    if not split_tensor.dtype.is_integer:  # a cast would truncate 1.5 to 1 without a word; Horovod refuses it too
        error = TypeError(f"alltoall: splits must be integers, not {split_tensor.dtype.name}")
        if _executing_eagerly():  # raised once the op took its place on every rank (op_core.Call)
            H.take_places_failing("alltoall", op_name, ps, error)
        raise error
    split_tensor = tf.cast(split_tensor, tf.int32)
    given = splits is not None

    def forward(x, s):
        def host(array, split_array):
            out, received = H.alltoall(array, split_array if given else None, op_name, ps)
            return [out, received]

        shape = tf.TensorShape([None]).concatenate(x.shape[1:]) if x.shape.rank else tf.TensorShape(None)
        out, received = _run(host, [x, s], [x.dtype, tf.int32], [shape, tf.TensorShape([ps.size()])])

        def grad(dy, _d_received=None):
            # Horovod: the gradient goes back the way the rows came.
            dy = tf.zeros_like(out) if dy is None else dy
            back, _ = alltoall(dy, splits=received, process_set=ps)  # splits given: (rows, splits)
            # Rows past the splits' sum were not sent: their gradient is zero.
            unsent = tf.shape(x)[0] - tf.shape(back)[0]
            back = tf.concat([back, tf.zeros(tf.concat([[unsent], tf.shape(back)[1:]], 0), back.dtype)], 0)
            return tf.reshape(back, tf.shape(x)), None
        return (out, received), grad

    out, received = _with_gradient(forward, tensor, split_tensor)
    return (out, received) if given else out


# ---- reducescatter ----

def _reducescatter_group(tensors, name, op, prescale, postscale, process_set, grouped, ignore_name_scope=False):
    H.reducescatter_op(op)
    ps, tensors, op_name = _prepare(tensors, name, process_set, ignore_name_scope)
    for t in tensors:
        if t.shape.rank == 0 and not _executing_eagerly():  # eagerly host_ops' check (as _prepare's)
            raise ValueError("reducescatter needs a tensor of at least one dimension, not a scalar")
    if not tensors:
        return []
    kind = "grouped_reducescatter" if grouped else "reducescatter"
    n, me = ps.size(), ps.rank()

    def rows_of(x):
        if x.shape.rank and x.shape[0] is not None:
            return H.scatter_rows(x.shape[0], n)[me]
        return None

    def forward(*xs):
        def host(*arrays):
            return H.grouped_reducescatter(arrays, op_name, op, prescale, postscale, ps, kind=kind)

        shapes = [tf.TensorShape([rows_of(x)]).concatenate(x.shape[1:]) for x in xs]
        ys = _run(host, xs, [x.dtype for x in xs], shapes)

        def grad(*dys):
            # Horovod: gather every rank's piece of the gradient, a sum's multiplied by the set's size,
            # and by the scale factors.
            dys = [tf.zeros_like(y) if dy is None else dy for dy, y in zip(dys, ys)]
            scale = prescale * postscale * (n if op == Sum else 1)
            dys = [dy * tf.cast(scale, dy.dtype) if scale != 1.0 else dy for dy in dys]
            return _allgather_group(dys, None, ps, True)
        return ys, grad

    return list(_with_gradient(forward, *tensors))


def reducescatter(tensor, device_dense="", compression=None, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces `tensor` over the set and gives this rank its rows of the first dimension: rank r gets
    rows [offset_r, offset_r + n_r), the first (rows % size) ranks one more row than the others.

    Eagerly the op runs at once; in a graph it is one node. Differentiable: the gradient is every
    rank's incoming gradient gathered (an allgather), multiplied by the set's size for Sum and by
    both scale factors.

    Arguments:
        tensor: at least one dimension, of a dtype allreduce takes, of the same shape and dtype on
            every rank.
        device_dense: accepted for Horovod's signature; not used.
        compression: as allreduce.
        op: Average (the default) or Sum, as Horovod's; Adasum is a NotImplementedError, any other op
            a ValueError.
        name, process_set, ignore_name_scope, prescale_factor, postscale_factor: as allreduce.

    Returns:
        a tensor of this rank's rows of the reduction (its other dimensions as `tensor`'s).

    Raises:
        ValueError before init(), for a 0-d tensor and for a dtype, op or process set no rank could
        run; NotImplementedError for Adasum; RuntimeError inside an XLA-compiled function; when the op
        runs, as allreduce.
    """
    from ddl.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = H.reduce_op(op, None)
    compressed, ctx = compression.compress(tf.convert_to_tensor(tensor))
    out = _reducescatter_group([compressed], name, op, prescale_factor, postscale_factor, process_set, False,
                               ignore_name_scope)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=None, op=Average, process_set=global_process_set,
                          prescale_factor=1.0, postscale_factor=1.0, *, name=None, ignore_name_scope=False):
    """Reduces and scatters every tensor of `tensors` as reducescatter does, all of them submitted to
    libddl at once.

    Arguments: as reducescatter, in the order of Horovod's grouped_reducescatter (process_set fifth;
    name and ignore_name_scope, which Horovod's has not, by keyword only), with `tensors` a list of
    tensors; a named group names its parts NAME.0, NAME.1, ..., and ranks must give groups of the
    same size.

    Returns:
        the list of this rank's shares, in the order of `tensors`.

    Raises: as reducescatter.
    """
    from ddl.tensorflow.compression import Compression
    compression = compression or Compression.none
    op = H.reduce_op(op, None)
    pairs = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _reducescatter_group([p[0] for p in pairs], name, op, prescale_factor, postscale_factor, process_set,
                                True, ignore_name_scope)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# ---- join, barrier, topology ops ----

def _host_call(fn, out_dtype, shape):
    """A collective without tensor inputs (join, barrier): at once when eager, a graph node otherwise."""
    if _executing_eagerly():
        with _tf_errors():
            return tf.constant(fn(), dtype=out_dtype)
    out = tf.numpy_function(lambda: _tf_call_value(fn, out_dtype), [], out_dtype, stateful=True)
    out.set_shape(shape)
    return out


def _tf_call_value(fn, out_dtype):
    with _tf_errors():
        return np.asarray(fn(), dtype=out_dtype.as_numpy_dtype)


def join():
    """Waits until every rank joined (meanwhile adding zeros to the others' allreduces); returns the
    last rank to join, as an int32 tensor.

    Eagerly it runs at once; in a graph it is one node, which runs when the graph does.

    Returns:
        a scalar int32 tensor: the last rank to join.

    Raises:
        ValueError before init(); when it runs, libddl's failures as the tf.errors allreduce names.
    """
    _basics.require("rank")
    return _host_call(_basics.join, tf.int32, [])


def barrier(process_set=global_process_set):
    """Returns when every rank of the process set has called it.

    Arguments:
        process_set: the ProcessSet whose ranks wait for each other (every rank of it must call this).

    Returns:
        None eagerly, once every rank has called it; in a graph, a scalar int32 tensor (0) whose
        evaluation waits for them.

    Raises:
        ValueError before init() and for a process set this rank cannot use; when it runs, libddl's
        failures as the tf.errors allreduce names.
    """
    ps = _process_set(process_set)
    if _executing_eagerly():
        with _tf_errors():
            H.barrier(ps)
        return None
    return _host_call(lambda: (H.barrier(ps), 0)[1], tf.int32, [])


def size_op(process_set_id=0, name=None):
    """The size of the process set as an int32 tensor (a constant: ddl's worlds are fixed).

    Arguments:
        process_set_id: the id of an added process set; 0 (the default) is the world's.
        name: the name of the constant.

    Returns:
        a scalar int32 tf.constant.

    Raises:
        ValueError before init() and for an id that names no added process set.
    """
    return tf.constant(_set_by_id(process_set_id).size(), dtype=tf.int32, name=name)


def local_size_op(name=None):
    """The number of ranks on this process's node as an int32 tensor (a constant).

    Arguments:
        name: the name of the constant.

    Returns:
        a scalar int32 tf.constant.

    Raises:
        ValueError before init().
    """
    return tf.constant(_basics.local_size(), dtype=tf.int32, name=name)


def rank_op(name=None):
    """This process's rank in the world as an int32 tensor (a constant).

    Arguments:
        name: the name of the constant.

    Returns:
        a scalar int32 tf.constant.

    Raises:
        ValueError before init().
    """
    return tf.constant(_basics.rank(), dtype=tf.int32, name=name)


def local_rank_op(name=None):
    """This process's rank among the ranks on its node as an int32 tensor (a constant).

    Arguments:
        name: the name of the constant.

    Returns:
        a scalar int32 tf.constant.

    Raises:
        ValueError before init().
    """
    return tf.constant(_basics.local_rank(), dtype=tf.int32, name=name)


def process_set_included_op(process_set_id=0, name=None):
    """Whether this rank is in a process set, as an int32 tensor (a constant): 1 if it is, else 0.

    Arguments:
        process_set_id, name: as size_op.

    Returns:
        a scalar int32 tf.constant, 1 or 0 (always 1 for the world's set).

    Raises:
        ValueError before init() and for an id that names no added process set.
    """
    return tf.constant(1 if _set_by_id(process_set_id).included() else 0, dtype=tf.int32, name=name)


def _set_by_id(process_set_id):
    from ddl.common.process_sets import _registry
    _basics.check_initialized()
    if process_set_id == 0:
        return global_process_set
    try:
        return _registry[process_set_id]
    except KeyError:
        raise ValueError(f"no process set with id {process_set_id} was added") from None
