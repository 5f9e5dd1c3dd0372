"""Keras 3 ``DistributedOptimizer``: reduce gradients across ranks before applying them.

Keras 3 optimizers apply gradients through ``apply(grads, variables)`` (which
``apply_gradients`` and ``model.fit``'s train step call).  The wrapper is an
instance of a class created once per optimizer class, with the same name and
module, deriving from it (so ``isinstance(opt, type(original))`` holds and a
saved model reloads as the plain optimizer) with :class:`_DistributedMixin`
in front, which overrides ``apply``:

* ``backward_passes_per_step == 1``: all gradients of the step are reduced
  in one grouped submission, then the wrapped optimizer applies them;
* ``backward_passes_per_step == n > 1``: gradients accumulate locally in
  optimizer variables; every n-th call reduces the sums (divided by n with
  ``average_aggregated_gradients``) and applies them; the other calls only
  advance ``iterations`` (Horovod's behaviour).

The reduction itself is the Keras backend's (:mod:`._select`, read once): on
TensorFlow one graph node inside ``model.fit``'s ``tf.function``, on torch one
grouped allreduce of the ``.grad`` tensors through :mod:`hvdlite.torch`, on
JAX one ordered host callback of :mod:`hvdlite.jax` inside the jitted train
step (Keras' JAX trainer calls ``stateless_apply``, which calls ``apply``).
The aggregation is the backend's too (``KerasBackend.apply_accumulated``:
``keras.ops.cond`` on TensorFlow and torch, a select on JAX).  On a backend
that cannot work (numpy, openvino) making the optimizer raises, naming the
fix.

Cross-rank contract: every member of the process set calls ``apply`` the same
number of times with gradients of the same variables.
"""

from __future__ import annotations

import keras

from .._optimizer_args import local_layer_list, normalize_groups, refuse_sharding
from .._subclass import with_mixin
from ..ops import Average, Sum
from ..process_sets import global_process_set
from ._select import current as _current_backend

__all__ = [
    "DistributedOptimizer",
    "PartialDistributedOptimizer",
    "make_distributed",
    "normalize_groups",
    "local_layer_list",
]

_BACKEND = _current_backend()
#: Horovod's ``Compression`` for this backend's tensors (``hvd.Compression``).
Compression = _BACKEND.Compression


class _HvdState:
    """hvdlite's per-optimizer settings, kept out of Keras' variable tracking."""

    def __init__(self, backend, reducer, bpps, average_aggregated, process_set, scale_local):
        self.backend = backend
        self.reducer = reducer
        self.bpps = bpps
        self.average_aggregated = average_aggregated
        self.process_set = process_set
        self.scale_local = scale_local
        self.local = backend.local_sources()
        self.accumulators = None
        self.counter = None


class _DistributedMixin:
    """Placed before the user's optimizer class; see the module docstring."""

    _HAS_AGGREGATE_GRAD = True

    @property
    def process_set(self):
        return self._hvd.process_set

    def register_local_var(self, var):
        """Keep ``var``'s gradient rank-local: it is not reduced across ranks."""
        self._hvd.local.add(var)

    def build(self, variables):
        super().build(variables)
        st = self._hvd
        if st.bpps > 1 and st.accumulators is None:
            st.accumulators = [
                self.add_variable_from_reference(v, name="hvd_aggregated_grad") for v in variables
            ]
            st.counter = self.add_variable(
                shape=(), dtype="int32", initializer="zeros", name="hvd_aggregation_counter"
            )

    def _hvd_reduce(self, grads, variables):
        st = self._hvd
        return st.backend.reduce_with_local(st.reducer, grads, variables, st.local, st.scale_local)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        if self._hvd.bpps == 1:
            variables = (
                trainable_variables
                if trainable_variables is not None
                else list(self._trainable_variables)
            )
            return super().apply(self._hvd_reduce(grads, variables), trainable_variables)
        return self._hvd_apply_aggregated(grads, trainable_variables)

    apply = _BACKEND.no_autograph(apply)

    def _hvd_apply_aggregated(self, grads, trainable_variables):
        st = self._hvd
        if not self.built:
            if trainable_variables is None:
                raise ValueError(
                    "Pass the variables with the first gradients so the optimizer can build."
                )
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = (
            trainable_variables
            if trainable_variables is not None
            else list(self._trainable_variables)
        )
        accs = [st.accumulators[self._get_variable_index(v)] for v in variables]
        st.backend.apply_accumulated(
            self,
            super().apply,
            self._hvd_reduce,
            grads,
            variables,
            accs,
            st.counter,
            st.bpps,
            st.average_aggregated,
        )


def _distributed_class(opt_cls: type) -> type:
    return with_mixin(_DistributedMixin, opt_cls)


def make_distributed(
    optimizer,
    *,
    name=None,
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
    in_place=False,
):
    """Build the distributed optimizer (a fresh copy, or ``optimizer`` re-classed in place).

    Raises on a Keras backend hvdlite cannot train on (every rank raises: each
    makes its optimizer), naming the backends that work.
    """
    _BACKEND.check_supported()
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"hvdlite.keras.DistributedOptimizer wraps a Keras 3 optimizer "
            f"(keras.optimizers.*), got {type(optimizer).__module__}."
            f"{type(optimizer).__name__}."
        )
    if isinstance(optimizer, _DistributedMixin):
        raise ValueError(
            "This optimizer is already a DistributedOptimizer; wrap the original optimizer once."
        )
    if op not in (Average, Sum):
        raise ValueError("op currently only supports Average and Sum")
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    reducer = _BACKEND.gradient_reducer(
        name=name or f"Distributed{type(optimizer).__name__}",
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        groups=groups,
        process_set=process_set,
    )
    cls = _distributed_class(type(optimizer))
    if in_place:
        opt = optimizer
        opt.__class__ = cls
    else:
        opt = cls.from_config(optimizer.get_config())
    opt._hvd = _HvdState(
        _BACKEND,
        reducer,
        backward_passes_per_step,
        average_aggregated_gradients,
        process_set,
        scale_local_gradients,
    )
    if backward_passes_per_step > 1 and opt.built:
        raise ValueError("backward_passes_per_step > 1 needs an optimizer that is not built yet.")
    return opt


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
    shard_optimizer_state=False,
):
    """An optimizer like ``optimizer`` (same class, same config) that reduces
    gradients across ranks before applying them.

    Works with ``model.compile(optimizer=...)``/``model.fit`` and with custom
    loops (``apply_gradients``/``apply``).  Arguments as in Horovod:
    ``compression``, ``sparse_as_dense``, ``gradient_predivide_factor``
    (Average only), ``op`` (Average or Sum), ``backward_passes_per_step``,
    ``average_aggregated_gradients``, ``groups`` (int or lists of variables;
    ``num_groups`` is its deprecated spelling), ``process_set``,
    ``scale_local_gradients``.  ``device_*`` are accepted and ignored;
    ``shard_optimizer_state=True`` is refused, naming why (torch only).
    """
    refuse_sharding("keras", shard_optimizer_state)
    groups = normalize_groups(num_groups, groups)
    return make_distributed(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )


def PartialDistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    groups=None,
    process_set=global_process_set,
    local_layers=None,
    scale_local_gradients=True,
):
    """:func:`DistributedOptimizer` whose ``local_layers`` keep rank-local gradients."""
    local_layers = local_layer_list(local_layers)
    opt = DistributedOptimizer(
        optimizer,
        name=name,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor,
        op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )
    for layer in local_layers:
        for var in layer.trainable_weights:
            opt.register_local_var(var)
    return opt
