"""Rank 0's coordinator without MPI: the agreement check of every rank's request,
its decisions (wait for every member, answer once, in submission order, per process
set), join, and HVDLITE_CHECK_ORDER's comparison of every rank's order."""

from __future__ import annotations

import pytest
from engine_requests import F32, F64, P, coordinator, join_params

from hvdlite.engine.coordinator import Coordinator, check_agreement
from hvdlite.engine.messages import LEAVE_PARAMS, RESPONSE_ERROR, RESPONSE_OK, Kind, Params
from hvdlite.ops import ReduceOp


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
