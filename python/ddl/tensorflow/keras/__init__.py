"""ddl.tensorflow.keras (also `ddl.keras`): Horovod's Keras API over libddl.

    import ddl.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()],
              verbose=1 if hvd.rank() == 0 else 0)

Works with Keras 2 (TensorFlow 2.15, or tf-keras) and Keras 3 (TensorFlow 2.16 and later).
"""

import tensorflow as tf

from ddl.common.basics import (init, shutdown, is_initialized, rank, size, local_rank, local_size,  # noqa: F401
                               cross_rank, cross_size, is_homogeneous, mpi_threads_supported, mpi_built, mpi_enabled,
                               gloo_built, gloo_enabled, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
                               start_timeline, stop_timeline)
from ddl.common.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set  # noqa: F401
from ddl.tensorflow import mpi_ops as _ops
from ddl.tensorflow.compression import Compression
from ddl.tensorflow.mpi_ops import Average, Sum, Adasum, Min, Max, Product, HorovodInternalError  # noqa: F401
from ddl.tensorflow.functions import broadcast_object, broadcast_object_fn, allgather_object  # noqa: F401
from ddl.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
from ddl.tensorflow.keras import _optimizer
from ddl.tensorflow.keras import callbacks  # noqa: F401


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Wraps a Keras optimizer so that its gradients are allreduced (one libddl group per step) before
    they are applied. Its class keeps the optimizer's name, so saved models name the same optimizer."""
    if not _optimizer.is_keras_optimizer(optimizer):
        raise ValueError(f"DistributedOptimizer takes a Keras optimizer (tf.keras.optimizers.*), not "
                         f"{type(optimizer).__module__}.{type(optimizer).__name__}")
    return _optimizer.create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op, gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
        scale_local_gradients=scale_local_gradients)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                                sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                                average_aggregated_gradients=False, groups=None, process_set=global_process_set,
                                local_layers=None, scale_local_gradients=True):
    """DistributedOptimizer whose `local_layers` keep their own gradients (not reduced; divided by the
    set's size with scale_local_gradients), as Horovod's, for layers each rank trains alone."""
    from ddl.tensorflow import _trainable_weights_of
    local_weights = _trainable_weights_of(local_layers)
    wrapped = DistributedOptimizer(optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
                                   gradient_predivide_factor=gradient_predivide_factor, op=op,
                                   backward_passes_per_step=backward_passes_per_step,
                                   average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                                   process_set=process_set, scale_local_gradients=scale_local_gradients)
    for weight in local_weights:
        wrapped.register_local_var(weight)
    return wrapped


def broadcast_global_variables(root_rank):
    """Keras 2 in TensorFlow 1 style graphs broadcast every global variable; TensorFlow 2 has no such
    collection: use the BroadcastGlobalVariablesCallback with model.fit, or hvd.broadcast_variables."""
    from ddl.tensorflow.functions import broadcast_global_variables as tf_broadcast
    return tf_broadcast(root_rank)


def _value(tensor):
    """Eagerly the tensor itself, as Horovod's Keras functions return it; in a TensorFlow 1 style graph
    its value."""
    if tf.executing_eagerly() or tf.inside_function():  # inside tf.function: the graph's tensor
        return tensor
    return tf.compat.v1.keras.backend.get_session().run(tensor)


def allreduce(value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None,
              compression=Compression.none):
    """The reduction of a tensor-compatible value over every rank (default: the average).

    Arguments:
        value: a tensor, or a value tf.convert_to_tensor takes, of a dtype ddl.tensorflow.allreduce
            takes.
        name: the op's name, as ddl.tensorflow.allreduce.
        average: deprecated; True is the average, False the sum (not together with op). With neither
            average nor op given, the average.
        prescale_factor, postscale_factor, op, compression: as ddl.tensorflow.allreduce.

    Returns:
        eagerly or inside a tf.function, the reduced tensor; in a TensorFlow 1 style graph, its value,
        evaluated in the Keras backend's session.

    Raises: as ddl.tensorflow.allreduce.
    """
    if average is None and op is None:
        average = True
    return _value(_ops.allreduce(tf.convert_to_tensor(value), average=average, op=op, prescale_factor=prescale_factor,
                                 postscale_factor=postscale_factor, compression=compression, name=name))


def allgather(value, name=None):
    """Every rank's value concatenated along the first dimension.

    Arguments:
        value: a tensor, or a value tf.convert_to_tensor takes, as ddl.tensorflow.allgather takes it
            (its first dimension may differ by rank).
        name: the op's name, as ddl.tensorflow.allgather.

    Returns:
        eagerly or inside a tf.function, the gathered tensor; in a TensorFlow 1 style graph, its value,
        evaluated in the Keras backend's session.

    Raises: as ddl.tensorflow.allgather.
    """
    return _value(_ops.allgather(tf.convert_to_tensor(value), name=name))


