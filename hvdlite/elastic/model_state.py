"""An elastic state for a Keras model and its optimizer, on any framework.

:class:`ModelState` keeps copies (numpy arrays) of a model's variables and its
optimizer's, and puts them back on ``restore()``; ``sync()`` broadcasts the
live variables from rank 0 through the ``broadcast_variables`` function it is
given, and takes ``bcast_object`` and ``get_rank`` as :class:`ObjectState`
does, so this module imports no framework (Horovod's
``horovod/common/elastic.py`` is built the same way).  The
framework states build on it: ``hvdlite.tensorflow.elastic.TensorFlowKerasState``
and ``hvdlite.keras.elastic.KerasState`` (any Keras backend).

Cross-rank contract: :class:`~hvdlite.elastic.state.State`'s; every rank
builds the same model and optimizer, so the variables line up.
"""

from __future__ import annotations

from collections.abc import Callable

from .persistence import ElasticStateError
from .state import ObjectState

__all__ = ["ModelState", "values_of", "assign_values"]


def values_of(variables) -> list:
    """Copies (numpy arrays) of the values of ``variables``, in order (local)."""
    return [v.numpy() for v in variables]


def assign_values(variables, values, what: str) -> None:
    """Put ``values`` (from :func:`values_of`) back into ``variables``, in order (local).

    Raises ElasticStateError, naming ``what`` variables and the fix, when the
    counts differ (the state was committed for another model or optimizer).
    """
    variables = list(variables)
    if len(variables) != len(values):
        raise ElasticStateError(
            f"the committed state holds {len(values)} {what} variables, "
            f"this process has {len(variables)}: build the same model "
            "and optimizer before the elastic function runs"
        )
    for variable, value in zip(variables, values):
        variable.assign(value)


def _optimizer_variables(optimizer) -> list:
    found = optimizer.variables
    return list(found() if callable(found) else found)


class ModelState(ObjectState):
    """A built Keras model and its optimizer (default ``model.optimizer``), plus plain values.

    ``broadcast_variables(variables, root_rank)`` overwrites variables with
    ``root_rank``'s values on every rank (collective); ``bcast_object`` and
    ``get_rank`` are :class:`~hvdlite.elastic.state.ObjectState`'s.  The optimizer is built
    on the model's trainable variables when it is not yet, so that every rank
    has the same variables to broadcast and commit.  ``kind`` names the class
    in error messages.
    """

    def __init__(
        self,
        model,
        optimizer=None,
        *,
        broadcast_variables: Callable,
        bcast_object: Callable,
        get_rank: Callable[[], int],
        kind: str = "ModelState",
        **kwargs,
    ) -> None:
        if not getattr(model, "built", True):
            raise ValueError(
                f"{kind}: the model must be built first: call "
                "model.build(input_shape) or run it on a batch"
            )
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError(f"{kind}: no optimizer: compile the model with one or pass optimizer=")
        self.model, self.optimizer = model, optimizer
        self._broadcast_variables = broadcast_variables
        self._build_optimizer()
        self._save_model()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank, **kwargs)

    def _build_optimizer(self) -> None:
        if not getattr(self.optimizer, "built", True):
            self.optimizer.build(self.model.trainable_variables)

    def _save_model(self) -> None:
        self._saved_model_state = values_of(self.model.variables)
        self._saved_optimizer_state = values_of(_optimizer_variables(self.optimizer))

    def _load_model(self) -> None:
        assign_values(self.model.variables, self._saved_model_state, "model")
        assign_values(
            _optimizer_variables(self.optimizer), self._saved_optimizer_state, "optimizer"
        )

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load_model()
        super().restore()

    def sync(self) -> None:
        self._build_optimizer()
        self._broadcast_variables(
            list(self.model.variables) + _optimizer_variables(self.optimizer), 0
        )
        self._save_model()
        super().sync()

    def _snapshot(self) -> object:
        snapshot = super()._snapshot()
        snapshot.update(model=self._saved_model_state, optimizer=self._saved_optimizer_state)
        return snapshot

    def _load_snapshot(self, snapshot: object) -> None:
        if not isinstance(snapshot, dict) or "model" not in snapshot:
            raise ElasticStateError("the committed state was not written by a Keras state")
        self._build_optimizer()
        self._saved_model_state = list(snapshot["model"])
        self._saved_optimizer_state = list(snapshot["optimizer"])
        super()._load_snapshot(snapshot)
