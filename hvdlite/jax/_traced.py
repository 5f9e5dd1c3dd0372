"""Collectives on traced values: inside ``jax.jit`` (and ``grad``), as host callbacks.

Each collective becomes one ``jax.experimental.io_callback(..., ordered=True)``
node.  When the compiled program reaches it, XLA hands the callback the
input buffers on the host (a device array is copied there), the callback runs
hvdlite's numpy collective, waits for it, and XLA copies the result back.

Order: ``ordered=True`` makes the callbacks of a process run in program order,
one at a time, across calls of the compiled function too, and keeps XLA from
dropping or reordering them.  Every rank runs the same program, so every rank
submits the same collectives in the same order.

Names: the name is chosen when the node runs, not when it is traced (a rank
that traces a function again, or traces two functions in another order, must
still pair up with the others): ``name=`` gives ``<op>.<name>``, the same every
run, which the engine's response cache recognizes; without it the name is
``jit.<op>.<n>``, *n* counting this process's unnamed traced collectives of
that op and process set as they run (ranks run them in the same order).

Cross-rank contract: every rank of the process set runs the compiled function
with the same collectives; a mismatch (shape, dtype, op...) raises hvdlite's
error inside the callback on every rank, which JAX reports as a
``JaxRuntimeError`` carrying hvdlite's message.  ``vmap`` of an ordered
callback is refused by JAX.

Differentiation: allreduce with op Average or Sum has a custom VJP (the
gradient is the same allreduce of the cotangent, as in Horovod); the other
collectives are not differentiable.
"""

from __future__ import annotations

import functools
import itertools
import threading

import jax
import numpy as np
from jax.experimental import io_callback

from hvdlite import collectives as _collectives
from hvdlite.exceptions import ArgumentError
from hvdlite.ops import Average, Sum

from ._arrays import host_input

__all__ = ["allreduce", "allreduce_groups", "allgather", "broadcast", "alltoall", "reducescatter"]

_counters: dict = {}
_lock = threading.Lock()


def _engine_name(op: str, name: str | None, process_set) -> str:
    if name is not None:
        return f"{op}.{name}"
    key = (op, process_set.process_set_id)
    with _lock:
        counter = _counters.get(key)
        if counter is None:
            counter = _counters[key] = itertools.count()
        n = next(counter)
    return f"jit.{op}.{n}" if key[1] == 0 else f"jit.{op}.set{key[1]}.{n}"


def _specs(arrays) -> list:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


def _call(host_fn, specs, leaves) -> list:
    return list(io_callback(host_fn, specs, *leaves, ordered=True))


# --------------------------------------------------------------------- allreduce
class _Reduction:
    """The static arguments of one traced allreduce (hashable: JAX keys traces on them)."""

    def __init__(self, op, prescale, postscale, name, process_set):
        self.op, self.prescale, self.postscale = op, prescale, postscale
        self.name, self.process_set = name, process_set

    def key(self):
        return (self.op, self.prescale, self.postscale, self.name, self.process_set)

    def __hash__(self):
        return hash(self.key())

    def __eq__(self, other):
        return isinstance(other, _Reduction) and self.key() == other.key()

    def of_gradient(self) -> _Reduction:
        name = None if self.name is None else f"{self.name}.grad"
        return _Reduction(self.op, self.prescale, self.postscale, name, self.process_set)


def _reduce(spec: _Reduction, leaves) -> list:
    def host(*arrays):
        staged = [host_input(np.asarray(a), reduce=True) for a in arrays]
        ins = [s.array for s in staged]
        name = _engine_name("allreduce", spec.name, spec.process_set)
        kwargs = dict(
            name=name,
            op=spec.op,
            prescale_factor=spec.prescale,
            postscale_factor=spec.postscale,
            process_set=spec.process_set,
        )
        if len(ins) == 1:
            outs = [_collectives.allreduce(ins[0], **kwargs)]
        else:
            outs = _collectives.grouped_allreduce(ins, **kwargs)
        return [s.restore(o) for s, o in zip(staged, outs, strict=True)]

    return _call(host, _specs(leaves), leaves)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _differentiable(spec: _Reduction, leaves: tuple) -> tuple:
    return tuple(_reduce(spec, leaves))


def _forward(spec, leaves):
    return _differentiable(spec, leaves), None


def _backward(spec, _residual, cotangents):
    return (tuple(_reduce(spec.of_gradient(), list(cotangents))),)


_differentiable.defvjp(_forward, _backward)


def allreduce(leaves, op, prescale, postscale, name, process_set) -> list:
    """The traced allreduce of *leaves* as one group (differentiable for Average/Sum)."""
    spec = _Reduction(op, prescale, postscale, name, process_set)
    if op in (Average, Sum):
        return list(_differentiable(spec, tuple(leaves)))
    return _reduce(spec, leaves)


