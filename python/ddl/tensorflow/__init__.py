"""ddl.tensorflow: Horovod's TensorFlow 2 API over libddl.

    import ddl.tensorflow as hvd
    hvd.init()
    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

Names, signatures, defaults and exceptions follow horovod.tensorflow 0.28, so Horovod scripts run with
one changed import, on TensorFlow 2.15 (Keras 2) and on 2.16 and later (Keras 3), where Horovod does
not run. Nothing is compiled against TensorFlow. Start the program with `ddl run` (or mpirun / srun).
"""

import os as _os

# A TensorFlow 1 graph run by a Session runs each collective as a numpy_function node that holds one
# of TensorFlow's inter-op threads while it waits for the other ranks (Horovod's compiled kernels
# give the thread back; ours are not compiled against TensorFlow). The default pool has one thread
# per core, so on a small node a graph with more independent collectives than cores could start
# different ones on different ranks, fill every thread, and wait for DDL_TIMEOUT, one stall after
# another. TensorFlow reads this variable when it makes a pool (at the first Session or eager op),
# so setting it here, unless the user chose a size, gives every pool room for 64 waiting collectives.
_os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(max(_os.cpu_count() or 1, 64)))

import tensorflow as tf  # noqa: E402

from ddl.common import basics as _basics
from ddl.common import reductions as _reductions
from ddl.common.basics import (init, shutdown, is_initialized, rank, size, local_rank, local_size,  # noqa: F401
                               cross_rank, cross_size, is_homogeneous, mpi_threads_supported, mpi_built, mpi_enabled,
                               gloo_built, gloo_enabled, nccl_built, ddl_built, ccl_built, cuda_built, rocm_built,
                               start_timeline, stop_timeline)
from ddl.common.process_sets import ProcessSet, global_process_set, add_process_set, remove_process_set  # noqa: F401
from ddl.tensorflow import mpi_ops as _mpi_ops
from ddl.tensorflow.compression import Compression
from ddl.tensorflow.mpi_ops import (Average, Sum, Adasum, Min, Max, Product, HorovodInternalError,  # noqa: F401
                                    allreduce, grouped_allreduce, allgather, grouped_allgather, broadcast, broadcast_,
                                    alltoall, reducescatter, grouped_reducescatter, join, barrier, size_op,
                                    local_size_op, rank_op, local_rank_op, process_set_included_op)
from ddl.tensorflow.functions import (broadcast_variables, broadcast_global_variables, broadcast_object,  # noqa: F401
                                      broadcast_object_fn, allgather_object)
from ddl.common.exceptions import HostsUpdatedInterrupt  # noqa: F401


def _gradient_scales(op, gradient_predivide_factor, process_set, scale_local_gradients=True):
    """(op, prescale, postscale) of a step's gradient allreduce, as Horovod computes them: with a
    predivide factor f, every gradient is divided by f before the sum and the sum multiplied by f/size."""
    if gradient_predivide_factor != 1.0:
        if op != Average:
            raise ValueError("gradient_predivide_factor not supported with op != Average")
        return Sum, 1.0 / gradient_predivide_factor, gradient_predivide_factor / process_set.size()
    return op, 1.0, 1.0


