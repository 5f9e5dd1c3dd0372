"""Unit tests of the engine's pure logic, in one process and without MPI.

Message wording, the coordinator's agreement checks and decisions (including
join and the stall report), the response cache's determinism, the fusion
router, knob parsing and dtype rules.  These modules import no mpi4py, and
this file must not import the ones that do (engine, executor, collectives):
the outer pytest process starts mpiexec jobs and must stay MPI-free.
"""

from __future__ import annotations

import random
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdlite import config
from hvdlite.engine.coordinator import Coordinator, check_agreement
from hvdlite.util.dtypes import SUPPORTED, check_dtype, reduce_dtype
from hvdlite.device.buffers import BufferPool
from hvdlite.engine.fusion import nbytes_of, plan_batches
from hvdlite.engine.rank_ranges import describe_ranks, rank_ranges
from hvdlite.engine.messages import (
    CACHEABLE,
    JOINABLE,
    LEAVE_PARAMS,
    RESPONSE_ERROR,
    RESPONSE_OK,
    Kind,
    Params,
    Response,
    describe,
    field_label,
)
from hvdlite.ops import ReduceOp, resolve_op
from hvdlite.engine.response_cache import HIT, INVALID, MISS, ResponseCache, set_bits

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
    return Response(RESPONSE_OK, params, params.key)


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


# ------------------------------------------------------------------ messages
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


# --------------------------------------------------------- check_agreement
def test_agreement_when_all_equal():
    assert check_agreement("t", {0: P(), 1: P(), 2: P()}) is None


@pytest.mark.parametrize(
    "field,odd,label,odd_text,common_text",
    [
        ("shapes", {"shapes": ((5,),)}, "shape", "(5,)", "(4,)"),
        ("dtypes", {"dtypes": (F64,)}, "dtype", "float64", "float32"),
        ("op", {"op": ReduceOp.MAX}, "reduction op", "Max", "Sum"),
        ("root", {"root": 1}, "root rank", "1", "-1"),
        ("prescale", {"pre": 0.5}, "prescale_factor", "0.5", "1.0"),
        ("postscale", {"post": 2.0}, "postscale_factor", "2.0", "1.0"),
        ("kind", {"kind": Kind.BROADCAST}, "collective", "broadcast", "allreduce"),
        ("device", {"device": "cuda"}, "device", "cuda", "cpu"),
    ],
)
def test_mismatch_message_names_field_and_ranks(field, odd, label, odd_text, common_text):
    per_rank = {0: P("w"), 1: P("w", **odd), 2: P("w")}
    msg = check_agreement("w", per_rank)
    assert msg is not None
    assert f"Mismatched {label}" in msg
    assert "'w'" in msg
    assert f"rank 1: {odd_text}" in msg
    assert f"ranks 0, 2: {common_text}" in msg
    assert "must submit" in msg  # says what to do


def test_first_differing_field_is_reported():
    # kind is checked before shape: a different collective is the real problem.
    msg = check_agreement("x", {0: P("x"), 1: P("x", kind=Kind.ALLGATHER, shapes=((9,),))})
    assert "Mismatched collective" in msg and "shape" not in msg.split(":")[0]


def test_three_way_mismatch_lists_every_value():
    msg = check_agreement(
        "x", {0: P("x", shapes=((1,),)), 1: P("x", shapes=((2,),)), 2: P("x", shapes=((3,),))}
    )
    for r, s in ((0, 1), (1, 2), (2, 3)):
        assert f"rank {r}: ({s},)" in msg


# ------------------------------------------------------------- Coordinator
def coordinator(size=3, sets=None):
    members = {0: frozenset(range(size))}
    members.update(sets or {})
    return Coordinator(size, members.get), members


def test_coordinator_waits_for_every_rank_then_answers_once():
    c, _ = coordinator()
    assert c.process([(0, [P("a")]), (1, [P("a")]), (2, [])]) == []
    assert c.pending_names() == {(0, "a"): [0, 1]}
    responses = c.process([(0, []), (1, []), (2, [P("a")])])
    assert [(r.status, r.key) for r in responses] == [(RESPONSE_OK, (0, "a"))]
    assert responses[0].params == P("a")
    assert c.pending_names() == {}
    assert c.process([(0, []), (1, []), (2, [])]) == []


def test_coordinator_mismatch_is_an_error_response_and_forgets_the_name():
    c, _ = coordinator(2)
    responses = c.process([(0, [P("a")]), (1, [P("a", shapes=((3,),))])])
    assert len(responses) == 1 and responses[0].status == RESPONSE_ERROR
    assert "shape" in responses[0].error and "rank 1: (3,)" in responses[0].error
    assert c.pending_names() == {}
    # The name can be negotiated again afterwards.
    responses = c.process([(0, [P("a")]), (1, [P("a")])])
    assert responses[0].status == RESPONSE_OK


