"""``DistributedGradientTape`` and ``PartialDistributedGradientTape``.

``hvd.DistributedGradientTape(tape)`` returns a tape of the same class (so
``isinstance(t, tf.GradientTape)`` still holds) that shares the original's
recording; its ``gradient()`` computes the local gradients, then reduces all of
them across ranks in one grouped submission (see
:mod:`hvdlite.tensorflow.gradient_reduction`).

Cross-rank contract: every member of the process set calls ``gradient()`` on
the same sources in the same order; every member gets the same reduced
gradients (rank-local sources excepted).
"""

from __future__ import annotations

import tensorflow as tf

from .._subclass import with_mixin
from .compression import Compression
from .gradient_reduction import (
    GradientReducer,
    LocalSources,
    local_layer_list,
    normalize_groups,
    reduce_with_local,
)
from .mpi_ops import Average, global_process_set

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["DistributedGradientTape", "PartialDistributedGradientTape"]


class _DistributedTapeMixin:
    """Mixed in front of the user's tape class; see the module docstring."""

    def _hvd_setup(self, reducer, process_set, scale_local_gradients):
        self._hvd_reducer = reducer
        self._hvd_local = LocalSources()
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients

    def register_local_source(self, source):
        """Keep ``source``'s gradient rank-local: it is not reduced across ranks."""
        self._hvd_local.add(source)

    @_no_autograph
    def gradient(
        self,
        target,
        sources,
        output_gradients=None,
        unconnected_gradients=tf.UnconnectedGradients.NONE,
        use_generic_names=False,
    ):
        grads = super().gradient(
            target,
            sources,
            output_gradients=output_gradients,
            unconnected_gradients=unconnected_gradients,
        )
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads)
        reduced = reduce_with_local(
            self._hvd_reducer,
            flat_grads,
            flat_sources,
            self._hvd_local,
            self.scale_local_gradients,
            use_generic_names,
        )
        return tf.nest.pack_sequence_as(sources, reduced)


def _distributed_class(tape_cls: type) -> type:
    return with_mixin(_DistributedTapeMixin, tape_cls)


def DistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Wrap ``gradtape`` so ``gradient()`` returns gradients reduced across ranks.

    Args mirror Horovod: ``compression`` (``Compression.none``/``fp16``/``bf16``),
    ``sparse_as_dense`` (densify ``tf.IndexedSlices`` instead of allgathering
    them), ``op`` (Average, Sum or Adasum), ``gradient_predivide_factor`` (split the
    averaging around the sum; Average only), ``groups`` (an int: that many
    groups; a list of lists of variables: those groups, every other variable
    alone; each group is one grouped allreduce, all submitted together),
    ``num_groups`` (deprecated spelling), ``process_set``,
    ``scale_local_gradients`` (divide rank-local gradients by the set size).
    ``device_dense``/``device_sparse`` are accepted for compatibility and ignored.
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(
            f"DistributedGradientTape wraps a tf.GradientTape, got {type(gradtape).__name__}."
        )
    groups = normalize_groups(num_groups, groups)
    reducer = GradientReducer(
        "DistributedGradientTape",
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        groups,
        process_set,
    )
    base_cls = type(gradtape)
    if isinstance(gradtape, _DistributedTapeMixin):
        base_cls = base_cls.__mro__[2]
    tape = _distributed_class(base_cls)(
        persistent=gradtape._persistent, watch_accessed_variables=gradtape._watch_accessed_variables
    )
    # Share the recording: gradients come from what ``gradtape`` recorded.
    tape._tape = gradtape._tape
    tape._hvd_setup(reducer, process_set, scale_local_gradients)
    return tape


def PartialDistributedGradientTape(
    gradtape,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    op=Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """Like :func:`DistributedGradientTape`, but the trainable weights of
    ``local_layers`` (a Keras layer or a collection of them) keep rank-local
    gradients."""
    local_layers = local_layer_list(local_layers)
    tape = DistributedGradientTape(
        gradtape,
        device_dense,
        device_sparse,
        compression,
        sparse_as_dense,
        op,
        gradient_predivide_factor,
        num_groups,
        groups,
        process_set,
        scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            tape.register_local_source(var)
    return tape
