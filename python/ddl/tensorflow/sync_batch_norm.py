"""SyncBatchNormalization: batch statistics over every rank's batch, as Horovod's."""

import inspect

import tensorflow as tf

from ddl.common.process_sets import global_process_set
from ddl.tensorflow import mpi_ops as ops


@tf.keras.utils.register_keras_serializable(package="ddl")
class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """BatchNormalization whose training-time mean and variance are those of the global batch (the
    count, sum and sum of squares of every rank's batch, allreduced in one group); inference uses the
    moving statistics as usual."""

    def __init__(self, *args, process_set=global_process_set, **kwargs):
        kwargs.pop("fused", None)
        if "fused" in inspect.signature(tf.keras.layers.BatchNormalization.__init__).parameters:
            kwargs["fused"] = False  # Keras 2's fused kernel computes local statistics only
        super().__init__(*args, **kwargs)
        self._ddl_process_set = process_set

    def _synced_moments(self, inputs, axes, keep_dims):
        x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        total = tf.reduce_sum(x, axis=axes, keepdims=True)
        squares = tf.reduce_sum(tf.square(x), axis=axes, keepdims=True)
        count, total, squares = ops.grouped_allreduce([count, total, squares], op=ops.Sum,
                                                      process_set=self._ddl_process_set)
        mean = total / count
        variance = tf.maximum(squares / count - tf.square(mean), 0.0)
        if not keep_dims:
            mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

    def _moments(self, inputs, *args, **kwargs):
        if self._ddl_process_set.size() == 1:
            return super()._moments(inputs, *args, **kwargs)
        if args and isinstance(args[0], (list, tuple)):  # Keras 2: _moments(inputs, reduction_axes, keep_dims)
            keep_dims = args[1] if len(args) > 1 else kwargs.get("keep_dims", False)
            return self._synced_moments(inputs, list(args[0]), keep_dims)
        mask = args[0] if args else kwargs.get("mask")  # Keras 3: _moments(inputs, mask)
        if mask is not None:
            raise NotImplementedError("SyncBatchNormalization does not take a mask")
        return self._synced_moments(inputs, list(self._reduction_axes), False)

    def get_config(self):
        config = super().get_config()
        config.pop("fused", None)
        return config