class _Identity:
    """A set key that is its object's identity (and keeps the object, so the identity stays its own)."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Identity) and other.obj is self.obj


def _ref(source):
    """What identifies a variable or tensor in a set: its `.ref()`, as Horovod keys them, where it has
    one (TensorFlow's); its identity otherwise (Keras 3 variables, which are not hashable)."""
    ref = getattr(source, "ref", None)
    return ref() if callable(ref) else _Identity(source)


def _is_variable(value):
    """A TensorFlow variable, or a Keras 3 one (which is no tf.Variable)."""
    return isinstance(value, tf.Variable) or (type(value).__module__.startswith("keras") and hasattr(value, "assign"))


def _local_gradient(grad, n):
    """A worker-local gradient as Horovod returns it with scale_local_gradients: divided by the set's
    size n (the global loss is an average over the ranks); None stays None."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values / tf.cast(n, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad / tf.cast(n, grad.dtype)


@_mpi_ops._nodes_in_build_order
def _allreduce_gradients(grads, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                         name="DistributedGradient", local=None, scale_local_gradients=True):
    """Allreduces a step's gradients in one libddl group (None gradients stay None); IndexedSlices
    become dense first with sparse_as_dense, or are allgathered otherwise. `local[i]` True: gradient i
    belongs to a worker-local variable and is not reduced (only scaled, with scale_local_gradients)."""
    if local is not None and any(local):
        grads = list(grads)
        keep = [i for i, is_local in enumerate(local) if not is_local]
        reduced = _allreduce_gradients([grads[i] for i in keep], compression, sparse_as_dense, op,
                                       gradient_predivide_factor, process_set, name)
        out = list(grads)
        for i, g in zip(keep, reduced):
            out[i] = g
        if scale_local_gradients:
            n = process_set.size()
            for i, is_local in enumerate(local):
                if is_local:
                    out[i] = _local_gradient(out[i], n)
        return out
    op, prescale, postscale = _gradient_scales(op, gradient_predivide_factor, process_set)
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    to_reduce = []
    for i in present:
        g = grads[i]
        if sparse_as_dense and isinstance(g, tf.IndexedSlices):
            g = tf.convert_to_tensor(g)
        to_reduce.append(g)
    # Dense gradients in one libddl group; IndexedSlices allgathered, scaled as the dense ones (the
    # public allreduce refuses factors with IndexedSlices, as Horovod's does).
    dense = [k for k, g in enumerate(to_reduce) if not isinstance(g, tf.IndexedSlices)]
    reduced = grouped_allreduce([to_reduce[k] for k in dense], compression=compression, op=op,
                                prescale_factor=prescale, postscale_factor=postscale, process_set=process_set,
                                name=None if tf.executing_eagerly() else name)
    by_position = dict(zip(dense, reduced))
    out = list(grads)
    for k, i in enumerate(present):
        g = to_reduce[k]
        out[i] = by_position[k] if k in by_position else _mpi_ops._allreduce_sparse(
            g, op, _mpi_ops._process_set(process_set), False, prescale, postscale)
    return out


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape whose gradient() allreduces what it computed, as one group."""

    def _ddl_setup(self, compression, sparse_as_dense, op, gradient_predivide_factor, process_set,
                   scale_local_gradients):
        self._ddl = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=op,
                         gradient_predivide_factor=gradient_predivide_factor, process_set=process_set,
                         scale_local_gradients=scale_local_gradients)
        self._ddl_local_sources = set()

    def register_local_source(self, source):
        """Horovod's: the gradient of `source` (a worker-local variable, as in model parallelism) is
        not reduced; gradient() returns it divided by the set's size (unless scale_local_gradients=False)."""
        self._ddl_local_sources.add(_ref(source))

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        kwargs.pop("use_generic_names", None)  # Horovod's naming switch: ddl names groups itself
        grads = super(self.__class__, self).gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads)
        s = self._ddl
        if s["process_set"].included() is False:
            return grads
        local = [_ref(v) in self._ddl_local_sources for v in tf.nest.flatten(sources)] if self._ddl_local_sources else None
        reduced = _allreduce_gradients(flat, s["compression"], s["sparse_as_dense"], s["op"],
                                       s["gradient_predivide_factor"], s["process_set"], local=local,
                                       scale_local_gradients=s["scale_local_gradients"])
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, **kwargs):
        """gradient(), split into ([(local source, gradient)], [(other source, gradient)])."""
        pairs = list(zip(tf.nest.flatten(sources),
                         tf.nest.flatten(self.gradient(target, sources, output_gradients, **kwargs))))
        local = [(v, g) for v, g in pairs if _ref(v) in self._ddl_local_sources]
        others = [(v, g) for v, g in pairs if _ref(v) not in self._ddl_local_sources]
        return local, others


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape (after its `with` block) so that gradient() returns the gradients
    allreduced over the process set: every gradient of the call in one libddl group (num_groups and
    groups are accepted; libddl fuses the whole group whatever they say)."""
    if op not in (Average, Sum, Adasum, Min, Max, Product):
        raise ValueError(f"unknown reduction op {op!r}")
    _reductions.refuse_adasum(op)
    _gradient_scales(op, gradient_predivide_factor, process_set)  # refuse a bad combination now
    methods = {k: v for k, v in _DistributedGradientTape.__dict__.items() if k not in ("__dict__", "__weakref__")}
    cls = type(gradtape.__class__.__name__, (gradtape.__class__,), methods)
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._ddl_setup(compression, sparse_as_dense, op, gradient_predivide_factor, process_set, scale_local_gradients)
    return tape


def _trainable_weights_of(local_layers):
    """The trainable weights of Horovod's `local_layers` (a Keras layer or a collection of them)."""
    if local_layers is None:
        return []
    layer_class = tf.keras.layers.Layer
    layers = [local_layers] if isinstance(local_layers, layer_class) else list(local_layers)
    if not all(isinstance(layer, layer_class) for layer in layers):
        raise ValueError("local_layers must be a Keras layer or a collection of Keras layers "
                         "(tf.keras.layers.Layer)")
    return [w for layer in layers for w in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0,
                                   groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """DistributedGradientTape whose `local_layers` keep their own gradients (not reduced; divided by
    the set's size with scale_local_gradients), as Horovod's, for layers each rank trains alone."""
    local_weights = _trainable_weights_of(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set, scale_local_gradients)
    for weight in local_weights:
        tape.register_local_source(weight)
    return tape


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """A Keras optimizer whose gradients are allreduced before they are applied (see ddl.keras)."""
    from ddl.tensorflow.keras import _optimizer
    if not _optimizer.is_keras_optimizer(optimizer):
        raise ValueError(f"ddl.tensorflow.DistributedOptimizer takes a Keras optimizer, not "
                         f"{type(optimizer).__module__}.{type(optimizer).__name__}: TensorFlow 1's "
                         "tf.compat.v1.train optimizers are not supported; use a tf.keras.optimizers one, or "
                         "hvd.DistributedGradientTape in a custom loop")
    return _optimizer.create_distributed_optimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step, op=op, gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
        scale_local_gradients=scale_local_gradients)


_executing_eagerly = _mpi_ops._executing_eagerly  # Horovod's module has it; some of its own tests call it

from ddl.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: E402,F401
