"""What hvdrun passes on of the launcher's output (no MPI): tracebacks in one piece per
rank, MPICH's failure banner left out; and the report that says so."""

import pytest

from hvdlite.runner.output import HOLD_LINES, HOLD_SECONDS, OutputOrder
from hvdlite.runner.report import Failure, format_failure, format_launcher_failure

pytestmark = pytest.mark.timeout(60)


def _feed(order, lines):
    out = []
    for line in lines:
        raw = (line + "\n").encode()
        out += order.line(raw, line)
    return [raw.decode().rstrip("\n") for raw in out]


def _traceback(rank, prefix="[{}] "):
    p = prefix.format(rank)
    return [
        f"{p}Traceback (most recent call last):",
        f'{p}  File "train.py", line 8, in <module>',
        f"{p}    f(30)",
        f"{p}           ^^^^^",
        f"{p}  [Previous line repeated 27 more times]",
        f"{p}ValueError: boom on rank {rank}",
    ]


@pytest.mark.parametrize("prefix", ["[{}] ", "[1,{}]<stderr>: ", "{}: "])
def test_interleaved_tracebacks_come_out_one_rank_at_a_time(prefix):
    zero, one = _traceback(0, prefix), _traceback(1, prefix)
    interleaved = [line for pair in zip(one, zero) for line in pair]
    out = _feed(OutputOrder(), interleaved)
    assert out == one + zero  # rank 1 finished first


def test_other_lines_pass_at_once_beside_a_held_traceback():
    order = OutputOrder()
    assert _feed(order, ["[0] Traceback (most recent call last):"]) == []
    assert _feed(order, ["[1] epoch 3 loss 0.25"]) == ["[1] epoch 3 loss 0.25"]
    assert _feed(order, ["[0]   File 'x.py', line 1"]) == []
    assert _feed(order, ["[0] KeyError: 'x'"]) == [
        "[0] Traceback (most recent call last):",
        "[0]   File 'x.py', line 1",
        "[0] KeyError: 'x'",
    ]
    assert order.flush() == []


def test_a_traceback_that_stops_halfway_is_let_go_in_time_and_at_the_end():
    now = [0.0]
    order = OutputOrder(clock=lambda: now[0])
    _feed(order, _traceback(0)[:3])
    assert order.due() == []
    now[0] = HOLD_SECONDS
    assert [raw.decode() for raw in order.due()] == [line + "\n" for line in _traceback(0)[:3]]
    _feed(order, _traceback(1)[:2])
    assert len(order.flush()) == 2
    huge = ["[2] Traceback (most recent call last):"] + ["[2]   frame"] * (HOLD_LINES - 1)
    order = OutputOrder()
    assert _feed(order, huge[:-1]) == []
    assert len(_feed(order, huge[-1:])) == HOLD_LINES  # let go at the bound
    assert _feed(order, ["[2]   frame"]) == ["[2]   frame"]  # and not held again


MPICH_BANNER = [
    "",
    "=" * 83,
    "=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES",
    "=   PID 10905 RUNNING AT vm",
    "=   EXIT CODE: 9",
    "=   CLEANING UP REMAINING PROCESSES",
    "=   YOU CAN IGNORE THE BELOW CLEANUP MESSAGES",
    "=" * 83,
    "YOUR APPLICATION TERMINATED WITH THE EXIT STRING: Terminated (signal 15)",
    "This typically refers to a problem with your application.",
    "Please see the FAQ page for debugging suggestions",
]


def test_mpichs_failure_banner_is_left_out_and_counted():
    order = OutputOrder()
    out = _feed(order, ["[0] step 1"] + MPICH_BANNER + ["[1] last words"])
    assert out == ["[0] step 1", "[1] last words"]
    assert order.notices_left_out == 1 and order.lines_left_out == len(MPICH_BANNER)


def test_rules_and_blank_lines_that_open_no_banner_pass():
    now = [0.0]
    order = OutputOrder(clock=lambda: now[0])
    rule = "=" * 40
    assert _feed(order, ["", rule, "the launcher says something else"]) == [
        "",
        rule,
        "the launcher says something else",
    ]
    assert _feed(order, ["[0] " + rule]) == ["[0] " + rule]  # a rank's own line: at once
    assert _feed(order, [rule]) == []
    now[0] = HOLD_SECONDS
    assert [raw.decode() for raw in order.due()] == [rule + "\n"]
    assert _feed(order, ["", ""]) == [""]  # the second blank line is held in turn
    assert order.flush() == [b"\n"] and order.notices_left_out == 0


def test_the_report_says_the_banner_was_left_out():
    failure = Failure(1, "vm", 137, 9, "SIGKILL", False, 0.0, ())
    assert "BAD TERMINATION" not in format_failure(failure, 0.8, 1, 2)
    assert "'BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES', is not shown" in (
        format_failure(failure, 0.8, 1, 2, notices=1)
    )
    assert "is not shown" in format_launcher_failure("mpiexec", 1, [], notices=1)
