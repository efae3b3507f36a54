"""Variable and object broadcasts, as horovod.tensorflow.functions."""

import pickle

import numpy as np
import tensorflow as tf

from ddl.common import basics as _basics
from ddl.common import host_ops as H
from ddl.common import objects
from ddl.common.process_sets import global_process_set
from ddl.tensorflow import mpi_ops as ops


def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assigns root_rank's values to `variables` on every rank, all of them in one libddl round.
    Eagerly it returns None; inside a graph, the op that does it.

    Eagerly the broadcast is an unnamed op; in a graph it is named "broadcast_variables" (under the
    current name scope).

    Arguments:
        variables: an iterable of tf.Variables (None entries are skipped).
        root_rank: the world rank whose values every rank gets (it must be in the process set).
        process_set: the ProcessSet to broadcast over (every rank of it must call this).
        inplace: accepted for Horovod's signature; not used.

    Returns:
        None eagerly; in a graph, a tf.group of the assignments (tf.no_op() when there are no
        variables).

    Raises: as ddl.tensorflow.broadcast_.
    """
    variables = [v for v in variables if v is not None]
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    assigned = ops.broadcast_(variables, root_rank, name=None if tf.executing_eagerly() else "broadcast_variables",
                              process_set=process_set)
    return None if tf.executing_eagerly() else tf.group(*assigned)


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global variables; TensorFlow 2 has none to find (as Horovod says there).

    Broadcasts root_rank's values into every variable of tf.compat.v1.global_variables(), as
    broadcast_variables does.

    Arguments:
        root_rank: the world rank whose values every rank gets.

    Returns:
        the op that assigns them (as broadcast_variables returns it in a graph).

    Raises:
        RuntimeError under eager execution (TensorFlow 2's default); otherwise as broadcast_variables.
    """
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution: use "
                           "hvd.broadcast_variables(model.variables + optimizer.variables, root_rank=0), or "
                           "the Keras callback hvd.callbacks.BroadcastGlobalVariablesCallback(0)")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """root_rank's `obj` (any object cloudpickle, or else pickle, can serialize) on every rank.

    Runs at once, not as a graph node, in two broadcasts named NAME.length and NAME.data: the length
    of the root's serialized object, then its bytes, which the other ranks unpickle.

    Arguments:
        obj: the object on the root; not used on the other ranks.
        root_rank: the world rank whose object every rank gets (it must be in the process set).
        session: accepted for Horovod's signature; not used.
        name: the prefix of the broadcasts' names, which every rank must give alike; None:
            "broadcast_object".
        process_set: the ProcessSet to broadcast over (every rank of it must call this).

    Returns:
        on the root `obj` itself; on every other rank the object unpickled from the root's bytes.

    Raises:
        ValueError before init(). Where the root cannot serialize `obj`: on the root the error that
        serializing raised, on the other ranks a RuntimeError naming the root (the bytes are then not
        sent). libddl's failures as the tf.errors ddl.tensorflow.broadcast names (InvalidArgument,
        also a ValueError, for a root_rank or process set no rank could use).
    """
    name = name or "broadcast_object"  # the same on every rank, whatever each passes
    me = _basics.world_rank()
    payload, error = objects.serialized(obj, objects.dumps) if me == root_rank else (b"", None)
    with ops._tf_errors():
        length = H.broadcast(np.array([objects.length_of(payload)], np.int64), root_rank, f"{name}.length", process_set)
    objects.raise_if_not_serialized("broadcast_object", [int(length[0])], [root_rank], error)
    data = np.frombuffer(payload, np.uint8) if me == root_rank else np.zeros(int(length[0]), np.uint8)
    with ops._tf_errors():
        data = H.broadcast(data, root_rank, f"{name}.data", process_set)
    return obj if me == root_rank else pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function that broadcasts its argument from root_rank (as Horovod's).

    Arguments:
        root_rank, session, name, process_set: as broadcast_object, the same for every call.

    Returns:
        a function of one argument, obj, that returns broadcast_object(obj, root_rank, session, name,
        process_set).
    """
    return lambda obj: broadcast_object(obj, root_rank, session, name, process_set)


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """The list of every rank's `obj`, in rank order.

    Runs at once, not as a graph node, in two allgathers named NAME.lengths and NAME.data: each
    rank's serialized length, then every rank's bytes, which are unpickled one by one.

    Arguments:
        obj: this rank's object (any object cloudpickle, or else pickle, can serialize).
        session: accepted for Horovod's signature; not used.
        name: the prefix of the allgathers' names, which every rank must give alike; None:
            "allgather_object".
        process_set: the ProcessSet to gather over (every rank of it must call this).

    Returns:
        a list of the set's ranks' objects, in rank order, each unpickled from the bytes its rank
        sent (this rank's own too).

    Raises:
        Where a rank cannot serialize its `obj`: on that rank the error that serializing raised, on
        the others a RuntimeError naming the ranks that could not (the bytes are then not sent).
        libddl's failures as the tf.errors ddl.tensorflow.allgather names (InvalidArgument, also a
        ValueError, before init() and for a process set no rank could use).
    """
    name = name or "allgather_object"
    payload, error = objects.serialized(obj, objects.dumps)
    with ops._tf_errors():
        lengths = H.allgather(np.array([objects.length_of(payload)], np.int64), f"{name}.lengths", process_set).tolist()
    objects.raise_if_not_serialized("allgather_object", lengths, process_set.ranks, error)
    with ops._tf_errors():
        gathered = H.allgather(np.frombuffer(payload, np.uint8), f"{name}.data", process_set)
    out, offset = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[offset:offset + n].tobytes()))
        offset += n
    return out
