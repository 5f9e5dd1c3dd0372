"""``hvdlite.keras.elastic``: Horovod's Keras elastic state and callbacks, on any Keras backend.

``hvdlite.tensorflow.keras.elastic`` holds the same objects.

For ``model.fit`` inside ``@hvd.elastic.run``: ``KerasState(model, epoch=0, batch=0)``
and, in this order after any metric-averaging callback,
``UpdateEpochStateCallback(state)``, ``UpdateBatchStateCallback(state)``,
``CommitStateCallback(state, batches_per_commit=N)``; call ``model.fit(...,
epochs=epochs - state.epoch)`` so that a resumed job runs the epochs left.

Cross-rank contract: the same callbacks on every rank (a commit is collective).
Keras 3's ``fit`` cannot shorten a running epoch: after a resume in the middle
of an epoch that epoch runs all its steps again from the committed weights
(Horovod's Keras 2 callback cut it short through ``params['steps']``).
"""

from __future__ import annotations

import keras

from hvdlite.basics import rank
from hvdlite.elastic import ObjectState, State, run, run_fn
from hvdlite.elastic.model_state import ModelState
from hvdlite.objects import broadcast_object
from hvdlite.process_sets import global_process_set

from ._select import current as _current_backend

__all__ = [
    "run",
    "run_fn",
    "State",
    "ObjectState",
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
]


def _broadcast_variables(variables, root_rank) -> None:
    _current_backend().broadcast_variables(variables, root_rank, global_process_set)


class KerasState(ModelState):
    """Horovod's ``KerasState(model, optimizer=None, backend=None, **kwargs)``.

    A built Keras model and its optimizer (default ``model.optimizer``), plus
    plain values (:class:`hvdlite.elastic.model_state.ModelState`); ``sync()``
    broadcasts their variables through the Keras backend's collectives.
    ``backend`` (Horovod's Keras 2 backend module) is kept and unused.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs) -> None:
        self.backend = backend
        super().__init__(
            model,
            optimizer,
            broadcast_variables=_broadcast_variables,
            bcast_object=broadcast_object,
            get_rank=rank,
            kind="KerasState",
            **kwargs,
        )

    # JAX's trainer keeps the live values outside the variables during fit:
    # write them back first, and have fit read what restore/sync assign.
    def save(self) -> None:
        _current_backend().sync_model(self.model)
        super().save()

    def restore(self) -> None:
        _current_backend().sync_model(self.model)
        super().restore()

    def sync(self) -> None:
        _current_backend().sync_model(self.model)
        super().sync()


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` every *batches_per_commit* batches and at the end of each epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1) -> None:
        super().__init__()
        if int(batches_per_commit) < 1:
            raise ValueError(
                f"CommitStateCallback: batches_per_commit must be at least 1, "
                f"not {batches_per_commit!r}"
            )
        self.state = state
        self.batches_per_commit = int(batches_per_commit)
        self.batches_remaining = self.batches_per_commit

    def on_train_begin(self, logs=None) -> None:
        self.batches_remaining = self.batches_per_commit  # the same count on every rank

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep ``state.batch`` at the last finished batch of the epoch (0 after an epoch)."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep ``state.epoch`` at the number of finished epochs, counted across resumes."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs=None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch, logs=None) -> None:
        # fit counts from 0 on each call; +1: the finished epoch is not to be repeated.
        self.state.epoch = self.initial_epoch + epoch + 1
