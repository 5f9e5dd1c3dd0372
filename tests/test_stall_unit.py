"""The stall inspector without MPI: when it asks, what its report names (missing
ranks, their hosts, as ranges), and that it fails collectives after the shutdown time."""

from __future__ import annotations

import pytest
from engine_requests import P, allreduce_response, coordinator, entry_of, join_params

from hvdlite.engine.coordinator import StallClock
from hvdlite.engine.messages import RESPONSE_ERROR

pytestmark = pytest.mark.timeout(60)


def test_the_stall_clock_asks_only_for_old_work_and_not_too_often():
    now = [100.0]
    clock = StallClock(warn_seconds=2.0, fail_seconds=0.0, enabled=True, clock=lambda: now[0])
    old = entry_of(allreduce_response("old"))
    old.submitted = 90.0
    assert not clock.due({})  # nothing pending
    assert not clock.due({old.key: old})  # the first look waits min(warn, 5) s
    now[0] = 103.0
    assert clock.due({old.key: old})
    assert not clock.due({old.key: old})  # looked just now
    assert not StallClock(2.0, 0.0, enabled=False, clock=lambda: 1e9).due({old.key: old})


def test_the_same_stall_warning_repeats_less_and_less_often():
    now = [100.0]
    clock = StallClock(warn_seconds=5.0, fail_seconds=0.0, enabled=True, clock=lambda: now[0])
    rank1, rank2 = frozenset({1}), frozenset({1, 2})
    logged = []
    for _ in range(200):  # a stall check every 2.5 s, for 500 s
        gap = clock.report_due("report", rank1)
        if gap is not None:
            logged.append((now[0], gap))
        now[0] += 2.5
    assert [t for t, _ in logged] == [100.0, 105.0, 115.0, 135.0, 175.0, 255.0, 415.0]
    assert [gap for _, gap in logged][:3] == [5.0, 10.0, 20.0]
    assert clock.report_due("report", rank2) == 5.0  # another rank went missing: at once
    assert clock.report_due("", frozenset()) is None  # the stall ended
    assert clock.report_due("report", rank2) == 5.0  # a new stall: at once again


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
