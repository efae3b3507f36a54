"""Horovod's Keras DistributedOptimizer over libddl, for Keras 2 (tf.keras of TensorFlow <= 2.15, its
legacy optimizers too) and Keras 3 (TensorFlow >= 2.16).

The wrapped optimizer is a subclass of the user's optimizer class with the same name (so a saved
model names the same optimizer) whose gradients are allreduced, as one libddl group, just before they
are applied: Keras 3 routes every update through `apply()`, Keras 2 through `apply_gradients()`; that
one method is overridden, so model.fit, minimize() and a custom loop's apply_gradients() all reduce.
With backward_passes_per_step = N the gradients are summed locally and reduced and applied every N-th
call (averaged over N with average_aggregated_gradients); `iterations` counts every call, as Horovod's.
"""

import tensorflow as tf

from ddl.common import host_ops as H
from ddl.common.process_sets import global_process_set
from ddl.common.reductions import refuse_adasum


def _keras_optimizer_bases():
    bases = []
    for module in (getattr(tf.keras, "optimizers", None), getattr(getattr(tf.keras, "optimizers", None), "legacy", None)):
        base = getattr(module, "Optimizer", None) if module is not None else None
        if isinstance(base, type):
            bases.append(base)
    try:
        import keras
        if isinstance(getattr(keras.optimizers, "Optimizer", None), type):
            bases.append(keras.optimizers.Optimizer)
    except ImportError:
        pass
    return tuple(bases)


def is_keras_optimizer(optimizer):
    """Whether `optimizer` is a Keras optimizer: an instance of tf.keras.optimizers.Optimizer,
    tf.keras.optimizers.legacy.Optimizer or keras.optimizers.Optimizer, of those this TensorFlow and
    Keras have.

    Arguments:
        optimizer: any object.

    Returns:
        True or False.
    """
    return isinstance(optimizer, _keras_optimizer_bases())


def _is_keras3(optimizer_class):
    """Keras 3 optimizers update through apply(grads, variables); Keras 2 ones have no apply()."""
    return any(c.__module__.startswith("keras.src.optimizers.base_optimizer") for c in optimizer_class.__mro__)


class _DistributedMixin:
    """What the wrapped optimizer adds; its attributes are set by create_distributed_optimizer."""

    _ddl_distributed = True

    def register_local_var(self, var):
        """Horovod's: the gradient of `var` (a worker-local variable) is not reduced; it is applied
        divided by the set's size (unless scale_local_gradients=False)."""
        from ddl.tensorflow import _ref
        self._ddl_local_vars.add(_ref(var))

    def _ddl_reduce(self, grads, variables):
        from ddl.tensorflow import _allreduce_gradients, _ref
        from ddl.tensorflow.mpi_ops import _in_xla_context
        if _in_xla_context():
            raise RuntimeError("ddl's DistributedOptimizer cannot run inside an XLA-compiled step: compile the "
                               "model with jit_compile=False (ddl's collectives are host calls XLA cannot compile)")
        s = self._ddl_settings
        if s["process_set"].included() is False:  # as Horovod: a rank outside the set applies its own gradients
            return list(grads)
        local = [_ref(v) in self._ddl_local_vars for v in variables] if self._ddl_local_vars else None
        return _allreduce_gradients(list(grads), s["compression"], s["sparse_as_dense"], s["op"],
                                    s["gradient_predivide_factor"], s["process_set"], name="DistributedOptimizer",
                                    local=local, scale_local_gradients=s["scale_local_gradients"])

    def _ddl_build_accumulators(self, variables):
        if getattr(self, "_ddl_accumulators", None) is None:
            with tf.init_scope():
                self._ddl_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="ddl_aggregation_counter")
                self._ddl_accumulators = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                                      name="ddl_aggregated_gradient") for v in variables]

    def _ddl_step(self, grads, variables, apply_now):
        """Reduces and applies `grads` now, or every N-th call with backward_passes_per_step = N."""
        n = self._ddl_settings["backward_passes_per_step"]
        grads = list(grads)
        variables = list(variables)
        if n == 1:
            return apply_now(self._ddl_reduce(grads, variables), variables)
        self._ddl_build_optimizer(variables)
        self._ddl_build_accumulators(variables)
        for acc, g in zip(self._ddl_accumulators, grads):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        self._ddl_counter.assign_add(1)

        def reduce_and_apply():
            scale = 1.0 / n if self._ddl_settings["average_aggregated_gradients"] else 1.0
            # A variable without a gradient in this call gets none, as with backward_passes_per_step=1
            # and in Horovod: a zero in its place would be moved by weight decay and momentum.
            summed = [None if g is None else acc.read_value() * tf.cast(scale, acc.dtype) if scale != 1.0 else acc.read_value()
                      for acc, g in zip(self._ddl_accumulators, grads)]
            apply_now(self._ddl_reduce(summed, variables), variables)
            for acc in self._ddl_accumulators:
                acc.assign(tf.zeros_like(acc))
            self._ddl_counter.assign(0)
            return tf.constant(True)

        def count_only():
            self.iterations.assign_add(1)
            return tf.constant(False)

        if tf.executing_eagerly():
            return reduce_and_apply() if int(self._ddl_counter.numpy()) >= n else count_only()
        return tf.cond(self._ddl_counter >= n, reduce_and_apply, count_only)

    def _ddl_build_optimizer(self, variables):
        """Creates the optimizer's own variables outside any tf.cond branch."""
        if hasattr(self, "built") and not self.built and hasattr(self, "build"):
            with tf.init_scope():
                self.build(variables)