def test_coordinator_response_order_is_submission_order():
    c, _ = coordinator(2)
    c.process([(0, [P("x"), P("y"), P("z")]), (1, [])])
    responses = c.process([(0, []), (1, [P("z"), P("y"), P("x")])])
    assert [r.key[1] for r in responses] == ["x", "y", "z"]


def test_coordinator_process_sets_need_only_their_members():
    c, _ = coordinator(3, {1: frozenset({0, 1}), 2: frozenset({1, 2})})
    responses = c.process(
        [(0, [P("a", set_id=1)]), (1, [P("a", set_id=1), P("a", set_id=2)]), (2, [])]
    )
    assert [r.key for r in responses] == [(1, "a")]
    responses = c.process([(0, []), (1, []), (2, [P("a", set_id=2)])])
    assert [r.key for r in responses] == [(2, "a")]


def test_coordinator_rejects_outsiders_and_unknown_sets():
    c, _ = coordinator(3, {1: frozenset({0, 1})})
    responses = c.process([(2, [P("a", set_id=1)])])
    assert responses[0].status == RESPONSE_ERROR and "[2]" in responses[0].error
    assert "not members" in responses[0].error
    responses = c.process([(0, [P("b", set_id=7)])])
    assert responses[0].status == RESPONSE_ERROR and "not registered" in responses[0].error


def join_params():
    return Params(0, "__join__", int(Kind.JOIN), (), (), 0, -1, 1.0, 1.0, (), "cpu")


def test_join_lets_the_others_reduce_and_returns_the_last_rank():
    c, _ = coordinator(3)
    assert c.process([(0, [join_params()]), (1, []), (2, [])]) == []
    assert c.joined == [0]
    # allreduce from ranks 1 and 2 runs without the joined rank 0
    responses = c.process([(0, []), (1, [P("g")]), (2, [P("g")])])
    assert [(r.status, r.key) for r in responses] == [(RESPONSE_OK, (0, "g"))]
    # a broadcast cannot run while a rank is joined
    responses = c.process(
        [
            (0, []),
            (1, [P("b", kind=Kind.BROADCAST, root=1)]),
            (2, [P("b", kind=Kind.BROADCAST, root=1)]),
        ]
    )
    assert responses[0].status == RESPONSE_ERROR and "join" in responses[0].error
    assert "[0]" in responses[0].error
    c.process([(0, []), (1, []), (2, [join_params()])])
    responses = c.process([(0, []), (1, [join_params()]), (2, [])])
    assert len(responses) == 1 and responses[0].params.kind == Kind.JOIN
    assert responses[0].value == 1  # rank 1 joined last
    assert c.joined == []


def test_join_in_one_cycle_counts_the_highest_rank_last():
    c, _ = coordinator(3)
    responses = c.process([(0, [join_params()]), (1, [join_params()]), (2, [join_params()])])
    assert responses[-1].value == 2


def test_a_non_joinable_kind_fails_at_once_while_a_rank_has_joined():
    # Rank 2 may never submit the same name (an unnamed call is numbered by the calls
    # before it, and rank 0 skipped one): rank 1's broadcast fails without waiting.
    c, _ = coordinator(3)
    c.process([(0, [join_params()])])
    responses = c.process([(1, [P("b", kind=Kind.BROADCAST, root=1)])])
    assert [(r.status, r.key) for r in responses] == [(RESPONSE_ERROR, (0, "b"))]
    assert "join" in responses[0].error and c.pending_names() == {}
    # rank 2's call, under another name, fails as well
    responses = c.process([(2, [P("b2", kind=Kind.ALLGATHER)])])
    assert [(r.status, r.key) for r in responses] == [(RESPONSE_ERROR, (0, "b2"))]


def test_a_left_join_is_no_longer_counted():
    c, _ = coordinator(3)
    c.process([(0, [join_params()]), (2, [join_params()])])
    assert c.joined == [0, 2]
    c.process([(0, [LEAVE_PARAMS])])
    assert c.joined == [2]
    # the join ends once rank 0 has joined again, the last of the three
    assert c.process([(1, [join_params()])]) == []
    responses = c.process([(0, [join_params()])])
    assert [(r.params.kind, r.value) for r in responses] == [(Kind.JOIN, 0)]
    assert c.joined == []


def test_join_and_leave_in_one_cycle_leave_nothing_joined():
    c, _ = coordinator(2)
    assert c.process([(0, [join_params(), LEAVE_PARAMS]), (1, [join_params()])]) == []
    assert c.joined == [1]


