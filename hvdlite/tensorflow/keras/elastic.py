"""``hvdlite.tensorflow.keras.elastic``: the objects of :mod:`hvdlite.keras.elastic`."""

from hvdlite.keras.elastic import (  # noqa: F401
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