def allreduce_groups(groups, op, prescale, postscale, names, process_set) -> list[list]:
    """Several grouped allreduces in ONE ordered callback (not differentiable).

    *groups*: lists of traced arrays, one grouped submission each, named
    ``allreduce.<names[k]>``; inside the callback every group is submitted
    before any is waited on, so the engine may negotiate them in one cycle.
    Returns the reduced groups, in the same structure.
    """
    leaves = [x for group in groups for x in group]
    cuts = list(itertools.accumulate(len(group) for group in groups))
    kwargs = dict(
        op=op, prescale_factor=prescale, postscale_factor=postscale, process_set=process_set
    )

    def host(*arrays):
        staged = [host_input(np.asarray(a), reduce=True) for a in arrays]
        with _collectives.waiting_caller():  # waited on right below, by this thread
            handles = [
                _collectives.grouped_allreduce_async(
                    [s.array for s in staged[start:stop]],
                    name=_engine_name("allreduce", name, process_set),
                    **kwargs,
                )
                for start, stop, name in zip([0, *cuts[:-1]], cuts, names, strict=True)
            ]
        outs = [o for handle in handles for o in _collectives.synchronize(handle)]
        return [s.restore(o) for s, o in zip(staged, outs, strict=True)]

    flat = _call(host, _specs(leaves), leaves)
    return [flat[start:stop] for start, stop in zip([0, *cuts[:-1]], cuts, strict=True)]


# ------------------------------------------------------------ the other collectives
def _uneven(what: str, rows) -> ArgumentError:
    return ArgumentError(
        f"hvdlite.jax.{what} inside jax.jit: the ranks passed dims 0 of {rows}, but every "
        "rank must pass the same dim 0 inside jit (the compiled program fixes its output "
        f"shape); for uneven rows call {what} outside the jitted function."
    )


def allgather(leaves, name, process_set) -> list:
    """Traced allgather of each leaf: every rank must pass the same dim 0.

    Each rank's dims 0 travel in the same group (one small int64 row), so that
    every rank sees an uneven input and raises alike.
    """
    n = process_set.size()
    specs = [jax.ShapeDtypeStruct((n * x.shape[0], *x.shape[1:]), x.dtype) for x in leaves]
    mine = np.array([[x.shape[0] for x in leaves]], dtype=np.int64)

    def host(*arrays):
        staged = [host_input(np.asarray(a), reduce=False) for a in arrays]
        outs = _collectives.grouped_allgather(
            [s.array for s in staged] + [mine],
            name=_engine_name("allgather", name, process_set),
            process_set=process_set,
        )
        rows = outs.pop()
        if (rows != mine).any():
            raise _uneven("allgather", rows[:, 0].tolist())
        return [s.restore(o) for s, o in zip(staged, outs, strict=True)]

    return _call(host, specs, leaves)


def broadcast(leaf, root_rank: int, name, process_set):
    """Traced broadcast of one array from global rank *root_rank*."""

    def host(array):
        staged = host_input(np.asarray(array), reduce=False)
        out = _collectives.broadcast(
            staged.array,
            root_rank,
            name=_engine_name("broadcast", name, process_set),
            process_set=process_set,
        )
        return staged.restore(out)

    return _call(host, _specs([leaf]), [leaf])[0]


def alltoall(leaf, name, process_set):
    """Traced alltoall with even splits: every rank must pass the same dim 0.

    Where dims 0 differ, every rank receives uneven counts, so each raises.
    """
    n = process_set.size()

    def host(array):
        staged = host_input(np.asarray(array), reduce=False)
        handle = _collectives.alltoall_async(
            staged.array,
            None,
            name=_engine_name("alltoall", name, process_set),
            process_set=process_set,
        )
        out, received = _collectives.synchronize(handle)
        if (np.asarray(received) != array.shape[0] // n).any():
            raise _uneven("alltoall", [int(r) * n for r in received])
        return staged.restore(out)

    return _call(host, _specs([leaf]), [leaf])[0]


def reducescatter(leaves, op, prescale, postscale, name, process_set) -> list:
    """Traced reducescatter of each leaf: this rank's block of dim-0 rows."""
    n, me = process_set.size(), process_set.rank()
    specs = []
    for x in leaves:
        rows = x.shape[0] // n + (1 if me < x.shape[0] % n else 0)
        specs.append(jax.ShapeDtypeStruct((rows, *x.shape[1:]), x.dtype))

    def host(*arrays):
        staged = [host_input(np.asarray(a), reduce=True) for a in arrays]
        kwargs = dict(
            name=_engine_name("reducescatter", name, process_set),
            op=op,
            prescale_factor=prescale,
            postscale_factor=postscale,
            process_set=process_set,
        )
        ins = [s.array for s in staged]
        if len(ins) == 1:
            outs = [_collectives.reducescatter(ins[0], **kwargs)]
        else:
            outs = _collectives.grouped_reducescatter(ins, **kwargs)
        return [s.restore(o) for s, o in zip(staged, outs, strict=True)]

    return _call(host, specs, leaves)