# ------------------------------------------------------------- stall report
def test_stall_report_lists_missing_ranks_and_their_names():
    c, _ = coordinator(3)
    pending = {0: [((0, "a"), 5.0), ((0, "b"), 5.0)], 1: [((0, "a"), 4.0)], 2: []}
    report, errors = c.stall_report(pending, warn_after=1.0, fail_after=0.0)
    assert errors == []
    assert "rank 1: [b]" in report and "rank 2: [a, b]" in report
    assert "rank 0:" not in report
    assert "HVDLITE_CHECK_ORDER=1" in report and "What to check" in report  # the hint
    assert c.stalled_ranks == {1, 2}


def test_stall_report_quiet_before_the_warning_time():
    c, _ = coordinator(2)
    report, errors = c.stall_report({0: [((0, "a"), 0.5)], 1: []}, 1.0, 3.0)
    assert report == "" and errors == []


def test_stall_report_cancels_after_the_shutdown_time():
    c, _ = coordinator(2)
    c.process([(0, [P("a")]), (1, [])])
    report, errors = c.stall_report({0: [((0, "a"), 3.5)], 1: []}, 1.0, 3.0)
    assert "rank 1: [a]" in report
    assert len(errors) == 1 and errors[0].status == RESPONSE_ERROR and errors[0].key == (0, "a")
    assert "Stalled" in errors[0].error and "[0]" in errors[0].error and "[1]" in errors[0].error
    assert c.pending_names() == {}  # the coordinator forgot it: it can be submitted again


class _Rank0Comm:
    """Rank 0's side of the control communicator of a job of *others* + 1 ranks, whose
    other ranks send *their* request lists (for the digest and the gather)."""

    def __init__(self, theirs):
        self.theirs = theirs
        self.gathered = False

    def Get_size(self):
        return len(self.theirs) + 1

    def Allreduce(self, _, vector, op):
        from hvdlite.engine import negotiation

        for requests in self.theirs:
            other = vector.copy()
            negotiation._everyone_sent(_Local(other), requests, spoil=False)
            vector &= other

    def gather(self, item, root=0):
        self.gathered = True
        return [item] + [(requests, None) for requests in self.theirs]

    def bcast(self, value, root=0):
        return value


class _Local:
    """A communicator of one rank that leaves the digest vector as it was built."""

    def __init__(self, out):
        self.out = out

    def Allreduce(self, _, vector, op):
        self.out[:] = vector


def _negotiate_on_rank0(mine, theirs, joined=False):
    from types import SimpleNamespace

    from hvdlite.engine.negotiation import negotiate

    c, _ = coordinator(len(theirs) + 1)
    if joined:
        c.joined = [len(theirs)]
    comm = _Rank0Comm(theirs)
    entries = [SimpleNamespace(params=p, sent=False) for p in mine]
    responses = negotiate(comm, entries, {}, c, False, None, None)
    return responses, comm.gathered


def test_a_cold_cycle_alike_on_every_rank_is_decided_by_rank_0_alone():
    alike = [P("a"), P("b", kind=Kind.ALLGATHER)]
    responses, gathered = _negotiate_on_rank0(alike, [list(alike)] * 31)
    assert not gathered and responses == [ok(p) for p in alike]
    # One rank's list differs (or a rank has joined): the coordinator needs every list.
    responses, gathered = _negotiate_on_rank0(alike, [list(alike)] * 30 + [[P("a")]])
    assert gathered and responses == [ok(alike[0])]
    _, gathered = _negotiate_on_rank0(alike, [list(alike)] * 31, joined=True)
    assert gathered


def test_only_new_global_collectives_without_joined_ranks_are_decided_alone():
    c, _ = coordinator(3, {1: frozenset({0, 1})})
    assert c.decides_alone([P("a"), P("b", kind=Kind.BROADCAST, root=2)])
    assert not c.decides_alone([P("s", set_id=1)])  # a set of some ranks only
    assert not c.decides_alone([join_params()])
    c.process([(1, [P("x")])])  # rank 1 asked for x in an earlier cycle
    assert not c.decides_alone([P("x")])
    assert c.process_unanimous([P("a")]) == [ok(P("a"))]


def test_rank_lists_in_messages_are_ranges():
    assert rank_ranges([]) == ""
    assert describe_ranks([3]) == "rank 3"
    assert describe_ranks([2, 0]) == "ranks 0, 2"  # two ranks read as before
    assert describe_ranks(range(3, 32)) == "ranks 3-31"
    assert rank_ranges([12, 0, 2, 3, 4, 5, 9, 10, 2]) == "0, 2-5, 9, 10, 12"


