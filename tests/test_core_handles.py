"""Handles without MPI: the Future behaviour a caller relies on.

A handle makes its lock only when something needs it and the engine completes
it with ``_complete``; these tests check that callbacks, waiting threads and
``concurrent.futures.wait`` still see every completion, before and after the
lock exists.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from hvdlite.handles import Handle, poll, synchronize

pytestmark = pytest.mark.timeout(60)


def test_a_handle_is_a_future_that_completes_once():
    h = Handle("h")
    assert isinstance(h, concurrent.futures.Future)
    assert not h.done() and not poll(h) and h.running()
    h._complete(41)
    h._complete(42)  # a second completion is ignored
    assert h.done() and poll(h) and not h.running()
    assert h.result() == 41 and synchronize(h) == 41
    assert h._lock_made is None  # nobody had to wait: no lock was ever made
    assert h.exception() is None


def test_a_failed_handle_raises_its_error():
    h = Handle("h")
    h._complete(exception=RuntimeError("peer failed"))
    with pytest.raises(RuntimeError, match="peer failed"):
        h.result()
    assert isinstance(h.exception(), RuntimeError)


def test_handles_cannot_be_cancelled():
    h = Handle("h")
    assert h.cancel() is False and not h.cancelled()
    h._complete(1)
    assert h.result() == 1


def test_callbacks_run_whether_added_before_or_after_completion():
    seen = []
    h = Handle("h")
    h.add_done_callback(lambda f: seen.append(("before", f.result())))
    h._complete(7)
    h.add_done_callback(lambda f: seen.append(("after", f.result())))
    assert seen == [("before", 7), ("after", 7)]


def test_a_thread_waiting_on_the_handle_is_woken():
    h = Handle("h")
    got = []
    waiter = threading.Thread(target=lambda: got.append(h.result(timeout=30)))
    waiter.start()
    while h._lock_made is None:  # the waiter has made the lock and waits on it
        threading.Event().wait(0.001)
    h._complete("done")
    waiter.join(30)
    assert got == ["done"]


def test_result_times_out_while_pending():
    with pytest.raises(concurrent.futures.TimeoutError):
        Handle("h").result(timeout=0.01)


def test_concurrent_futures_wait_sees_completions():
    first, second = Handle("a"), Handle("b")
    second._complete(2)  # finished before wait() looks
    threading.Timer(0.05, first._complete, args=(1,)).start()
    done, pending = concurrent.futures.wait([first, second], timeout=30)
    assert done == {first, second} and not pending


def test_completion_racing_with_callbacks_never_loses_one():
    # Callbacks added from another thread while the engine completes the handle:
    # each runs exactly once, whichever side wins.
    def add(h, calls, start):
        start.wait()
        h.add_done_callback(calls.append)

    for _ in range(200):
        h = Handle("h")
        calls = []
        start = threading.Barrier(2)
        t = threading.Thread(target=add, args=(h, calls, start))
        t.start()
        start.wait()
        h._complete(None)
        t.join(30)
        assert calls == [h]


def test_each_handle_gets_its_own_lists_with_its_condition():
    a, b = Handle("a"), Handle("b")
    assert a._condition is a._condition  # made once
    assert a._waiters == [] and a._done_callbacks == []
    assert b._waiters == () and b._lock_made is None  # b untouched
    b.add_done_callback(lambda f: None)
    assert a._done_callbacks == [] and len(b._done_callbacks) == 1
