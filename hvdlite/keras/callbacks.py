"""Keras 3 callbacks for data-parallel training, on any Keras backend hvdlite supports.

Horovod's ``horovod.keras.callbacks`` (``hvdlite.tensorflow.keras.callbacks``
holds the same classes).  The collectives go through the Keras backend's
interface (:mod:`hvdlite.keras._select`): variables are broadcast in place,
metrics averaged as numbers.  A callback that touches variables in the middle
of an epoch first has the backend write the training state back into them
(``sync_model``: Keras' JAX trainer keeps it outside the variables).

Cross-rank contract: pass the same callbacks, in the same order, on every
rank (they hold collectives).  Put ``MetricAverageCallback`` before callbacks
that read the epoch's metrics (checkpointing, early stopping, schedules).
"""

from __future__ import annotations

import numpy as np
import keras

from hvdlite.basics import rank, size
from hvdlite.process_sets import global_process_set

from ._select import current as _current_backend

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from ``root_rank``'s model and optimizer state.

    At the start of training it broadcasts the model's variables (and the
    optimizer's, when already built); after the first batch it broadcasts
    whatever did not exist yet (Keras builds lazily, on the first step).
    ``local_variables``: variables each rank keeps as they are (not
    broadcast), as in Horovod; every rank must leave out the same ones.
    ``device`` is accepted for Horovod compatibility and ignored.
    """

    def __init__(self, root_rank, device="", local_variables=None, process_set=global_process_set):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        if local_variables is not None and not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = list(local_variables or [])
        self.process_set = process_set
        self.broadcast_done = False
        self._model_done = False
        self._optimizer_done = False

    def _shared(self, variables):
        local = {id(v) for v in self.local_variables}
        return [v for v in variables if id(v) not in local]

    def _broadcast_what_exists(self):
        model = self.model
        if self._model_done and self._optimizer_done:
            return
        _current_backend().sync_model(model)
        if not self._model_done and model.built and model.variables:
            _current_backend().broadcast_variables(
                self._shared(model.variables), self.root_rank, self.process_set
            )
            self._model_done = True
        optimizer = getattr(model, "optimizer", None)
        if (
            not self._optimizer_done
            and optimizer is not None
            and getattr(optimizer, "built", False)
        ):
            _current_backend().broadcast_variables(
                self._shared(optimizer.variables), self.root_rank, self.process_set
            )
            self._optimizer_done = True

    def on_train_begin(self, logs=None):
        self._broadcast_what_exists()

    def on_batch_end(self, batch, logs=None):
        if self.broadcast_done:
            return
        self._broadcast_what_exists()
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics over all ranks, in place in ``logs``.

    Every numeric entry of the epoch-end ``logs`` is replaced by its mean over
    the ranks (one grouped allreduce, keys in sorted order), so later
    callbacks, the progress bar and ``History`` see the averaged values.
    """

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.device = device
        self.process_set = process_set

    def _average_metrics_in_place(self, logs):
        if not logs:
            return
        keys = sorted(
            k
            for k, v in logs.items()
            if np.asarray(v).dtype.kind in "biuf" and np.asarray(v).size == 1
        )
        if not keys or self.process_set.size() == 1:
            return
        averaged = _current_backend().allreduce_metrics([logs[k] for k in keys], self.process_set)
        for k, v in zip(keys, averaged, strict=True):
            logs[k] = v

    def on_epoch_end(self, epoch, logs=None):
        self._average_metrics_in_place(logs)


