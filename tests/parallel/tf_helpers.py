"""Shared set-up of the TensorFlow test modules: TensorFlow imported quiet and on one
thread per rank (two ranks share this machine's two cores)."""

import os


def single_threaded_tensorflow(stall_shutdown_seconds: int | None = None):
    """Import TensorFlow with its C++ logging quiet and one intra- and one inter-op
    thread; returns the ``tensorflow`` module.  With *stall_shutdown_seconds*, a
    collective that stalls that long fails the test instead of hanging it (hvdlite's
    stall inspector, unless the environment already says otherwise).  Call it before
    hvdlite initializes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if stall_shutdown_seconds is not None:
        os.environ.setdefault("HVDLITE_STALL_SHUTDOWN_TIME_SECONDS", str(stall_shutdown_seconds))
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    return tf
