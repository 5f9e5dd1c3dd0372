"""``SyncBatchNormalization``: batch normalization with statistics over all ranks.

In training, each rank computes the count, sum and sum of squares of its
batch per channel; one Sum-allreduce (differentiable) combines them, so every
rank normalizes with the mean and variance of the global batch, and gradients
flow through the reduction.  Inference uses the moving statistics as usual.

Cross-rank contract: every member of ``process_set`` calls the layer in
training mode the same number of times, in the same order (the layer holds a
collective); all members then hold the same moving statistics.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from .mpi_ops import Sum, _allreduce, global_process_set

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["SyncBatchNormalization"]


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Keras 3 ``BatchNormalization`` whose batch statistics span all ranks.

    Takes BatchNormalization's arguments plus ``process_set`` (+).  ``fused``
    is accepted for Horovod compatibility and must be False or absent.
    """

    def __init__(self, *args, process_set=global_process_set, fused=None, **kwargs):
        if fused:
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        super().__init__(*args, **kwargs)
        self._hvd_process_set = process_set

    @_no_autograph
    def _moments(self, inputs, mask):
        ps = self._hvd_process_set
        if not ps.included() or ps.size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            shape = tf.shape(x)
            count = tf.cast(tf.reduce_prod(tf.gather(shape, axes)), x.dtype)
            total = tf.reduce_sum(x, axis=axes)
            total_sq = tf.reduce_sum(tf.square(x), axis=axes)
        else:
            weight = tf.cast(tf.expand_dims(mask, -1), x.dtype)
            weight = tf.broadcast_to(weight, tf.shape(x))
            count = tf.reduce_sum(weight, axis=axes)
            total = tf.reduce_sum(x * weight, axis=axes)
            total_sq = tf.reduce_sum(tf.square(x) * weight, axis=axes)
        stat_shape = tf.shape(total)
        count_vec = tf.reshape(count, [-1])
        packed = tf.concat([count_vec, tf.reshape(total, [-1]), tf.reshape(total_sq, [-1])], 0)
        reduced = _allreduce(packed, op=Sum, process_set=ps)
        k = tf.size(count_vec)
        n_channels = tf.size(total)
        g_count = tf.reshape(reduced[:k], tf.shape(count_vec))
        g_sum = tf.reshape(reduced[k : k + n_channels], stat_shape)
        g_sq = tf.reshape(reduced[k + n_channels :], stat_shape)
        if mask is None:
            g_count = tf.reshape(g_count, [])
        else:
            g_count = tf.reshape(g_count, stat_shape) + keras.backend.epsilon()
        mean = g_sum / g_count
        variance = tf.maximum(g_sq / g_count - tf.square(mean), 0.0)
        return mean, variance