def broadcast(value, root_rank, name=None):
    """root_rank's value on every rank.

    Arguments:
        value: a tensor, or a value tf.convert_to_tensor takes: the data on the root, a value of the
            same shape and dtype on the other ranks.
        root_rank: the world rank whose value every rank gets.
        name: the op's name, as ddl.tensorflow.broadcast.

    Returns:
        eagerly or inside a tf.function, the root's tensor; in a TensorFlow 1 style graph, its value,
        evaluated in the Keras backend's session.

    Raises: as ddl.tensorflow.broadcast.
    """
    return _value(_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name))


def reducescatter(value, name=None, op=Average):
    """This rank's rows of the reduction of a value over every rank.

    Arguments:
        value: a tensor, or a value tf.convert_to_tensor takes, of at least one dimension, as
            ddl.tensorflow.reducescatter takes it.
        name: the op's name, as ddl.tensorflow.reducescatter.
        op: Average (the default) or Sum, as ddl.tensorflow.reducescatter.

    Returns:
        eagerly or inside a tf.function, this rank's rows; in a TensorFlow 1 style graph, their value,
        evaluated in the Keras backend's session.

    Raises: as ddl.tensorflow.reducescatter.
    """
    return _value(_ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op))


def broadcast_variables(variables, root_rank, process_set=global_process_set):
    """Assigns root_rank's values to `variables` on every rank, all of them in one libddl round, as
    ddl.tensorflow.broadcast_variables does.

    Arguments:
        variables: an iterable of variables (None entries are skipped).
        root_rank: the world rank whose values every rank gets (it must be in the process set).
        process_set: the ProcessSet to broadcast over (every rank of it must call this).

    Returns:
        None eagerly; in a graph, the op that does it.

    Raises: as ddl.tensorflow.broadcast_variables.
    """
    from ddl.tensorflow.functions import broadcast_variables as tf_broadcast_variables
    return tf_broadcast_variables(variables, root_rank, process_set)


class _RewrapOnLoad:
    """Stands for an optimizer class while a model loads: what Keras builds from the saved config
    comes back wrapped by DistributedOptimizer."""

    def __init__(self, optimizer_class, compression):
        self.optimizer_class = optimizer_class
        self.compression = compression
        self.__name__ = optimizer_class.__name__

    def from_config(self, config, custom_objects=None):
        return DistributedOptimizer(self.optimizer_class.from_config(config), compression=self.compression)

    def __call__(self, *args, **kwargs):
        return DistributedOptimizer(self.optimizer_class(*args, **kwargs), compression=self.compression)


def _optimizer_classes():
    seen, todo = [], list(_optimizer._keras_optimizer_bases())
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in seen if not getattr(c, "_ddl_distributed", False) and not c.__name__.startswith("_")]


def load_model(filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none,
               legacy_opts=False):
    """Loads a saved Keras model; its optimizer comes back wrapped by DistributedOptimizer (so a model
    saved from a wrapped optimizer trains on distributed again)."""
    objects = {"SyncBatchNormalization": SyncBatchNormalization}
    # Keras 2 has a legacy class of each name too: the current ones come last and win.
    classes = sorted(_optimizer_classes(), key=lambda c: ".legacy" not in c.__module__)
    for cls in classes + list(custom_optimizers or []):
        if cls.__module__.startswith(("keras", "tf_keras", "tensorflow")) or cls in (custom_optimizers or []):
            rewrap = _RewrapOnLoad(cls, compression)
            objects[cls.__name__] = rewrap
            objects[cls.__name__.lower()] = rewrap
    objects.update(custom_objects or {})
    return tf.keras.models.load_model(filepath, custom_objects=objects)


def _keep_keras3_fit_off_xla():
    """Keras 3 compiles model.fit's step with XLA when jit_compile is "auto" and a GPU is present; ddl's
    collectives are host calls XLA cannot compile, so a model whose optimizer is distributed resolves
    "auto" to False (an explicit jit_compile=True gets a clear error when the step is traced)."""
    try:
        from keras.src.trainers import trainer as keras_trainer
    except ImportError:
        return
    resolve = keras_trainer.Trainer._resolve_auto_jit_compile
    if getattr(resolve, "_ddl", False):
        return

    def resolve_auto_jit_compile(self):
        if getattr(getattr(self, "optimizer", None), "_ddl_distributed", False):
            return False
        return resolve(self)
    resolve_auto_jit_compile._ddl = True
    keras_trainer.Trainer._resolve_auto_jit_compile = resolve_auto_jit_compile


_keep_keras3_fit_off_xla()