def test_stall_report_at_32_ranks_names_ranges_not_ranks():
    c, _ = coordinator(32)
    pending = {0: [((0, "a"), 5.0), ((0, "b"), 5.0)], 1: [((0, "a"), 5.0)], 2: [((0, "a"), 5.0)]}
    pending.update({r: [] for r in range(3, 32)})
    report, errors = c.stall_report(pending, warn_after=1.0, fail_after=2.0)
    assert "ranks 1, 2: [b]" in report and "ranks 3-31: [a, b]" in report
    assert len(report.splitlines()) == 4  # the header, one line per distinct list, the hint
    assert len(errors) == 2
    assert "ranks [0-2] submitted it, ranks [3-31] never did" in errors[0].error


def test_stall_report_names_the_hosts_of_missing_ranks():
    c, _ = coordinator(32)
    c.hosts = [f"node{r // 2}" for r in range(32)]  # two ranks per host
    pending = {0: [((0, "a"), 5.0)], 1: [((0, "a"), 5.0)], 2: [((0, "a"), 5.0)]}
    pending.update({r: [] for r in range(3, 32)})
    pending[3] = [((0, "a"), 5.0)]
    pending[5] = [((0, "a"), 5.0)]
    report, errors = c.stall_report(pending, warn_after=1.0, fail_after=2.0)
    assert "ranks 4, 6-31 (on node2, node3, node4, node5, node6, node7, node8, node9 and " in report
    c2, _ = coordinator(4)
    c2.hosts = ["h1", "h1", "h2", "h3"]
    report, errors = c2.stall_report(
        {0: [((0, "a"), 5.0)], 1: [((0, "a"), 5.0)], 2: [((0, "a"), 5.0)], 3: []}, 1.0, 2.0
    )
    assert "rank 3 (on h3): [a]" in report
    assert "ranks [0-2] submitted it, ranks [3] (on h3) never did" in errors[0].error


def test_stall_report_ignores_joined_ranks_and_other_sets_members():
    c, _ = coordinator(3, {1: frozenset({0, 1})})
    c.process([(2, [join_params()])])
    pending = {0: [((0, "g"), 9.0), ((1, "s"), 9.0)], 1: [((0, "g"), 9.0)], 2: []}
    report, _ = c.stall_report(pending, 1.0, 0.0)
    assert "rank 2" not in report  # joined: not missing anything
    assert "rank 1: [s]" in report  # rank 1 is in set 1 and has not submitted 's'


def test_stall_report_truncates_long_lists():
    c, _ = coordinator(2)
    pending = {0: [((0, f"n{i:02d}"), 2.0) for i in range(13)], 1: []}
    report, _ = c.stall_report(pending, 1.0, 0.0)
    assert "(and 3 more)" in report


# ----------------------------------------------------------- response cache
def test_cache_hit_miss_invalid():
    cache = ResponseCache(4)
    assert cache.lookup(P("a")) == (MISS, -1)
    assert cache.put(ok(P("a"))) is None
    state, bit = cache.lookup(P("a"))
    assert state == HIT and cache.get(bit).params == P("a")
    assert cache.lookup(P("a", shapes=((5,),))) == (INVALID, bit)
    assert cache.lookup(P("a", op=ReduceOp.MAX))[0] == INVALID
    assert len(cache) == 1 and cache.num_bits == 1


def test_cache_disabled_with_capacity_zero():
    cache = ResponseCache(0)
    assert cache.put(ok(P("a"))) is None
    assert cache.lookup(P("a")) == (MISS, -1)
    assert len(cache) == 0 and cache.num_bits == 0


def test_cache_evicts_least_recently_used():
    cache = ResponseCache(2)
    cache.put(ok(P("a")))
    cache.put(ok(P("b")))
    bit_a = cache.lookup(P("a"))[1]
    cache.touch(bit_a)  # a is now more recent than b
    bit_b = cache.lookup(P("b"))[1]
    assert cache.put(ok(P("c"))) == bit_b
    assert cache.lookup(P("b"))[0] == MISS
    assert cache.lookup(P("a"))[0] == HIT and cache.lookup(P("c"))[0] == HIT
    assert cache.lookup(P("c"))[1] == bit_b  # the freed bit is reused
    assert cache.num_bits == 2


def test_cache_put_same_key_updates_in_place():
    cache = ResponseCache(2)
    cache.put(ok(P("a")))
    bit = cache.lookup(P("a"))[1]
    assert cache.put(ok(P("a", shapes=((9,),)))) is None
    assert cache.lookup(P("a", shapes=((9,),))) == (HIT, bit)
    assert len(cache) == 1


