"""Loss scaling (a mixed_float16 policy) around ddl's DistributedOptimizer: every rank applies or
skips a step together.

Keras' LossScaleOptimizer, which model.compile puts around the optimizer under a mixed_float16
policy, applies a step only when the gradients are all finite, and skips it otherwise (halving the
scale). It checks the gradients before the optimizer inside it sees them, and that optimizer is
where ddl reduces them: a rank whose gradients overflow would skip the step, and its reduction with
it, while the others reduce, so their ops would pair across steps and the replicas drift apart. (Horovod
reduces in compute_gradients, before the check; Keras 3's model.fit has no such step.) Here the
check itself is agreed: finite only where every rank of the optimizer's process set found its
gradients finite (one small allreduce, MIN, per step), as a check of reduced gradients would find.
"""

import importlib

import tensorflow as tf

_PATCHED = "_ddl_agreed"


def _ddl_optimizer(optimizer):
    return optimizer if getattr(optimizer, "_ddl_distributed", False) else None


def agreed_finite(optimizer, finite):
    """`finite` (a scalar bool, this rank's) as every rank of the optimizer's process set sees it."""
    from ddl.tensorflow import mpi_ops
    flag = tf.cast(tf.convert_to_tensor(finite), tf.int32)
    everywhere = mpi_ops.allreduce(flag, op=mpi_ops.Min, name="ddl.loss_scale.grads_finite",
                                   process_set=optimizer._ddl_settings["process_set"], ignore_name_scope=True)
    return tf.cast(everywhere, tf.bool)


def _wrap_method(cls, name, make_wrapper):
    """Replaces cls.<name> with make_wrapper(the original), once: a wrapper is marked, and a class
    whose method is already one is left as it is."""
    original = getattr(cls, name)
    if getattr(original, _PATCHED, False):
        return
    wrapper = make_wrapper(original)
    setattr(wrapper, _PATCHED, True)
    wrapper.__doc__ = original.__doc__
    setattr(cls, name, wrapper)


def _patch_keras3():
    """Keras 3: LossScaleOptimizer.check_finite(grads), on the optimizer that wraps ours."""
    try:
        module = importlib.import_module("keras.src.optimizers.loss_scale_optimizer")
    except ImportError:
        return
    cls = getattr(module, "LossScaleOptimizer", None)
    if cls is None:
        return

    def agreed_check(local_check):
        def check_finite(self, grads):
            finite = local_check(self, grads)
            inner = _ddl_optimizer(getattr(self, "inner_optimizer", None))
            return agreed_finite(inner, finite) if inner is not None else finite
        return check_finite

    _wrap_method(cls, "check_finite", agreed_check)


def _patch_keras2(module_name):
    """Keras 2 (tf.keras of TensorFlow <= 2.15, or tf-keras): the dynamic loss scale's update(grads)
    decides; the LossScaleOptimizer (both kinds) tells its state which ddl optimizer it wraps."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    state = getattr(module, "_DynamicLossScaleState", None)
    if state is None:
        return

    def agreed_update(local_update):
        def update(self, grads):
            inner = getattr(self, "_ddl_optimizer", None)
            if inner is None:
                return local_update(self, grads)
            grads = tf.nest.flatten(grads)
            finite = agreed_finite(inner, module._is_all_finite(grads))
            # A NaN where another rank's gradients were not finite: update() then finds what it would
            # find in reduced gradients, and skips the step (the NaN is only looked at, never applied).
            verdict = tf.where(finite, tf.constant(0.0), tf.constant(float("nan")))
            return local_update(self, grads + [verdict])
        return update

    _wrap_method(state, "update", agreed_update)
    for name in ("LossScaleOptimizer", "LossScaleOptimizerV3"):
        cls = getattr(module, name, None)
        if cls is not None and "apply_gradients" in cls.__dict__:
            _wrap_method(cls, "apply_gradients", _telling_the_state_its_optimizer)


def _telling_the_state_its_optimizer(apply_gradients):
    def patched(self, *args, **kwargs):
        inner = _ddl_optimizer(getattr(self, "_optimizer", None))
        loss_scale = getattr(self, "_loss_scale", None)
        if inner is not None and loss_scale is not None and not isinstance(loss_scale, float):
            loss_scale._ddl_optimizer = inner
        return apply_gradients(self, *args, **kwargs)
    return patched


def agree_on_finite_gradients():
    """Makes Keras' LossScaleOptimizer agree across ranks whenever it wraps a ddl optimizer (once)."""
    _patch_keras3()
    for module_name in ("keras.src.mixed_precision.loss_scale_optimizer",
                        "tf_keras.src.mixed_precision.loss_scale_optimizer"):
        _patch_keras2(module_name)