class _CallableList(list):
    """A list that, called, gives itself: Keras 3's optimizer.variables is a list, Keras 2's a method,
    and scripts written for Keras 2 (and Horovod, whose wrapper makes it so) call it."""

    def __call__(self):
        return self


class _Keras3Methods(_DistributedMixin):
    @property
    def variables(self):
        return _CallableList(super(self.__class__, self).variables)

    def apply(self, grads, trainable_variables=None):
        base = super(self.__class__, self)
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        return self._ddl_step(grads, variables, lambda g, v: base.apply(g, v))


class _Keras2Methods(_DistributedMixin):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        base = super(self.__class__, self)
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        return self._ddl_step(grads, variables, lambda g, v: base.apply_gradients(zip(g, v), *args, **kwargs))


def distributed_class(optimizer_class):
    """The class of a distributed `optimizer_class`: same name, the reducing method added."""
    methods = _Keras3Methods if _is_keras3(optimizer_class) else _Keras2Methods
    body = {k: v for cls in reversed(methods.__mro__[:-1]) for k, v in cls.__dict__.items()
            if k not in ("__dict__", "__weakref__", "__module__", "__doc__")}
    body["__module__"] = optimizer_class.__module__
    body["__doc__"] = optimizer_class.__doc__
    return type(optimizer_class.__name__, (optimizer_class,), body)


def create_distributed_optimizer(optimizer, name=None, compression=None, sparse_as_dense=False,
                                 backward_passes_per_step=1, op=H.Average, gradient_predivide_factor=1.0,
                                 average_aggregated_gradients=False, process_set=global_process_set,
                                 scale_local_gradients=True):
    """A new optimizer, of the same class name and config as `optimizer`, whose gradients are
    allreduced over the process set, as one libddl group, just before they are applied.

    The new optimizer is an instance of distributed_class(type(optimizer)), built with from_config()
    from optimizer.get_config(). Keras' LossScaleOptimizer is made to agree across ranks on whether the
    gradients are finite whenever it wraps a ddl optimizer (once per process).

    Arguments:
        optimizer: a Keras optimizer (is_keras_optimizer).
        name: the new optimizer's name (its config's "name"); None keeps the optimizer's.
        compression: Compression.none (what None means) or Compression.fp16: the gradients are
            compressed before the reduction and decompressed after it.
        sparse_as_dense: True: tf.IndexedSlices gradients are made dense and reduced with the others;
            False: they are allgathered.
        backward_passes_per_step: N >= 1 (an int): the gradients are summed locally, and reduced and
            applied every N-th call; `iterations` counts every call.
        op: Average (the default) or Sum.
        gradient_predivide_factor: f (Average only): each gradient is divided by f before the sum and
            the sum multiplied by f / the set's size.
        average_aggregated_gradients: with backward_passes_per_step = N > 1, the summed gradients are
            divided by N before they are reduced.
        process_set: the ProcessSet to reduce the gradients over.
        scale_local_gradients: the gradients of variables registered with register_local_var() are not
            reduced; True divides them by the set's size.

    Returns:
        the new, wrapped optimizer.

    Raises:
        NotImplementedError for Adasum; ValueError for another op than Average or Sum, a
        backward_passes_per_step that is not an int of at least 1, or a gradient_predivide_factor
        other than 1.0 with an op other than Average.
    """
    from ddl.tensorflow.compression import Compression
    refuse_adasum(op)
    if op not in (H.Average, H.Sum):
        raise ValueError("DistributedOptimizer reduces gradients with hvd.Average or hvd.Sum only")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be a whole number of at least 1, not "
                         f"{backward_passes_per_step!r}")
    if gradient_predivide_factor != 1.0 and op != H.Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    from ddl.tensorflow.keras._loss_scale import agree_on_finite_gradients
    agree_on_finite_gradients()  # under a mixed_float16 policy, model.compile wraps this optimizer in one
    cls = distributed_class(optimizer.__class__)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    wrapped = cls.from_config(config)
    wrapped._ddl_settings = dict(compression=compression or Compression.none, sparse_as_dense=sparse_as_dense, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor,
                                 backward_passes_per_step=backward_passes_per_step,
                                 average_aggregated_gradients=average_aggregated_gradients, process_set=process_set,
                                 scale_local_gradients=scale_local_gradients)
    wrapped._ddl_accumulators = None
    wrapped._ddl_local_vars = set()
    return wrapped