def test_cache_version_changes_only_when_a_bit_changes_meaning():
    cache = ResponseCache(2)
    v0 = cache.version
    cache.put(ok(P("a")))
    bit = cache.lookup(P("a"))[1]
    v1 = cache.version
    assert v1 == v0  # a bit never used before: what other bits mean is unchanged
    cache.touch(bit)
    cache.lookup(P("a"))
    cache.get(bit)
    assert cache.version == v1  # reads and LRU order do not count
    cache.put(ok(P("a", shapes=((9,),))))
    v2 = cache.version
    assert v2 != v1
    cache.erase(bit)
    v3 = cache.version
    assert v3 != v2
    cache.put(ok(P("b")))  # takes the freed bit: erasing it already counted
    assert cache.lookup(P("b")) == (HIT, bit)
    cache.put(ok(P("c")))
    cache.put(ok(P("d")))  # evicts the older of the two: a bit changes meaning
    assert cache.version != v3


def test_set_bits_lists_positions_ascending():
    assert set_bits(0) == []
    assert set_bits(1) == [0]
    assert set_bits(0b1011000) == [3, 4, 6]
    rng = random.Random(7)
    for _ in range(50):
        mask = rng.getrandbits(700)
        assert set_bits(mask) == [b for b in range(700) if mask >> b & 1]


def test_set_bits_of_sparse_wide_and_dense_masks():
    # Each of its three ways: a few bits high up, many bits in a wide mask, a narrow dense one.
    for mask in (
        1 << 1000,
        (1 << 1000) | (1 << 3) | 1,
        ((1 << 200) - 1) << 1000,
        (1 << 300) - 1,
        (1 << 64) - 1,
        (1 << 2000) - 1,
    ):
        assert set_bits(mask) == [b for b in range(mask.bit_length()) if mask >> b & 1]


def test_cache_touch_all_orders_eviction_like_touch():
    a, b = ResponseCache(3), ResponseCache(3)
    for cache in (a, b):
        for i in range(3):
            cache.put(ok(P(f"n{i}")))
    a.touch_all([0, 2])
    b.touch(0)
    b.touch(2)
    assert a.put(ok(P("n3"))) == b.put(ok(P("n3"))) == 1


def test_cache_erase_and_erase_set():
    cache = ResponseCache(8)
    for name in ("a", "b", "c"):
        cache.put(ok(P(name)))
    bit_b = cache.lookup(P("b"))[1]
    cache.erase(bit_b)
    cache.erase(bit_b)  # erasing twice is harmless
    assert cache.lookup(P("b"))[0] == MISS and len(cache) == 2
    assert cache.erase_set(0) and len(cache) == 0
    assert cache.erase_set(5) == []


def test_cache_remembers_every_process_set_by_set_and_name():
    # Non-members treat a smaller set's bits as set (the engine's foreign mask), so
    # responses of every set are cached, keyed by (set id, name).
    cache = ResponseCache(8)
    assert cache.put(ok(P("a", set_id=2))) is None
    state, bit = cache.lookup(P("a", set_id=2))
    assert state == HIT and cache.bit_of((2, "a")) == bit
    assert cache.lookup(P("a", set_id=0)) == (MISS, -1)
    assert len(cache) == 1


def test_cache_bit_assignment_is_deterministic():
    # Two ranks applying the same sequence of puts/touches/erases agree on every bit.
    rng = random.Random(7)
    ops = []
    for _ in range(400):
        choice = rng.random()
        name = f"n{rng.randrange(12)}"
        if choice < 0.6:
            ops.append(("put", name, rng.randrange(3)))
        elif choice < 0.85:
            ops.append(("touch", name, 0))
        else:
            ops.append(("erase", name, 0))

    def replay():
        cache = ResponseCache(5)
        history = []
        for op, name, variant in ops:
            state, bit = cache.lookup(P(name, shapes=((variant + 1,),)))
            if op == "put":
                history.append(("evicted", cache.put(ok(P(name, shapes=((variant + 1,),))))))
            elif bit >= 0 and op == "touch":
                cache.touch(bit)
            elif bit >= 0:
                cache.erase(bit)
            history.append((state, bit, len(cache)))
        return history, sorted(cache._bit_of.items())

    assert replay() == replay()
    history, table = replay()
    assert len(table) <= 5
    assert any(e[0] == "evicted" and e[1] is not None for e in history)


# ------------------------------------------------------------------ fusion
def test_plan_fuses_same_kind_dtype_op_up_to_the_threshold():
    responses = [ok(P(f"t{i}", shapes=((4,),))) for i in range(10)]  # 16 bytes each
    assert [len(b) for b in plan_batches(responses, 64)] == [4, 4, 2]
    assert [len(b) for b in plan_batches(responses, 1 << 20)] == [10]
    assert [len(b) for b in plan_batches(responses, 0)] == [1] * 10  # 0 disables fusion
    # Batches keep submission order inside and across.
    flat = [r.key[1] for b in plan_batches(responses, 64) for r in b]
    assert flat == [f"t{i}" for i in range(10)]


