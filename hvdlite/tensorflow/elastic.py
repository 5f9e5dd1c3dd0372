"""``hvdlite.tensorflow.elastic``: Horovod's ``horovod.tensorflow.elastic`` for TF 2 / Keras 3.

``TensorFlowKerasState(model, optimizer=None, **kwargs)`` tracks a Keras
model's and its optimizer's variables; ``TensorFlowState(variables, **kwargs)``
a list of ``tf.Variable``; both keep other keyword arguments as plain values
(:class:`~hvdlite.elastic.ObjectState`).  ``@run`` is the decorator; the
guarantee and the cross-rank contract are in :mod:`hvdlite.elastic`.
Eager execution only (TF 2): the TF1 session arguments are accepted for
Horovod compatibility and must be None.
"""

from __future__ import annotations

import tensorflow as tf

from hvdlite.basics import rank
from hvdlite.elastic import ObjectState, State, run, run_fn
from hvdlite.elastic.model_state import ModelState, assign_values, values_of
from hvdlite.elastic.persistence import ElasticStateError

from .functions import broadcast_object, broadcast_variables

__all__ = ["run", "run_fn", "State", "ObjectState", "TensorFlowState", "TensorFlowKerasState"]


def _require_eager(what: str, session) -> None:
    if session is not None or not tf.executing_eagerly():
        raise ValueError(
            f"{what}: hvdlite's elastic states need eager execution (TF 2); "
            "TF1 sessions are not supported: leave session/backend unset"
        )


class TensorFlowKerasState(ModelState):
    """A Keras model and its optimizer (default ``model.optimizer``), plus plain values.

    The model must be built (``model.build(input_shape)`` or one call on data);
    the optimizer is built on the model's trainable variables when it is not yet,
    so that every rank has the same variables to broadcast and commit
    (:class:`hvdlite.elastic.model_state.ModelState`).
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs) -> None:
        _require_eager("TensorFlowKerasState", None)
        self.backend = backend
        super().__init__(
            model,
            optimizer,
            broadcast_variables=broadcast_variables,
            bcast_object=broadcast_object,
            get_rank=rank,
            kind="TensorFlowKerasState",
            **kwargs,
        )


class TensorFlowState(ObjectState):
    """A list of ``tf.Variable`` (required: TF 2 has no global collection), plus plain values."""

    def __init__(self, variables=None, session=None, **kwargs) -> None:
        _require_eager("TensorFlowState", session)
        if not variables:
            raise ValueError(
                "TensorFlowState: pass the variables to track, e.g. "
                "TensorFlowState(model.variables) (TF 2 has no global "
                "variable collection)"
            )
        self.variables, self.session = list(variables), None
        self._values = values_of(self.variables)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def save(self) -> None:
        self._values = values_of(self.variables)
        super().save()

    def restore(self) -> None:
        assign_values(self.variables, self._values, "tracked")
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self.variables, root_rank=0)
        self._values = values_of(self.variables)
        super().sync()

    def _snapshot(self) -> object:
        snapshot = super()._snapshot()
        snapshot["variables"] = self._values
        return snapshot

    def _load_snapshot(self, snapshot: object) -> None:
        if not isinstance(snapshot, dict) or "variables" not in snapshot:
            raise ElasticStateError("the committed state was not written by a TensorFlowState")
        self._values = list(snapshot["variables"])
        super()._load_snapshot(snapshot)
