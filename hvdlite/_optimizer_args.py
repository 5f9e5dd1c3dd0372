"""Horovod's optimizer arguments that mean the same in every framework adapter.

``groups`` (and its deprecated spelling ``num_groups``) and ``local_layers``
are taken by the TensorFlow tape and by the Keras optimizer on any backend;
their rules live here once.  Nothing here communicates; ``keras`` is
imported only by :func:`local_layer_list`, when called.
"""

from __future__ import annotations

import warnings

__all__ = ["normalize_groups", "split_groups", "local_layer_list", "identities", "refuse_sharding"]


def normalize_groups(num_groups, groups):
    """Horovod's rule: ``num_groups`` is the deprecated spelling of an int ``groups``."""
    if num_groups:
        warnings.warn(
            "Parameter `num_groups` has been replaced by `groups` and will be "
            "removed in a future version.",
            DeprecationWarning,
            stacklevel=3,
        )
        if groups is None:
            groups = num_groups
    if groups is not None and not (
        isinstance(groups, list) or (isinstance(groups, int) and groups > 0)
    ):
        raise ValueError(
            "groups should be a non-negative integer or a list of list of tf.Variable."
        )
    return groups


def identities(variable) -> list[int]:
    """The ids a variable is known by: its own and, for a Keras variable, its value's."""
    ids = [id(variable)]
    inner = getattr(variable, "value", None)
    if inner is not None and not callable(inner):
        ids.append(id(inner))
    return ids


def split_groups(positions: list[int], groups, variables) -> list[list[int]]:
    """Horovod's ``groups`` as lists of gradient positions, one submission each.

    ``None``: one group of every position; an int ``k``: ``k`` groups of
    consecutive positions, as even as they come; lists of variables: one group
    per list, matched by identity (a Keras variable or the value it holds),
    and each position in no list a group of its own.
    """
    if groups is None:
        return [list(positions)] if positions else []
    if isinstance(groups, int):
        n = len(positions)
        chunks = [positions[i * n // groups : (i + 1) * n // groups] for i in range(groups)]
        return [c for c in chunks if c]
    if variables is None:
        raise ValueError(
            "groups given as lists of variables need the variables; pass them to the reducer."
        )
    where = {}
    for p in positions:
        for key in identities(variables[p]):
            where.setdefault(key, p)
    out, used = [], set()
    for group in groups:
        members = []
        for var in group:
            p = next((where[k] for k in identities(var) if k in where), None)
            if p is not None and p not in used:
                members.append(p)
                used.add(p)
        if members:
            out.append(sorted(members))
    return out + [[p] for p in positions if p not in used]


def local_layer_list(local_layers) -> list:
    """``local_layers`` of a partial tape or optimizer as a list of Keras layers."""
    import keras

    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        return [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, keras.layers.Layer) for layer in local_layers):
        raise ValueError("All local layers must be of keras.layers.Layer type.")
    return local_layers


def reduction_scales(op, gradient_predivide_factor: float) -> tuple[float, float]:
    """(prescale, postscale) of a gradient reduction with *op* (Average or Sum):
    with Average and predivide factor f, ``1/f`` before the sum and ``f`` after it
    (the engine then divides by the set's size: Horovod's split).  ValueError for
    another op, or a factor with an op other than Average."""
    from hvdlite.ops import Average, Sum

    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if op not in (Average, Sum):
        raise ValueError(f"hvdlite.keras: gradients are reduced with Average or Sum, not {op!r}.")
    if op == Average:
        return 1.0 / gradient_predivide_factor, gradient_predivide_factor
    return 1.0, 1.0


#: Why each non-torch optimizer has no ``shard_optimizer_state`` (docs/sharding.md).
_NO_SHARDING = {
    "keras": (
        "a Keras optimizer builds its state for every variable it is given and updates "
        "them all in one compiled train step, so a sharded one needs an optimizer built "
        "over this rank's variables plus an allgather inside that step, which hvdlite "
        "does not have yet"
    ),
    "tensorflow": (
        "a tf.compat.v1 optimizer creates its slots for every variable it applies, inside "
        "the graph, and hvdlite has no sharded wrapper for it"
    ),
    "optax": (
        "an optax transformation's state is one pytree over all parameters, updated in "
        "one call, and hvdlite has no sharded wrapper for it yet"
    ),
}


def refuse_sharding(framework: str, shard_optimizer_state: bool) -> None:
    """NotImplementedError naming the fix when *shard_optimizer_state* is asked of an
    optimizer other than torch's (every rank raises it, before any collective)."""
    if shard_optimizer_state:
        raise NotImplementedError(
            f"shard_optimizer_state=True is supported for torch optimizers only: "
            f"{_NO_SHARDING[framework]}. Drop the argument (every rank then keeps the "
            "whole optimizer state), or train with PyTorch: "
            "hvdlite.torch.DistributedOptimizer(opt, shard_optimizer_state=True)."
        )
