"""``hvdlite.keras.elastic``: the same objects as :mod:`hvdlite.tensorflow.keras.elastic`."""

from hvdlite.tensorflow.keras.elastic import (  # noqa: F401
    CommitStateCallback,
    KerasState,
    ObjectState,
    State,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
    __all__,
    run,
    run_fn,
)