def _get_lr(optimizer) -> float:
    return float(np.asarray(keras.ops.convert_to_numpy(optimizer.learning_rate)))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to ``initial_lr * multiplier(epoch)`` between
    ``start_epoch`` and ``end_epoch``.

    ``multiplier`` is a number (exponential decay: ``multiplier ** epoch``) or a
    function of the epoch.  With ``staircase`` the rate changes at epoch starts,
    otherwise every batch (with fractional epochs; needs ``steps_per_epoch`` or
    a known epoch length).  ``momentum_correction`` rescales the optimizer's
    momentum buffers by ``new_lr / old_lr`` whenever the rate changes — the
    effect Horovod obtains by scaling the momentum coefficient for one batch,
    done on the buffers because a Keras 3 optimizer's ``momentum`` is a constant
    of the compiled train step.  The rate is logged as ``lr`` at epoch end.
    """

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
        *args,
    ):
        super().__init__()
        if initial_lr is None:
            raise ValueError("Parameter `initial_lr` is required")
        self.initial_lr = initial_lr
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = None
        self.multiplier = multiplier if callable(multiplier) else (lambda e: multiplier**e)

    def _autodetect_steps_per_epoch(self):
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(
            "Could not autodetect the number of steps per epoch. Please specify the "
            f"steps_per_epoch parameter to the {type(self).__name__}()."
        )

    def _adjust_learning_rate(self, epoch):
        _current_backend().sync_model(self.model)  # JAX: the live rate and momentums
        optimizer = self.model.optimizer
        old_lr = _get_lr(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        try:
            optimizer.learning_rate = new_lr
        except TypeError as e:
            raise ValueError(
                f"{type(self).__name__} needs an optimizer with a float "
                "learning rate, not a LearningRateSchedule."
            ) from e
        if self.momentum_correction and old_lr > 0 and new_lr != old_lr:
            self._correct_momentum(optimizer, new_lr / old_lr)

    @staticmethod
    def _correct_momentum(optimizer, ratio):
        momentum = getattr(optimizer, "momentum", None)
        buffers = getattr(optimizer, "momentums", None)
        if not momentum or not buffers or not getattr(optimizer, "built", False):
            return
        for buf in buffers:
            if buf is not None:
                buf.assign(buf.value * ratio)

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over
    ``warmup_epochs`` (Goyal et al., 2017), updating it every batch."""

    def __init__(
        self,
        initial_lr,
        warmup_epochs=5,
        momentum_correction=True,
        steps_per_epoch=None,
        verbose=0,
        *args,
    ):
        def multiplier(epoch):
            # Shift by one batch so the rate reaches round values at epoch ends.
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0 and rank() == 0:
            print(
                f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                f"{_get_lr(self.model.optimizer):g}."
            )


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keep the best model so far (by ``monitor``), written by rank 0 only.

    Horovod's estimator sets ``filepath`` itself; here pass it (+) or assign
    ``callback.filepath`` before training.  It must end in ``.keras`` or ``.h5``,
    or with ``save_weights_only=True`` in ``.weights.h5`` (Keras 3's rule).
    Every rank tracks the best value (identical after
    ``MetricAverageCallback``); only rank 0 writes.
    """

    def __init__(
        self,
        monitor="val_loss",
        verbose=0,
        save_weights_only=False,
        mode="auto",
        save_freq="epoch",
        filepath=None,
    ):
        placeholder = "unset.weights.h5" if save_weights_only else "unset.keras"
        super().__init__(
            filepath=filepath or placeholder,
            monitor=monitor,
            verbose=verbose if rank() == 0 else 0,
            save_best_only=True,
            save_weights_only=save_weights_only,
            mode=mode,
            save_freq=save_freq,
        )
        self.filepath = filepath

    def on_train_begin(self, logs=None):
        if not self.filepath:
            ending = ".weights.h5" if self.save_weights_only else ".keras"
            raise ValueError(
                f"BestModelCheckpoint needs a filepath (ending in {ending}): "
                "pass filepath=... or set callback.filepath before fit()."
            )
        super().on_train_begin(logs)

    def _save_model(self, epoch, batch, logs):
        _current_backend().sync_model(self.model)  # JAX, mid-epoch: the live weights
        if rank() == 0:
            return super()._save_model(epoch, batch, logs)
        # Other ranks keep `best` in step with rank 0 but write nothing.
        self._should_save_model(epoch, batch, logs, self.filepath)
        return None
