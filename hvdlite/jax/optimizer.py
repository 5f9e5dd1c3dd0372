"""``DistributedOptimizer`` for optax: average the gradients, then update.

The wrapped transformation's ``update`` receives the gradient pytree reduced
over the ranks (one grouped allreduce of every leaf per step: negotiated and
fused as one unit), so every rank computes the same update from the same
state.  It works eagerly and inside ``jax.jit`` (an ordered host callback
there, see :mod:`hvdlite.jax._traced`).

Cross-rank contract: every rank builds its DistributedOptimizers in the same
order with the same arguments (the default name counts constructions), and
calls ``update`` the same number of times with gradient pytrees of the same
structure, shapes and dtypes.
"""

from __future__ import annotations

import itertools

import optax

from hvdlite._optimizer_args import refuse_sharding
from hvdlite.exceptions import ArgumentError
from hvdlite.ops import Average, ReduceOp, Sum, resolve_op
from hvdlite.process_sets import ProcessSet, global_process_set

from .compression import Compressor, NoneCompressor
from .mpi_ops import allreduce

__all__ = ["DistributedOptimizer"]

_instances = itertools.count()


def DistributedOptimizer(
    optimizer: optax.GradientTransformation,
    compression: type[Compressor] = NoneCompressor,
    backward_passes_per_step: int = 1,
    op: ReduceOp = Average,
    gradient_predivide_factor: float = 1.0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
    shard_optimizer_state: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Wrap the optax ``GradientTransformation`` *optimizer* so that its
    ``update`` first reduces the gradient pytree across the ranks.

    Arguments:
        optimizer: an optax ``GradientTransformation`` (e.g. ``optax.adam(1e-3)``).
        compression: ``Compression.none``, ``.fp16`` or ``.bf16``: the wire dtype
            of floating gradients (cast back before the update).
        backward_passes_per_step: reduce and update every k-th call only; the
            calls in between accumulate their gradients locally (their updates
            are zeros), and the k-th applies the mean of the k gradients, as
            ``optax.MultiSteps`` does (which does the accumulating).
        op: ``Average`` (the default) or ``Sum`` over the ranks.
        gradient_predivide_factor: with Average, divide by this before the sum
            and by ``size / factor`` after it (Horovod's meaning).
        name: the collective's name; by default ``DistributedOptimizer.<k>``, k
            counting the DistributedOptimizers this process has built.
        process_set: the ranks that reduce together.
        shard_optimizer_state: True is refused, naming why (torch only).

    Returns:
        An ``optax.GradientTransformationExtraArgs``: ``init(params)`` is the
        wrapped one's; ``update(grads, state, params=None, **extra)`` reduces
        *grads*, then updates.  Every rank ends with the same updates.
    """
    refuse_sharding("optax", shard_optimizer_state)
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            "hvdlite.jax.DistributedOptimizer wraps an optax GradientTransformation "
            f"(e.g. optax.sgd(0.1)), got {type(optimizer).__name__}."
        )
    rop = resolve_op(op, None)
    if rop not in (Average, Sum):
        raise ArgumentError(
            f"hvdlite.jax.DistributedOptimizer: op must be hvd.Average or hvd.Sum, got "
            f"{rop.name.capitalize()}."
        )
    try:
        k = int(backward_passes_per_step)
    except (TypeError, ValueError):
        k = 0
    if k < 1:
        raise ArgumentError(
            "hvdlite.jax.DistributedOptimizer: backward_passes_per_step must be an int >= 1, "
            f"got {backward_passes_per_step!r}."
        )
    factor = float(gradient_predivide_factor)
    if factor != 1.0 and rop != Average:
        raise ArgumentError(
            "hvdlite.jax.DistributedOptimizer: gradient_predivide_factor needs op=Average."
        )
    if name is None:
        name = f"DistributedOptimizer.{next(_instances)}"
    inner = optax.with_extra_args_support(optimizer)

    def update(updates, state, params=None, **extra_args):
        reduced = allreduce(
            updates,
            name=name,
            compression=compression,
            op=rop,
            prescale_factor=1.0 / factor,
            postscale_factor=factor,
            process_set=process_set,
        )
        return inner.update(reduced, state, params, **extra_args)

    distributed = optax.GradientTransformationExtraArgs(inner.init, update)
    if k == 1:
        return distributed
    return optax.MultiSteps(distributed, every_k_schedule=k).gradient_transformation()
