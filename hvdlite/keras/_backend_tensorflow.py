"""Keras on TensorFlow: gradients and variables go through :mod:`hvdlite.tensorflow`.

The gradients of a step are reduced by
:class:`hvdlite.tensorflow.gradient_reduction.GradientReducer` (one
``tf.numpy_function`` node inside ``model.fit``'s compiled train step;
sparse ``tf.IndexedSlices`` allgathered or densified), variables are broadcast
by :func:`hvdlite.tensorflow.functions.broadcast_variables` (one submission).
Cross-rank contract: :class:`~hvdlite.keras._backend.KerasBackend`'s.
"""

from __future__ import annotations

import tensorflow as tf

from hvdlite.tensorflow import gradient_reduction as _reduction
from hvdlite.tensorflow.compression import Compression
from hvdlite.tensorflow.functions import broadcast_variables

from ._backend import KerasBackend

__all__ = ["BACKEND", "TensorFlowBackend"]


class TensorFlowBackend(KerasBackend):
    """:class:`~hvdlite.keras._backend.KerasBackend` for ``KERAS_BACKEND=tensorflow``."""

    name = "tensorflow"
    Compression = Compression

    def gradient_reducer(
        self,
        *,
        name,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
    ):
        return _reduction.GradientReducer(
            name, compression, sparse_as_dense, op, gradient_predivide_factor, groups, process_set
        )

    def local_sources(self):
        return _reduction.LocalSources()

    def reduce_with_local(self, reducer, grads, variables, local, scale_local_gradients):
        return _reduction.reduce_with_local(reducer, grads, variables, local, scale_local_gradients)

    def broadcast_variables(self, variables, root_rank, process_set):
        broadcast_variables(list(variables), root_rank, process_set=process_set)

    def no_autograph(self, fn):
        return tf.autograph.experimental.do_not_convert(fn)


BACKEND = TensorFlowBackend()
