"""Handles without MPI: the Future behaviour a caller relies on.

The engine completes a handle with the public ``set_result``/``set_exception``;
a handle sets up its Future part (lock, lists) only when something needs it.
These tests check that callbacks, waiting threads and ``concurrent.futures.wait``
still see every completion, before and after that part exists.
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
    h.set_result(41)
    h.set_result(42)  # a second completion is ignored
    assert h.done() and poll(h) and not h.running()
    assert h.result() == 41 and synchronize(h) == 41
    assert not h._future_ready  # nobody had to wait: no lock was ever made
    assert h.exception() is None


def test_a_failed_handle_raises_its_error():
    h = Handle("h")
    h.set_exception(RuntimeError("peer failed"))
    with pytest.raises(RuntimeError, match="peer failed"):
        h.result()
    assert isinstance(h.exception(), RuntimeError)


def test_handles_cannot_be_cancelled():
    h = Handle("h")
    assert h.cancel() is False and not h.cancelled()
    h.set_result(1)
    assert h.result() == 1


def test_callbacks_run_whether_added_before_or_after_completion():
    seen = []
    h = Handle("h")
    h.add_done_callback(lambda f: seen.append(("before", f.result())))
    h.set_result(7)
    h.add_done_callback(lambda f: seen.append(("after", f.result())))
    assert seen == [("before", 7), ("after", 7)]


def test_a_thread_waiting_on_the_handle_is_woken():
    h = Handle("h")
    got = []
    waiter = threading.Thread(target=lambda: got.append(h.result(timeout=30)))
    waiter.start()
    while not h._future_ready:  # the waiter has made the lock and waits on it
        threading.Event().wait(0.001)
    h.set_result("done")
    waiter.join(30)
    assert got == ["done"]


def test_result_times_out_while_pending():
    with pytest.raises(concurrent.futures.TimeoutError):
        Handle("h").result(timeout=0.01)


def test_concurrent_futures_wait_sees_completions():
    first, second = Handle("a"), Handle("b")
    second.set_result(2)  # finished before wait() looks
    threading.Timer(0.05, first.set_result, args=(1,)).start()
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
        h.set_result(None)
        t.join(30)
        assert calls == [h]


def test_each_handle_sets_up_its_own_future_part():
    a, b = Handle("a"), Handle("b")
    a.add_done_callback(lambda f: None)
    assert a._future_ready and not b._future_ready  # b untouched
    b.set_result(3)
    b.add_done_callback(lambda f: None)  # set up after completion: sees the outcome
    assert b._future_ready and concurrent.futures.Future.result(b, 0) == 3


def test_conversions_apply_in_order_through_synchronize():
    h = Handle("h").add_conversion(lambda v: v + 1).add_conversion(lambda v: v * 10)
    h.set_result(1)
    assert h.result() == 1 and synchronize(h) == 20


def test_synchronize_rejects_what_is_not_a_handle():
    with pytest.raises(ValueError, match="takes a handle"):
        synchronize(42)


def test_the_module_names_no_private_future_internals():
    import inspect

    import hvdlite.handles as module

    source = inspect.getsource(module)
    for private in ("_base", "_waiters", "_invoke_callbacks", "_condition", "_state"):
        assert private not in source, private
