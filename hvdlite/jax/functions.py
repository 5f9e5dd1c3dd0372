"""Start-of-training helpers for JAX: every rank begins from the root's
parameters (a pytree) and Python objects.

These are eager-only: call them once before the training loop, outside
``jax.jit``.  JAX arrays are immutable, so :func:`broadcast_parameters`
returns the broadcast pytree instead of overwriting its argument.

Cross-rank contract: every rank of the process set calls each helper with
the same structure (same pytree structure, leaf shapes and dtypes); only the
root's values matter and every rank ends with them.
"""

from __future__ import annotations

from typing import Any

import jax

from hvdlite import objects as _objects
from hvdlite.process_sets import ProcessSet, global_process_set

from . import _arrays
from .mpi_ops import _broadcast_async, _check_set, _root, refuse_traced, synchronize

__all__ = ["broadcast_parameters", "broadcast_object", "allgather_object"]

_OUTSIDE_JIT = (
    "call it once before the training loop, outside the jitted function, e.g. "
    "params = hvd.broadcast_parameters(params, root_rank=0)."
)


def broadcast_parameters(
    params: Any, root_rank: int, process_set: ProcessSet = global_process_set
) -> Any:
    """Return *params* (any pytree of arrays: a dict of parameters, a Flax
    variable dict, an optax state) with the root rank's values on every rank.

    Every leaf's broadcast is in flight at once, each named by its path in the
    pytree.  Leaves stay on their devices; eager only.

    Returns:
        A pytree of *params*' structure holding new arrays with the root's values.
    """
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    leaves = [_arrays.flatten(leaf, "broadcast_parameters")[0][0] for _, leaf in leaves_with_paths]
    refuse_traced(leaves, "broadcast_parameters", _OUTSIDE_JIT)
    _check_set(process_set, "broadcast_parameters")
    root = _root(root_rank, process_set, "broadcast_parameters")
    handles = [
        _broadcast_async(
            leaf, root, f"broadcast_parameters.{jax.tree_util.keystr(path)}", process_set
        )
        for (path, _), leaf in zip(leaves_with_paths, leaves, strict=True)
    ]
    return jax.tree_util.tree_unflatten(treedef, [synchronize(h) for h in handles])


def broadcast_object(obj=None, root_rank: int = 0, name=None, process_set=global_process_set):
    """Return the root rank's *obj* (any picklable object) on every rank; eager only.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    refuse_traced(jax.tree_util.tree_leaves(obj), "broadcast_object", _OUTSIDE_JIT)
    return _objects.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return the list of every rank's *obj*, in rank order, on every rank; eager only.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    refuse_traced(jax.tree_util.tree_leaves(obj), "allgather_object", _OUTSIDE_JIT)
    return _objects.allgather_object(obj, name=name, process_set=process_set)
