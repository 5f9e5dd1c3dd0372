"""The engine's requests and responses without MPI: their keys and wording, their
round trip through pickle, the dtypes and reduce ops they may carry, how rank lists
read in messages; and that these pure modules import no MPI (the outer pytest
process starts mpiexec jobs and must stay MPI-free)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from engine_requests import F32, I32, B, P, ok

from hvdlite.util.dtypes import BFLOAT16, OWN_WIRE, SUPPORTED, check_dtype, key_of, reduce_dtype
from hvdlite.engine.messages import (
    CACHEABLE,
    JOINABLE,
    RESPONSE_ERROR,
    RESPONSE_OK,
    Kind,
    Response,
    describe,
    field_label,
)
from hvdlite.engine.rank_ranges import describe_ranks, rank_ranges
from hvdlite.ops import ReduceOp, resolve_op


def test_pure_modules_do_not_start_mpi():
    # The modules tested here are pure logic: importing them must not initialize MPI.
    # (Checked in a fresh interpreter: other test files in this run may have started it.)
    code = (
        "import sys, hvdlite.engine.coordinator, hvdlite.engine.response_cache, "
        "hvdlite.engine.fusion, hvdlite.config, hvdlite.engine.messages, hvdlite.handles; "
        "assert 'mpi4py.MPI' not in sys.modules"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )


def test_params_key_and_wording():
    p = P("grad.w", set_id=3)
    assert p.key == (3, "grad.w")
    assert describe("op", int(ReduceOp.SUM)) == "Sum"
    assert describe("op", int(ReduceOp.AVERAGE)) == "Average"
    assert describe("kind", int(Kind.ALLGATHER)) == "allgather"
    assert describe("shapes", ((4, 2),)) == "(4, 2)"
    assert describe("shapes", ((4,), (2,))) == "((4,), (2,))"
    assert describe("root", 2) == "2"
    assert field_label("shapes") == "shape" and field_label("root") == "root rank"
    assert field_label("prescale") == "prescale_factor"
    assert Kind.JOIN not in CACHEABLE and Kind.ALLREDUCE in CACHEABLE
    assert JOINABLE == {Kind.ALLREDUCE}  # as in Horovod: only allreduce runs beside a join


def test_requests_and_responses_survive_the_wire():
    # Requests are gathered and responses broadcast with pickle: round trips are exact,
    # and equal requests compare equal (what the response cache relies on).
    import pickle

    request = P(
        "g",
        dtypes=(F32, I32),
        shapes=((2, 3), (4,)),
        op=ReduceOp.AVERAGE,
        pre=0.5,
        extra=(0, 2),
        set_id=1,
    )
    assert pickle.loads(pickle.dumps(request)) == request
    assert hash(pickle.loads(pickle.dumps(request))) == hash(request)
    for response in (
        ok(request),
        Response(RESPONSE_ERROR, None, (1, "g"), "boom"),
        Response(RESPONSE_OK, request, request.key, value=2),
    ):
        assert pickle.loads(pickle.dumps(response)) == response
    assert P("g") == P("g") and P("g") != P("g", pre=2.0)


def test_supported_dtypes():
    for t in (
        np.uint8,
        np.int8,
        np.uint16,
        np.int16,
        np.int32,
        np.int64,
        np.float16,
        np.float32,
        np.float64,
        np.bool_,
    ):
        assert check_dtype(np.zeros(1, t), "allreduce") == np.dtype(t).str
    # bfloat16 (numpy's, from ml_dtypes) is keyed by its name, which np.dtype() reads back:
    # its dtype.str ('<V2') does not name it
    assert check_dtype(np.zeros(1, BFLOAT16), "allreduce") == "bfloat16" == key_of(BFLOAT16)
    assert np.dtype("bfloat16") == BFLOAT16 and reduce_dtype("bfloat16") == np.float32
    assert "bfloat16" not in OWN_WIRE  # reduced in a float32 copy, never in place
    assert len(SUPPORTED) == 11  # Horovod's dtypes and bfloat16


@pytest.mark.parametrize(
    "t", [np.uint32, np.uint64, np.complex64, np.complex128, object, "U3", "datetime64[s]"]
)
def test_unsupported_dtypes_name_the_fix(t):
    with pytest.raises(ValueError) as info:
        check_dtype(np.zeros(1, t), "allgather")
    msg = str(info.value)
    assert msg.startswith("allgather:") and "not supported" in msg and "astype" in msg


def test_bool_reductions_only_logical():
    arr = np.zeros(2, np.bool_)
    for op in (ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT):
        assert check_dtype(arr, "allreduce", op) == B
    for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.ADASUM):
        with pytest.raises(ValueError, match="bool"):
            check_dtype(arr, "allreduce", op)
    assert check_dtype(arr, "broadcast") == B  # no op: moving bools is fine


def test_resolve_op():
    assert resolve_op(None, None) == ReduceOp.AVERAGE
    assert resolve_op(None, True) == ReduceOp.AVERAGE
    assert resolve_op(None, False) == ReduceOp.SUM
    assert resolve_op(ReduceOp.MAX, None) == ReduceOp.MAX
    assert resolve_op(1, None) == ReduceOp.SUM
    with pytest.raises(ValueError, match="average"):
        resolve_op(ReduceOp.SUM, True)
    with pytest.raises(ValueError, match="reduction op"):
        resolve_op("sum", None)
    with pytest.raises(ValueError, match="reduction op"):
        resolve_op(99, None)


def test_rank_lists_in_messages_are_ranges():
    assert rank_ranges([]) == ""
    assert describe_ranks([3]) == "rank 3"
    assert describe_ranks([2, 0]) == "ranks 0, 2"  # two ranks read as before
    assert describe_ranks(range(3, 32)) == "ranks 3-31"
    assert rank_ranges([12, 0, 2, 3, 4, 5, 9, 10, 2]) == "0, 2-5, 9, 10, 12"