def test_plan_never_fuses_across_kind_set_op_dtype_or_root():
    responses = [
        ok(P("a")),
        ok(P("b", dtypes=(F64,))),
        ok(P("c", op=ReduceOp.MAX)),
        ok(P("d", set_id=1)),
        ok(P("e", kind=Kind.ALLGATHER)),
        ok(P("f", kind=Kind.BROADCAST, root=0)),
        ok(P("g", kind=Kind.BROADCAST, root=1)),
        ok(P("h")),
        ok(P("i", kind=Kind.BROADCAST, root=0)),
    ]
    batches = plan_batches(responses, 1 << 20)
    names = [[r.key[1] for r in b] for b in batches]
    assert names == [["a", "h"], ["b"], ["c"], ["d"], ["e"], ["f", "i"], ["g"]]


def test_plan_float16_fuses_with_float32_on_the_wire():
    batches = plan_batches([ok(P("a", dtypes=(F16,))), ok(P("b", dtypes=(F32,)))], 1 << 20)
    assert [len(b) for b in batches] == [2]
    assert reduce_dtype(F16) == np.float32 and reduce_dtype(B) == np.uint8
    assert reduce_dtype(I32) == np.int32


def test_plan_keeps_errors_alltoall_adasum_barrier_and_mixed_groups_alone():
    err = Response(RESPONSE_ERROR, None, (0, "bad"), "boom")
    responses = [
        ok(P("a")),
        err,
        ok(P("b", kind=Kind.ALLTOALL)),
        ok(P("c")),
        ok(P("d", op=ReduceOp.ADASUM)),
        ok(P("e", kind=Kind.BARRIER, dtypes=(), shapes=())),
        ok(P("f", dtypes=(F32, I32), shapes=((2,), (2,)))),
        ok(P("g")),
    ]
    names = [[r.key[1] for r in b] for b in plan_batches(responses, 1 << 20)]
    assert names == [["a", "c", "g"], ["bad"], ["b"], ["d"], ["e"], ["f"]]


def test_plan_oversized_response_runs_alone():
    responses = [ok(P("small")), ok(P("huge", shapes=((1000,),))), ok(P("small2"))]
    names = [[r.key[1] for r in b] for b in plan_batches(responses, 64)]
    assert names == [["small"], ["huge"], ["small2"]]  # packing is sequential
    for batch in plan_batches(responses, 64):
        assert len(batch) == 1 or sum(nbytes_of(r.params) for r in batch) <= 64


def test_plan_is_a_pure_function_of_the_responses():
    rng = random.Random(3)
    kinds = [Kind.ALLREDUCE, Kind.ALLGATHER, Kind.BROADCAST, Kind.REDUCESCATTER, Kind.ALLTOALL]
    responses = [
        ok(
            P(
                f"r{i}",
                kind=rng.choice(kinds),
                dtypes=(rng.choice([F32, F64, I32]),),
                shapes=((rng.randrange(1, 50),),),
                root=rng.randrange(2),
            )
        )
        for i in range(200)
    ]
    first = plan_batches(responses, 512)
    assert first == plan_batches(list(responses), 512)
    assert sorted(r.key for b in first for r in b) == sorted(r.key for r in responses)
    for batch in first:
        if len(batch) > 1:
            assert sum(nbytes_of(r.params) for r in batch) <= 512


def test_nbytes_and_buffer_pool():
    assert nbytes_of(P(dtypes=(F32, F64), shapes=((2, 3), (4,)))) == 6 * 4 + 4 * 8
    pool = BufferPool()
    a = pool.get(np.float32, 10)
    assert a.shape == (10,) and a.dtype == np.float32
    b = pool.get(np.float32, 5)
    assert np.shares_memory(a, b)  # reused, not reallocated
    c = pool.get(np.float32, 100)
    assert c.shape == (100,)
    assert not np.shares_memory(pool.get(np.float32, 4, slot=1), pool.get(np.float32, 4))
    pool.clear()


# ------------------------------------------------------------------- config
def test_defaults_from_an_empty_environment():
    cfg = config.read_config({})
    assert cfg == config.Config()
    assert cfg.fusion_threshold == 64 * 1024 * 1024 and cfg.cache_capacity == 1024
    assert cfg.stall_check_time_seconds == 60.0 and cfg.stall_shutdown_time_seconds == 0.0


def test_every_knob_has_a_horovod_name_and_a_config_field():
    fields = {f.name for f in config.dataclasses.fields(config.Config)}
    for knob in config.KNOBS:
        assert knob.env.startswith("HVDLITE_")
        assert knob.horovod_env == "HOROVOD_" + knob.env[len("HVDLITE_") :]
        assert knob.attr in fields
        assert getattr(config.Config(), knob.attr) == knob.default


