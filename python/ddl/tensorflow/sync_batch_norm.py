"""SyncBatchNormalization: batch statistics over every rank's batch, as Horovod's."""

import functools

import tensorflow as tf

from ddl.common.process_sets import global_process_set
from ddl.tensorflow import mpi_ops as ops


@functools.lru_cache(maxsize=None)
def _takes_fused():
    """Whether this Keras's BatchNormalization has a fused kernel to turn off (Keras 2, which takes
    `fused` through **kwargs, so its signature does not show it); Keras 3 refuses the argument."""
    try:
        tf.keras.layers.BatchNormalization(fused=False)
    except (TypeError, ValueError):
        return False
    return True


@tf.keras.utils.register_keras_serializable(package="ddl")
class SyncBatchNormalization(tf.keras.layers.BatchNormalization):
    """BatchNormalization whose training-time mean and variance are those of the global batch (every
    rank's count, mean and variance, gathered in one op); inference uses the moving statistics as
    usual."""

    def __init__(self, *args, process_set=global_process_set, **kwargs):
        kwargs.pop("fused", None)
        if _takes_fused():
            kwargs["fused"] = False  # Keras 2's fused kernel (4-D and 5-D inputs) computes local statistics only
        super().__init__(*args, **kwargs)
        self._ddl_process_set = process_set

    def _synced_moments(self, inputs, axes, keep_dims):
        """The global batch's mean and variance. Each rank's count, mean and sum of squared deviations
        from that mean (tf.nn.moments: two passes over its own batch) are gathered and combined as
        Chan et al. combine them: a variance from sums of x and x^2 loses all of itself in float32
        where the mean is large against the spread. Every rank combines the same rows in rank order."""
        x = tf.cast(inputs, tf.float32) if inputs.dtype in (tf.float16, tf.bfloat16) else inputs
        count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
        local_mean, local_variance = tf.nn.moments(x, axes=axes, keepdims=True)
        kept_shape = tf.shape(local_mean)
        local_mean = tf.reshape(local_mean, [-1])
        # An empty batch on this rank adds nothing (its moments are NaN).
        local_mean = tf.where(count > 0, local_mean, tf.zeros_like(local_mean))
        local_m2 = tf.where(count > 0, tf.reshape(local_variance, [-1]) * count, tf.zeros_like(local_mean))
        channels = tf.shape(local_mean)[0]
        rows = self._every_ranks_row(tf.concat([local_mean, local_m2, tf.reshape(count, [1])], 0))
        means, m2s, counts = rows[:, :channels], rows[:, channels:2 * channels], rows[:, 2 * channels:]
        n = tf.reduce_sum(counts)
        mean = tf.reduce_sum(means * counts, axis=0) / n
        variance = (tf.reduce_sum(m2s, axis=0) + tf.reduce_sum(counts * tf.square(means - mean), axis=0)) / n
        mean, variance = tf.reshape(mean, kept_shape), tf.reshape(variance, kept_shape)
        if not keep_dims:
            mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

    def _every_ranks_row(self, row):
        """Every rank's `row`, stacked in rank order. Each rank's statistics feed every rank's output,
        so the gradient of a rank's row is the sum of every rank's gradient of it (Horovod's
        allgather gradient averages it instead)."""
        process_set = self._ddl_process_set

        @tf.custom_gradient
        def gathered(mine):
            def gradient(dy):
                summed = ops.allreduce(dy, op=ops.Sum, process_set=process_set)
                return summed[process_set.rank()]
            return ops.allgather(tf.expand_dims(mine, 0), process_set=process_set), gradient

        return gathered(row)

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
