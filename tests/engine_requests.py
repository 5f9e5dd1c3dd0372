"""Requests and responses for the engine's unit tests (no MPI): :func:`P` builds a
request with defaults for every field, :func:`ok` its success response,
:func:`coordinator` rank 0's coordinator of a job, :func:`join_params` a join;
:func:`allreduce_response` and :func:`entry_of` what the engine's parts hold."""

from __future__ import annotations

import numpy as np

from hvdlite.engine.coordinator import Coordinator
from hvdlite.engine.messages import RESPONSE_OK, Kind, Params, Response
from hvdlite.engine.submissions import Entry
from hvdlite.handles import Handle
from hvdlite.ops import ReduceOp

F32, F64, F16, I32, U8, B = (
    np.dtype(t).str for t in (np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_)
)


def P(
    name="t",
    kind=Kind.ALLREDUCE,
    dtypes=(F32,),
    shapes=((4,),),
    op=ReduceOp.SUM,
    root=-1,
    pre=1.0,
    post=1.0,
    extra=(),
    device="cpu",
    set_id=0,
) -> Params:
    """A request; every field has a default (one float32 allreduce of 4 elements, named t)."""
    return Params(
        set_id,
        name,
        int(kind),
        tuple(dtypes),
        tuple(shapes),
        int(op),
        root,
        pre,
        post,
        tuple(extra),
        device,
    )


def ok(params: Params) -> Response:
    """The success response to ``params``."""
    return Response(RESPONSE_OK, params, params.key)


def coordinator(size=3, sets=None):
    """Rank 0's coordinator of a job of ``size`` ranks, with the global set and ``sets``
    ({set id: members}); returns it and the members by set id."""
    members = {0: frozenset(range(size))}
    members.update(sets or {})
    return Coordinator(size, members.get), members


def join_params():
    """The request of a join."""
    return Params(0, "__join__", int(Kind.JOIN), (), (), 0, -1, 1.0, 1.0, (), "cpu")


def allreduce_response(name, set_id=0):
    """The success response to a float32 allreduce of 4 elements named ``name``."""
    params = Params(
        set_id=set_id, name=name, kind=int(Kind.ALLREDUCE), dtypes=("<f4",), shapes=((4,),)
    )
    return Response(RESPONSE_OK, params, params.key)


def entry_of(response, shape=(4,)):
    """A submitted entry of ``response``'s request (no buffers), with ``shape``."""
    params = response.params._replace(shapes=(shape,))
    return Entry(params, (), (), Handle(params.name))