def test_a_message_names_the_variable_that_set_a_knob():
    assert config.variable_of("timeline", {"HOROVOD_TIMELINE": "t.json"}) == "HOROVOD_TIMELINE"
    both = {"HOROVOD_TIMELINE": "a", "HVDLITE_TIMELINE": "b"}
    assert config.variable_of("timeline", both) == "HVDLITE_TIMELINE"
    assert config.variable_of("timeline", {}) == "HVDLITE_TIMELINE"


def test_horovod_names_accepted_and_hvdlite_wins():
    cfg = config.read_config({"HOROVOD_FUSION_THRESHOLD": "1024", "HOROVOD_CACHE_CAPACITY": "7"})
    assert cfg.fusion_threshold == 1024 and cfg.cache_capacity == 7
    cfg = config.read_config(
        {"HOROVOD_FUSION_THRESHOLD": "1024", "HVDLITE_FUSION_THRESHOLD": "2048"}
    )
    assert cfg.fusion_threshold == 2048
    knob = next(k for k in config.KNOBS if k.attr == "cycle_time_ms")
    assert config.env_value(knob, {"HOROVOD_CYCLE_TIME": "3"}) == "3"
    assert config.env_value(knob, {"HOROVOD_CYCLE_TIME": "3", "HVDLITE_CYCLE_TIME": "4"}) == "4"
    assert config.env_value(knob, {}) is None


@pytest.mark.parametrize(
    "raw,value",
    [
        ("1", True),
        ("true", True),
        ("YES", True),
        ("on", True),
        ("0", False),
        ("false", False),
        ("off", False),
        ("", False),
    ],
)
def test_bool_knobs(raw, value):
    assert (
        config.read_config({"HVDLITE_HIERARCHICAL_ALLREDUCE": raw}).hierarchical_allreduce is value
    )


def test_numbers_and_strings():
    cfg = config.read_config(
        {
            "HVDLITE_FUSION_THRESHOLD": " 1e6 ",
            "HVDLITE_CYCLE_TIME": "0.5",
            "HVDLITE_LOG_LEVEL": "debug",
            "HVDLITE_TIMELINE": "timeline.json",
            "HVDLITE_STALL_CHECK_TIME_SECONDS": "1",
            "HVDLITE_STALL_SHUTDOWN_TIME_SECONDS": "3",
            "HVDLITE_TEST_NODE_SIZE": "2",
            "HVDLITE_CACHE_CAPACITY": "",
        }
    )
    assert cfg.fusion_threshold == 1_000_000 and cfg.cycle_time_ms == 0.5
    assert cfg.log_level == "DEBUG" and cfg.timeline == "timeline.json"
    assert cfg.stall_check_time_seconds == 1.0 and cfg.stall_shutdown_time_seconds == 3.0
    assert cfg.test_node_size == 2
    assert cfg.cache_capacity == 1024  # empty: the default


@pytest.mark.parametrize(
    "raw,value",
    [
        ("auto", "auto"),
        ("", "auto"),
        (" ON ", "on"),
        ("1", "on"),
        ("true", "on"),
        ("off", "off"),
        ("0", "off"),
        ("no", "off"),
    ],
)
def test_overlap_knob(raw, value):
    assert config.read_config({"HVDLITE_OVERLAP": raw}).overlap == value
    assert config.read_config({"HOROVOD_OVERLAP": raw}).overlap == value


@pytest.mark.parametrize(
    "env,var",
    [
        ({"HVDLITE_FUSION_THRESHOLD": "lots"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HOROVOD_FUSION_THRESHOLD": "lots"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HVDLITE_FUSION_THRESHOLD": "-1"}, "HVDLITE_FUSION_THRESHOLD"),
        ({"HVDLITE_CACHE_CAPACITY": "-3"}, "HVDLITE_CACHE_CAPACITY"),
        ({"HVDLITE_CYCLE_TIME": "0"}, "HVDLITE_CYCLE_TIME"),
        ({"HVDLITE_CYCLE_TIME": "fast"}, "HVDLITE_CYCLE_TIME"),
        ({"HVDLITE_STALL_CHECK_DISABLE": "maybe"}, "HVDLITE_STALL_CHECK_DISABLE"),
        ({"HVDLITE_LOG_LEVEL": "LOUD"}, "HVDLITE_LOG_LEVEL"),
        ({"HVDLITE_TEST_NODE_SIZE": "-2"}, "HVDLITE_TEST_NODE_SIZE"),
        ({"HVDLITE_OVERLAP": "sometimes"}, "HVDLITE_OVERLAP"),
    ],
)
def test_bad_values_raise_value_error_naming_the_variable(env, var):
    with pytest.raises(ValueError) as info:
        config.read_config(env)
    assert var in str(info.value)


