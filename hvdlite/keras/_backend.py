"""The interface each Keras backend fills in for :mod:`hvdlite.keras`.

:class:`KerasBackend` is what the optimizer, the callbacks and the elastic
state of :mod:`hvdlite.keras` call; one subclass per backend lives in its own
module (``_backend_tensorflow``, ``_backend_torch``, ``_backend_jax``) and
:mod:`._select` picks one, once.  Nothing here imports a framework.

Cross-rank contract: every rank runs Keras on the same backend (the
collectives of two backends do not meet in the middle: a job that mixes them
fails its first collective on a dtype or name mismatch).
"""

from __future__ import annotations

import numpy as np

from hvdlite import collectives as _collectives
from hvdlite import ops as _ops
from hvdlite._optimizer_args import identities
from hvdlite.compression import NoneCompressor

__all__ = ["KerasBackend", "UnsupportedBackend", "IdentityCompression", "LocalSources"]

#: What the error messages offer as the fix.
WORKING = ("tensorflow", "torch", "jax")


class IdentityCompression:
    """``Compression.none`` for a backend without casts of its own."""

    none = NoneCompressor


class LocalSources:
    """Variables whose gradients stay rank-local (``PartialDistributedOptimizer``).

    Keyed by identity, of the Keras variable and of the backend value it holds
    (``variable.value``), so either one is recognised.
    """

    def __init__(self):
        self._keep = []
        self._ids = set()

    def add(self, var) -> None:
        self._keep.append(var)
        self._ids.update(identities(var))

    def __contains__(self, var) -> bool:
        return id(var) in self._ids

    def __len__(self) -> int:
        return len(self._keep)


class KerasBackend:
    """What :mod:`hvdlite.keras` needs from a Keras backend.

    A subclass sets :attr:`name` and :attr:`Compression` and implements
    :meth:`gradient_reducer` and :meth:`broadcast_variables`; the other methods
    have defaults that hold on any backend whose tensors support ``/`` by a
    number.  Every method that communicates is collective over its
    ``process_set``: every member calls it with the same structure (same
    variables, same dtypes and shapes, ``None`` gradients in the same places),
    in the same order.
    """

    #: ``keras.backend.backend()``'s name for it.
    name: str = ""
    #: Horovod's ``Compression`` namespace for this backend's tensors (``none`` at least).
    Compression: type = IdentityCompression

    def check_supported(self) -> None:
        """Raise, naming the fix, if a ``DistributedOptimizer`` cannot work here (local)."""

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
        """A callable ``reducer(grads, variables) -> grads`` with a ``process_set`` attribute.

        ``grads``: this backend's tensors (or ``None``), one per variable;
        the result: the reduced gradients in the same places (``op`` is Average
        or Sum; ``None`` stays ``None``).  All of a step's gradients go to the
        engine before any is waited on (one grouped submission per group).
        Ranks outside ``process_set`` get their gradients back unchanged.
        """
        raise NotImplementedError

    def local_sources(self) -> LocalSources:
        """An empty set of variables with rank-local gradients."""
        return LocalSources()

    def reduce_with_local(self, reducer, grads, variables, local, scale_local_gradients):
        """Reduce the gradients of the variables not in ``local``; with
        ``scale_local_gradients`` divide the local ones by the set size (Horovod)."""
        grads = list(grads)
        if variables is None or not len(local):
            return reducer(grads, variables)
        shared = [i for i, v in enumerate(variables) if v not in local]
        reduced = reducer([grads[i] for i in shared], [variables[i] for i in shared])
        out = list(grads)
        for i, g in zip(shared, reduced, strict=True):
            out[i] = g
        ps = reducer.process_set
        if scale_local_gradients and ps.included():
            size = ps.size()
            out = [
                g if g is None or v not in local else g / size
                for g, v in zip(out, variables, strict=True)
            ]
        return out

    def broadcast_variables(self, variables, root_rank: int, process_set) -> None:
        """Overwrite every Keras variable in ``variables`` with ``root_rank``'s value, in place."""
        raise NotImplementedError

    def sync_model(self, model) -> None:
        """Make ``model``'s Keras variables (and its optimizer's) hold the values
        training works on, and have training read them back at its next step
        (local).  Callbacks call it before they read or overwrite variables in
        the middle of an epoch; a no-op where the variables are the state."""

    def apply_accumulated(
        self, optimizer, apply, reduce, grads, variables, accs, counter, k, average
    ):
        """``backward_passes_per_step = k > 1``: add ``grads`` to the accumulators
        ``accs`` and count the call in ``counter``; on every k-th call
        ``apply(reduce(sums, variables), variables)`` (sums divided by k with
        ``average``) and zero the accumulators; other calls only advance
        ``optimizer.iterations`` (Horovod's behaviour).  ``reduce`` is collective:
        every member reaches it on the same calls."""
        from keras import ops

        for g, acc in zip(grads, accs, strict=True):
            if g is not None:
                acc.assign_add(ops.cast(g, acc.dtype))
        counter.assign_add(1)
        present = [g is not None for g in grads]

        def boundary():
            agg = [
                ops.convert_to_tensor(acc.value) if p else None
                for acc, p in zip(accs, present, strict=True)
            ]
            if average:
                agg = [None if a is None else a / ops.cast(k, a.dtype) for a in agg]
            apply(reduce(agg, variables), variables)
            for acc in accs:
                acc.assign(ops.zeros_like(acc.value))
            counter.assign(0)
            return ops.convert_to_tensor(True)

        def skip():
            optimizer._iterations.assign_add(1)
            return ops.convert_to_tensor(False)

        ops.cond(counter.value >= k, boundary, skip)

    def allreduce_metrics(self, values: list[float], process_set) -> list[float]:
        """The average over ``process_set`` of each of ``values`` (Python numbers, as
        Keras hands callbacks their logs), in one grouped allreduce."""
        arrays = [np.asarray(v, dtype=np.float64).reshape(()) for v in values]
        averaged = _collectives.grouped_allreduce(
            [np.ascontiguousarray(a) for a in arrays], op=_ops.Average, process_set=process_set
        )
        return [float(np.asarray(a).reshape(())) for a in averaged]

    def no_autograph(self, fn):
        """``fn`` as the backend's compiler must see it (TensorFlow: not autograph-converted)."""
        return fn


class UnsupportedBackend(KerasBackend):
    """A Keras backend hvdlite cannot train on: constructing a ``DistributedOptimizer`` says so."""

    def __init__(self, name: str, why: str = "") -> None:
        self.name = name
        self.why = why

    def check_supported(self) -> None:
        raise NotImplementedError(
            f"hvdlite.keras: the Keras backend {self.name!r} is not supported"
            f"{self.why}; set KERAS_BACKEND to one of {', '.join(WORKING)} "
            "before keras is first imported."
        )

    def gradient_reducer(self, **settings):
        self.check_supported()

    def broadcast_variables(self, variables, root_rank, process_set):
        self.check_supported()
