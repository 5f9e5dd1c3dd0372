"""Keras on JAX: gradients and variables go through :mod:`hvdlite.jax`.

Keras' JAX trainer jits ``train_step`` and applies the optimizer statelessly:
``optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)``
maps the variables to the traced values and calls ``optimizer.apply(grads)``,
which :class:`~hvdlite.keras.optimizer._DistributedMixin` overrides.  So
:class:`JaxGradientReducer` usually sees traced gradients: it reduces a step's
gradients as one ordered ``io_callback`` of :mod:`hvdlite.jax` (one grouped
submission per group, every group submitted before any is waited on, under a
fixed name the engine's response cache recognizes every step).  With
``run_eagerly=True`` or ``jit_compile=False`` the same code gets concrete
arrays and takes hvdlite.jax's eager path (zero-copy host views).

``backward_passes_per_step > 1``: a JAX ``lax.cond`` branch cannot assign
Keras variables (the assignment would leak the branch's tracers), so
:meth:`JaxBackend.apply_accumulated` keeps only the reduction inside the
``cond`` and applies the optimizer every step, keeping its result on the
k-th step only (Keras' own gradient accumulation on JAX does the same).

The trainer holds the training state outside the Keras variables between
steps (it purges their values); :meth:`JaxBackend.sync_model` writes it back
(``model.jax_state_sync()``) before a callback reads or overwrites variables
in the middle of an epoch, and the trainer reads them again at its next step.

Cross-rank contract: :class:`~hvdlite.keras._backend.KerasBackend`'s; every
rank runs the same jitted step (one process per device: a Keras
``keras.distribution`` over several devices is refused, on every rank).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hvdlite._optimizer_args import reduction_scales, split_groups
from hvdlite.jax import _arrays, _traced
from hvdlite.jax.compression import Compression
from hvdlite.jax.functions import broadcast_parameters
from hvdlite.jax.mpi_ops import grouped_allreduce, grouped_allreduce_async, synchronize

from ._backend import KerasBackend

__all__ = ["BACKEND", "JaxBackend", "JaxGradientReducer"]


def _refuse_keras_distribution() -> None:
    from keras import distribution

    if distribution.distribution() is not None:
        raise ValueError(
            "hvdlite.keras on JAX runs one process per device and reduces gradients over MPI, "
            f"but a keras.distribution ({type(distribution.distribution()).__name__}) spreads "
            "this process's model over several devices: use one or the other; for hvdlite, "
            "leave keras.distribution unset and start one rank per device "
            "(e.g. hvdrun -np <devices>)."
        )


class JaxGradientReducer:
    """``reducer(grads, variables) -> grads`` for JAX gradients (see the module docstring).

    With ``op=Average`` and ``gradient_predivide_factor=f`` the result is
    ``sum(g) / size``, scaled by ``1/f`` before the sum and ``f/size`` after it
    (Horovod's split).  Groups are named ``<name>`` (one group) or
    ``<name>.<k>``, the same every step.
    """

    def __init__(self, name, compression, op, gradient_predivide_factor, groups, process_set):
        self.prescale, self.postscale = reduction_scales(op, gradient_predivide_factor)
        self.name = name
        self.compression = compression
        self.op = op
        self.groups = groups
        self.process_set = process_set

    def __call__(self, grads, variables=None):
        grads = list(grads)
        ps = self.process_set
        if not ps.included() or ps.size() == 1:
            return grads
        _refuse_keras_distribution()
        present = [i for i, g in enumerate(grads) if g is not None]
        wire, ctxs = {}, {}
        for i in present:
            g = grads[i]
            if not isinstance(g, jax.Array):
                raise TypeError(
                    f"hvdlite.keras (jax backend): gradient {i} is a {type(g).__name__}, "
                    "not a JAX array; are KERAS_BACKEND and the tensors' framework the same?"
                )
            if not jnp.issubdtype(g.dtype, jnp.floating):
                raise ValueError(
                    f"hvdlite: gradient {i} has dtype {g.dtype}; gradients must be floating point."
                )
            wire[i], ctxs[i] = self.compression.compress(g)
        groups = split_groups(present, self.groups, variables)
        if not groups:
            return grads
        reduced = self._reduce([[wire[i] for i in group] for group in groups])
        out = list(grads)
        for group, values in zip(groups, reduced, strict=True):
            for i, value in zip(group, values, strict=True):
                out[i] = self.compression.decompress(value, ctxs[i])
        return out

    def _reduce(self, groups: list[list]) -> list[list]:
        kwargs = dict(
            op=self.op,
            prescale_factor=self.prescale,
            postscale_factor=self.postscale,
            process_set=self.process_set,
        )
        if len(groups) == 1:  # traced or eager: hvdlite.jax's grouped allreduce
            return [grouped_allreduce(groups[0], name=self.name, **kwargs)]
        names = [f"{self.name}.{k}" for k in range(len(groups))]
        if _arrays.is_traced([x for group in groups for x in group]):
            return _traced.allreduce_groups(
                groups, self.op, self.prescale, self.postscale, names, self.process_set
            )
        handles = [
            grouped_allreduce_async(group, name=name, **kwargs)
            for group, name in zip(groups, names, strict=True)
        ]
        return [synchronize(handle) for handle in handles]


class JaxBackend(KerasBackend):
    """:class:`~hvdlite.keras._backend.KerasBackend` for ``KERAS_BACKEND=jax``."""

    name = "jax"
    Compression = Compression

    def check_supported(self) -> None:
        _refuse_keras_distribution()

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
        # sparse_as_dense: Keras' JAX gradients are dense.
        return JaxGradientReducer(
            name, compression, op, gradient_predivide_factor, groups, process_set
        )

    def broadcast_variables(self, variables, root_rank, process_set):
        variables = list(variables)
        if not variables:
            return
        values = broadcast_parameters(
            [_value(v) for v in variables], root_rank, process_set=process_set
        )
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)

    def sync_model(self, model) -> None:
        if getattr(model, "_jax_state", None) is not None:
            model.jax_state_sync()

    def apply_accumulated(
        self, optimizer, apply, reduce, grads, variables, accs, counter, k, average
    ):
        sums = [
            None if g is None else acc.value + g.astype(acc.dtype)
            for g, acc in zip(grads, accs, strict=True)
        ]
        count = counter.value + 1
        boundary = count >= k
        agg = [None if s is None else (s / k if average else s) for s in sums]
        # Only the reduction is conditional: lax.cond runs its callback on the k-th step
        # only.  agg is an operand, so the branch sees tracers even when this runs eagerly.
        reduced = jax.lax.cond(boundary, lambda a: reduce(a, variables), lambda a: a, agg)
        skip = {id(optimizer._iterations), id(counter), *map(id, accs)}
        kept = list(variables) + [v for v in optimizer.variables if id(v) not in skip]
        before = [v.value for v in kept]
        apply(reduced, variables)  # advances iterations; its update kept on the k-th step only
        for v, old in zip(kept, before, strict=True):
            v.assign(jnp.where(boundary, v.value, old))
        for acc, s in zip(accs, sums, strict=True):
            if s is not None:
                acc.assign(jnp.where(boundary, jnp.zeros_like(s), s))
        counter.assign(jnp.where(boundary, jnp.zeros_like(count), count))


def _value(variable):
    """The JAX array a Keras variable holds (what a broadcast sends)."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, jax.Array):
        raise TypeError(
            f"hvdlite.keras (jax backend): cannot broadcast a {type(variable).__name__} "
            "that holds no JAX array; pass Keras variables of this backend."
        )
    return value


BACKEND = JaxBackend()
