"""``run``: the decorator around an elastic training function (Horovod's ``hvd.elastic.run``).

``@run def train(state, ...)`` then ``train(state)``.  What the wrapper does,
on every rank (all of it is collective):

1. under hvdrun's elastic mode, rank 0 loads the job's last commit, if there is
   one (a relaunched job); a commit that cannot be read ends every rank with
   :data:`~.layout.STATE_ERROR_EXIT` and the reason, and hvdrun does not relaunch;
2. ``state.sync()``: every rank takes rank 0's state; on a relaunched job the
   reset callbacks run next (``size()`` is the new world's);
3. ``func(state, ...)``; its return value is returned.

When ``func`` raises :class:`~hvdlite.exceptions.HostsUpdatedInterrupt` (every
rank at the same ``commit()``): under hvdrun's elastic mode the current state
is committed, rank 0 marks the launch for a relaunch and every rank exits with
:data:`~.layout.HOSTS_UPDATED_EXIT`; hvdrun starts the job again on the new
hosts, where step 1 resumes it.  Outside that mode the state is reset and
synced and ``func`` runs again, as in Horovod.

A commit that cannot be written (a full disk, a quota: a
:class:`~.persistence.CommitWriteError` raised on rank 0 by ``commit()``) ends
rank 0 with :data:`~.layout.STATE_WRITE_EXIT` and a message naming the file and
the error; hvdrun ends the job with that code instead of relaunching it.  Rank 0
leaves at once (``os._exit`` after flushing its output), without the usual
shutdown: that shutdown would fail the other ranks' pending collectives first, and
hvdrun, hearing of their failure before rank 0's exit code, would take it for the
job's cause and relaunch.

A :class:`~hvdlite.exceptions.HorovodInternalError` (a collective failed) is
not retried in the process: MPI cannot repair its world, so the error ends the
process, hvdrun ends the job, and under its elastic mode relaunches it from the
last commit.  (Horovod restores the in-memory commit and re-initializes in the
same process; on MPI the unit of recovery is the job.)

Do not run collectives between ``hvd.init()`` and the call of the wrapped
function that the other ranks would not run too: a relaunched job's ranks all
start at the top of the script.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable

from ..exceptions import HostsUpdatedInterrupt
from .layout import STATE_ERROR_EXIT, STATE_WRITE_EXIT
from .persistence import CommitWriteError, ElasticStateError
from .state import State, say

__all__ = ["run", "run_fn"]


def run_fn(func: Callable, reset: Callable[[], None] | None = None) -> Callable:
    """Wrap *func* (whose first argument is a :class:`State`); *reset* runs before each
    in-process retry (the frameworks pass none: their world does not change in a process)."""

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise TypeError(
                f"{getattr(func, '__name__', 'the function')}: the first argument "
                "of an hvd.elastic.run function must be an elastic State "
                f"(e.g. hvd.elastic.TorchState(model, optimizer)), not "
                f"{type(state).__name__}"
            )
        try:
            state._resume()
        except ElasticStateError as exc:
            say(f"error: {exc}")
            raise SystemExit(STATE_ERROR_EXIT) from exc
        state.sync()
        if state._context.generation > 0:
            state.on_reset()
        try:
            return _loop(func, state, reset, args, kwargs)
        except CommitWriteError as exc:
            if not state._context.relaunchable:
                raise
            say(f"error: {exc}")
            _leave_before_the_others(STATE_WRITE_EXIT)

    return wrapper


def _leave_before_the_others(code: int) -> None:
    """End this process with *code* now, its output flushed, so that hvdrun hears of
    this rank's exit before any other rank's (see the module doc)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def _loop(func: Callable, state: State, reset, args, kwargs):
    """Run *func* until it returns (see the module doc for a host change)."""
    while True:
        try:
            return func(state, *args, **kwargs)
        except HostsUpdatedInterrupt as exc:
            if state._context.relaunchable:
                state._leave_for_new_hosts()  # raises SystemExit
            skip_sync = exc.skip_sync
        if reset is not None:
            reset()
        state.on_reset()
        if not skip_sync:
            state.sync()


def run(func: Callable) -> Callable:
    """Decorator for an elastic training function ``func(state, *args, **kwargs)``.

    See the module doc for what happens on a relaunch, a host change and a failure.
    """
    return run_fn(func)
