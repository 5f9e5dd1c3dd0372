"""``hvdlite.tensorflow.keras.callbacks``: the classes of :mod:`hvdlite.keras.callbacks`."""

from __future__ import annotations

from hvdlite.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    __all__,
)
