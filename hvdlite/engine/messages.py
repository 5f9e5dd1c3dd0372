"""What ranks tell the coordinator, and what it answers.

A rank describes each collective it wants to run with a :class:`Params` tuple
(the *request*).  Every field except ``rank`` must agree across the ranks of
the process set — except dim 0 of allgather/alltoall shapes, which may differ
and is exchanged at execution time, so it is left out of the request.  The
coordinator answers with :class:`Response` objects; every rank executes the
same list of responses in the same order.

Params are plain tuples so that comparing two requests (the response cache does
it for every submission) is one C-level tuple comparison, and pickling them for
the coordinator is cheap.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from ..process_sets import GLOBAL_SET_ID

__all__ = [
    "Kind",
    "Params",
    "Response",
    "RESPONSE_OK",
    "RESPONSE_ERROR",
    "describe",
    "JOIN_NAME",
    "JOIN_PARAMS",
    "JOIN_KEY",
    "LEAVE_PARAMS",
    "CACHEABLE",
    "JOINABLE",
    "MISMATCH",
]


class Kind(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5
    JOIN = 6
    ADD_PROCESS_SET = 7
    REMOVE_PROCESS_SET = 8


#: Kinds whose results the response cache may remember (control messages never are).
CACHEABLE = frozenset(
    {
        Kind.ALLREDUCE,
        Kind.ALLGATHER,
        Kind.BROADCAST,
        Kind.ALLTOALL,
        Kind.REDUCESCATTER,
        Kind.BARRIER,
    }
)
#: What may run while some rank of the set is inside join(): allreduce (Adasum
#: included), to which the joined ranks contribute zeros, as in Horovod.  Every
#: other kind fails on the ranks that call it.
JOINABLE = frozenset({Kind.ALLREDUCE})


class Params(NamedTuple):
    """One request: everything about a collective that every rank must agree on.

    Build it by keyword; the fields after ``kind`` default to what a collective
    without tensors (barrier, join, control messages) sends.
    """

    set_id: int
    name: str
    kind: int
    dtypes: tuple = ()  # numpy dtype strings, one per tensor of the (possibly grouped) entry
    shapes: tuple = ()  # one shape per tensor; dim 0 dropped for allgather/alltoall
    op: int = 0  # a ReduceOp for reductions, else 0
    root: int = -1  # global rank for broadcast, else -1
    prescale: float = 1.0
    postscale: float = 1.0
    extra: tuple = ()  # kind-specific agreed data (e.g. the ranks of a new process set)
    device: str = "cpu"  # "cpu" or "cuda"
    # The framework's dtype names where the engine is handed another dtype (torch's CPU
    # float16 and bfloat16 reduced as float32 copies within a node, bfloat16 moved as
    # int16 bits), so that ranks which disagree there are told so; () where the
    # engine sees the dtypes.
    framework_dtypes: tuple = ()
    # The single-tensor fast path, decided once where the request is made
    # (hvdlite._checks.single_host): an allreduce of one host array that reduces in
    # its own dtype, which the executor runs as one bound MPI call when negotiation
    # leaves it alone in its batch.  It follows from the fields above, so ranks that
    # agree on them agree on it (the coordinator need not compare it).
    single_host: bool = False

    @property
    def key(self) -> tuple:
        return (self.set_id, self.name)


#: The name every rank's join() is negotiated under (in the global set).
JOIN_NAME = "__join__"
JOIN_PARAMS = Params(set_id=GLOBAL_SET_ID, name=JOIN_NAME, kind=int(Kind.JOIN))
JOIN_KEY = JOIN_PARAMS.key
#: A rank that left join() before it returned (an exception arrived while it
#: waited: a test's timeout, Ctrl-C) takes its join back with this request: the
#: coordinator stops counting it as joined.
LEAVE_PARAMS = Params(set_id=0, name=JOIN_NAME + ".leave", kind=int(Kind.JOIN), extra=("leave",))


RESPONSE_OK = 0
RESPONSE_ERROR = 1


class Response(NamedTuple):
    """The coordinator's decision about one name: run it (``params``) or fail it (``error``)."""

    status: int
    params: Params | None
    key: tuple
    error: str = ""
    # kind-specific result decided by the coordinator (join: the last rank); for an
    # error, MISMATCH when ranks disagreed (arguments, or a join in the way)
    value: object = None


#: Response.value of an error that means the ranks disagreed about a collective.
MISMATCH = "mismatch"


_FIELD_NAMES = {
    "kind": "collective",
    "dtypes": "dtype",
    "framework_dtypes": "dtype",
    "shapes": "shape",
    "op": "reduction op",
    "root": "root rank",
    "prescale": "prescale_factor",
    "postscale": "postscale_factor",
    "extra": "arguments",
    "device": "device",
}


def describe(field: str, value) -> str:
    """Human wording for one field's value in a mismatch message."""
    if field == "kind":
        return Kind(value).name.lower()
    if field == "op":
        from ..ops import ReduceOp

        return ReduceOp(value).name.capitalize()
    if field == "dtypes" and isinstance(value, tuple):
        import numpy as np

        names = [np.dtype(v).name for v in value]
        return names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    if field == "framework_dtypes" and isinstance(value, tuple):
        return value[0] if len(value) == 1 else "(" + ", ".join(value) + ")"
    if field == "shapes" and isinstance(value, tuple) and len(value) == 1:
        return str(value[0])
    return str(value)


def field_label(field: str) -> str:
    return _FIELD_NAMES.get(field, field)
