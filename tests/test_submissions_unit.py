"""Submitting a collective, without MPI: the inbox (names in flight, after close) and
automatic names, counted per thread."""

from __future__ import annotations

import sys
import threading

import pytest
from engine_requests import allreduce_response, entry_of

from hvdlite.engine.auto_names import AutoNames
from hvdlite.engine.submissions import Inbox
from hvdlite.exceptions import HorovodInternalError

pytestmark = pytest.mark.timeout(60)


def test_the_inbox_refuses_names_in_flight_and_submissions_after_close():
    inbox = Inbox()
    first = entry_of(allreduce_response("x"))
    inbox.put(first)
    with pytest.raises(ValueError, match="already in flight"):
        inbox.put(entry_of(allreduce_response("x")))
    assert inbox.oldest() == first.submitted and inbox.take_all() == [first]
    with pytest.raises(ValueError):  # taken, but still in flight until released
        inbox.put(entry_of(allreduce_response("x")))
    inbox.release([first.key])
    inbox.put(entry_of(allreduce_response("x")))
    assert len(inbox.close("stopped for a test")) == 1 and inbox.closed
    with pytest.raises(HorovodInternalError, match="stopped for a test"):
        inbox.put(entry_of(allreduce_response("y")))


def test_automatic_names_count_per_thread():
    names = AutoNames()
    assert [names.suffix("allreduce") for _ in range(2)] == ["0", "1"]
    out = []
    worker = threading.Thread(
        target=lambda: out.extend(names.suffix("allreduce") for _ in range(2)), name="loader"
    )
    worker.start()
    worker.join()
    assert out == ["loader.0", "loader.1"]
    assert names.suffix("allreduce") == "2"  # the main thread's count went on alone


def test_threads_racing_for_names_never_share_one():
    names = AutoNames()
    got: list[str] = []
    lock = threading.Lock()
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:

        def work():
            mine = [names.suffix(("allreduce", 0)) for _ in range(2000)]
            with lock:
                got.extend(mine)

        threads = [threading.Thread(target=work, name=f"w{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(previous)
    assert len(got) == len(set(got)) == 8000


def test_two_live_threads_with_one_name_are_refused():
    names = AutoNames()
    release = threading.Event()
    first = threading.Thread(target=lambda: (names.suffix("x"), release.wait(10)), name="dup")
    first.start()
    errors = []

    def second():
        try:
            names.suffix("x")
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=second, name="dup")
    t.start()
    t.join()
    release.set()
    first.join()
    assert errors and "distinct name" in str(errors[0])
