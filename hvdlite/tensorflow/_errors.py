"""TensorFlow error classes for collective failures, as Horovod's TF ops raise them.

Horovod's TensorFlow kernels report a cross-rank disagreement (shape, dtype,
root rank, op, ...) as ``tf.errors.FailedPreconditionError`` and a bad argument
(split lengths, a rank outside the process set, an op the collective does not
take) as ``tf.errors.InvalidArgumentError``.  hvdlite raises the same classes:

* eagerly, and at trace time, as :class:`MismatchError` and
  :class:`ArgumentError`, which are also hvdlite's own classes
  (``HorovodInternalError``; ``hvdlite.ArgumentError``, a ``ValueError``), so
  code written against either library catches them;
* inside a graph the error must come out of a TensorFlow kernel: a Python
  exception in a ``numpy_function`` body reaches the caller as ``UnknownError``
  (``InvalidArgumentError`` for a ``ValueError``, which is what bad arguments
  found at run time use).  For a mismatch the body instead returns the message
  as one more output, and :func:`gate` adds a check that fails with
  ``FailedPreconditionError`` carrying it before any output can be used.
  TensorFlow has no public op that fails with that class and a message of our
  choosing; a hash table initialised with the message as a key twice (with two
  different values) is one, so the message shows up inside the table's own
  sentence, on lines of its own.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from hvdlite.exceptions import ArgumentError as _CoreArgumentError
from hvdlite.exceptions import HorovodInternalError
from hvdlite.exceptions import MismatchError as CoreMismatchError

__all__ = ["ArgumentError", "MismatchError", "gate", "is_mismatch", "translated"]


class MismatchError(tf.errors.FailedPreconditionError, CoreMismatchError):
    """Ranks disagreed about a collective (shape, dtype, root, op, ...).

    Raised on every rank of the process set; the job goes on.  A
    ``tf.errors.FailedPreconditionError`` (Horovod's class) and a
    :class:`hvdlite.MismatchError` (a :class:`hvdlite.HorovodInternalError`).
    """

    # OpError's own signature: TensorFlow (autograph) rebuilds errors raised while
    # tracing with these keywords.  Build it with ``MismatchError(message=...)``.
    def __init__(self, node_def=None, op=None, message: str = "", *args):
        super().__init__(node_def, op, message, *args)
        self.args = (message,)


class ArgumentError(tf.errors.InvalidArgumentError, _CoreArgumentError):
    """A collective was called with an argument it cannot take.

    Raised on the calling rank before anything is sent.  A
    ``tf.errors.InvalidArgumentError`` (Horovod's class) and
    :class:`hvdlite.ArgumentError` (a ``ValueError``, what hvdlite raises for
    bad arguments elsewhere).
    """

    def __init__(self, node_def=None, op=None, message: str = "", *args):  # as MismatchError
        super().__init__(node_def, op, message, *args)
        self.args = (message,)


def is_mismatch(error: BaseException) -> bool:
    """True for an engine error that Horovod reports as a failed precondition: the
    ranks disagreed, or a rank's join() made the collective impossible (the core
    raises those as :class:`hvdlite.MismatchError`).  Shutdown, stall
    cancellation and timeouts stay HorovodInternalError."""
    return isinstance(error, CoreMismatchError)


@contextlib.contextmanager
def translated():
    """Re-raise the engine's errors under the TensorFlow class Horovod uses."""
    try:
        yield
    except (MismatchError, ArgumentError):
        raise
    except ValueError as e:  # hvdlite.ArgumentError included
        raise ArgumentError(message=str(e)) from e
    except HorovodInternalError as e:
        if is_mismatch(e):
            raise MismatchError(message=str(e)) from e
        raise


def _fail_with_precondition(message: tf.Tensor) -> tf.Tensor:
    """An op that fails with FailedPreconditionError carrying ``message``."""
    table = tf.raw_ops.AnonymousHashTable(key_dtype=tf.string, value_dtype=tf.int32)
    key = tf.strings.join(["\n", message, "\n"])
    init = tf.raw_ops.InitializeTableV2(
        table_handle=table,
        keys=tf.stack([key, key]),
        values=tf.constant([0, 1]),
        name="HorovodCollectiveFailed",
    )
    with tf.control_dependencies([init]):
        return tf.constant(False)


def gate(outputs: list[tf.Tensor], failure: tf.Tensor) -> list[tf.Tensor]:
    """``outputs``, usable only once ``failure`` (a string scalar) is checked empty.

    A non-empty ``failure`` fails the graph run with FailedPreconditionError.
    """
    check = tf.cond(
        tf.equal(failure, ""), lambda: tf.constant(True), lambda: _fail_with_precondition(failure)
    )
    with tf.control_dependencies([check]):
        return list(tf.identity_n(outputs)) if outputs else []  # one node for all