def test_bad_bool_message_says_what_is_valid():
    with pytest.raises(ValueError, match="0 or 1"):
        config.read_config({"HVDLITE_DYNAMIC_PROCESS_SETS": "perhaps"})


# ------------------------------------------------------------ dtypes and ops
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
    assert len(SUPPORTED) == 10  # Horovod's dtypes, bfloat16 aside (adapters cast it)


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


# --------------------------------------------------------- before init()
def test_queries_before_init_say_to_call_init():
    import hvdlite as hvd

    assert not hvd.is_initialized()
    for query in (
        hvd.size,
        hvd.rank,
        hvd.local_size,
        hvd.local_rank,
        hvd.cross_size,
        hvd.cross_rank,
        hvd.is_homogeneous,
    ):
        with pytest.raises(ValueError, match=r"init\(\)"):
            query()
    # (That the queries do not start MPI is checked in a fresh interpreter by
    # tests/mpi_scripts/core_import_light.py, run from test_core_launch.py.)


def test_hvdlite_serves_only_its_documented_names():
    # Everything hvdlite serves lazily is in its __all__, and the engine's seams for
    # the adapters (submit_control, call_and_wait, waiting_caller) are not served.
    import hvdlite
    from hvdlite import basics, collectives, dynamic_sets, objects

    lazily_served = set(collectives.__all__) | set(objects.__all__) | set(dynamic_sets.__all__)
    assert lazily_served <= set(hvdlite.__all__)
    for seam in ("submit_control", "call_and_wait", "waiting_caller", "state"):
        assert seam not in hvdlite.__all__ and seam not in basics.__all__
        with pytest.raises(AttributeError):
            getattr(hvdlite, seam)


# ------------------------------------------------------------- HVDLITE_CHECK_ORDER
def _request(name, kind=Kind.ALLREDUCE, set_id=0):
    return Params(set_id=set_id, name=name, kind=int(kind), dtypes=(F32,), shapes=((2,),))


def test_order_check_names_the_first_position_where_two_ranks_differ():
    from hvdlite.engine.order_check import OrderCheck

    check = OrderCheck({0: frozenset({0, 1, 2})}.get)
    none = frozenset()
    for rank in (0, 1, 2):
        assert check.observe(rank, _request("a"), none) == []
    assert check.observe(0, _request("allreduce.noname.1"), none) == []
    assert check.observe(1, _request("allreduce.noname.1"), none) == []
    errors = check.observe(2, _request("allgather.noname.1", Kind.ALLGATHER), none)
    assert [e.key for e in errors] == [(0, "allreduce.noname.1"), (0, "allgather.noname.1")]
    message = errors[0].error
    assert all(e.status == RESPONSE_ERROR and e.error == message for e in errors)
    for part in (
        "process set 0",
        "2nd collective",
        "rank 0",
        "allreduce 'allreduce.noname.1'",
        "rank 2",
        "allgather 'allgather.noname.1'",
        "HVDLITE_CHECK_ORDER",
    ):
        assert part in message, message
    # A rank that submits either name later fails at once; the set is not counted further.
    assert [
        e.key for e in check.observe(1, _request("allgather.noname.1", Kind.ALLGATHER), none)
    ] == [(0, "allgather.noname.1")]
    assert check.observe(2, _request("b"), none) == []


def test_order_check_skips_allreduces_past_a_join_and_starts_afresh_after_it():
    from hvdlite.engine.order_check import OrderCheck

    check = OrderCheck({0: frozenset({0, 1})}.get)
    assert check.observe(0, _request("x"), frozenset()) == []
    assert check.observe(1, _request("x"), frozenset()) == []
    # rank 0 has joined: rank 1's extra allreduce is not counted...
    assert check.observe(1, _request("extra"), frozenset({0})) == []
    check.reset()  # ...and the completed join starts the counts again
    assert check.observe(1, _request("y"), frozenset()) == []
    assert check.observe(0, _request("y"), frozenset()) == []
    # Another set counts on its own.
    check2 = OrderCheck({0: frozenset({0, 1}), 1: frozenset({0, 1})}.get)
    assert check2.observe(0, _request("p", set_id=1), frozenset()) == []
    assert check2.observe(1, _request("q", set_id=0), frozenset()) == []
    assert check2.observe(1, _request("p", set_id=1), frozenset()) == []


def test_the_coordinator_fails_both_collectives_and_forgets_them():
    coordinator = Coordinator(2, {0: frozenset({0, 1})}.get, check_order=True)
    assert coordinator.process([(0, [_request("a")]), (1, [_request("b")])]) != []
    assert coordinator.pending_names() == {}
    plain = Coordinator(2, {0: frozenset({0, 1})}.get)
    assert plain.process([(0, [_request("a")]), (1, [_request("b")])]) == []
    assert set(plain.pending_names()) == {(0, "a"), (0, "b")}
