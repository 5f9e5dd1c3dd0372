"""Object and variable helpers: ``broadcast_variables``, ``broadcast_object``,
``broadcast_object_fn``, ``allgather_object``.

Cross-rank contract: every member of ``process_set`` calls the helper in the
same order.  ``broadcast_*`` give every member the root's value;
``allgather_object`` gives every member the list of all members' objects in
rank order.  ``session`` arguments exist for Horovod compatibility (TF1) and
are ignored.
"""

from __future__ import annotations

import tensorflow as tf

from hvdlite import basics as _basics
from hvdlite import objects as _objects

from . import _bridge
from .mpi_ops import _broadcast_group_nograd, _check_root, global_process_set

_no_autograph = tf.autograph.experimental.do_not_convert

__all__ = ["broadcast_variables", "broadcast_object", "broadcast_object_fn", "allgather_object"]


@_no_autograph
def broadcast_variables(variables, root_rank, process_set=global_process_set, inplace=False):
    """Assign ``root_rank``'s values to ``variables`` on every member of the set.

    One submission for all variables (TF or Keras variables, any supported
    dtype).  Eagerly the assignments are done on return; in a graph
    (``tf.function`` or ``tf.compat.v1``) the returned op groups them.  In a
    ``tf.compat.v1`` graph the broadcast node stays out of the chain of
    collectives (see :mod:`hvdlite.tensorflow._bridge`): it is meant to be run
    on its own.  ``inplace`` is accepted for Horovod compatibility: the
    assignment is always in place.
    """
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    values = [tf.convert_to_tensor(v) for v in variables]
    for v in values:
        _bridge.check_dtype(v.dtype, "broadcast_variables")
    _check_root(root_rank, process_set, "broadcast_variables")
    name = _bridge.op_name("BroadcastVariables", values, None)
    new = _broadcast_group_nograd(values, root_rank, name, process_set, ordered=False)
    if tf.executing_eagerly():
        if _basics.rank() != root_rank:
            for var, value in zip(variables, new, strict=True):
                var.assign(value)
        return None
    return tf.group(*[var.assign(value) for var, value in zip(variables, new, strict=True)])


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=global_process_set):
    """Every member gets a copy of ``root_rank``'s picklable ``obj``.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    return _objects.broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)


def broadcast_object_fn(root_rank=0, session=None, name=None, process_set=global_process_set):
    """A function ``fn(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod's helper)."""

    def _fn(obj):
        return broadcast_object(obj, root_rank=root_rank, name=name, process_set=process_set)

    return _fn


def allgather_object(obj, session=None, name=None, process_set=global_process_set):
    """Every member gets ``[obj of member 0, obj of member 1, ...]``.

    Unpickles what other ranks send: the ranks must trust each other, as in any MPI job.
    """
    return _objects.allgather_object(obj, name=name, process_set=process_set)
