"""``hvdlite.keras.callbacks``: Horovod's ``horovod.keras.callbacks`` on Keras 3.

The same classes as :mod:`hvdlite.tensorflow.keras.callbacks` (see there).
"""

from __future__ import annotations

from hvdlite.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    __all__,
)
