"""Whether a rank's processes are stopped: how a task wrapper sees a frozen rank.

A rank stopped by SIGSTOP (or SIGTSTP, SIGTTIN, SIGTTOU) holds every peer of
its job in its next collective, and nothing inside MPI notices: the process is
alive, its sockets open.  Its task wrapper can see it from outside, in the
state Linux gives every process (``T`` in ``/proc/PID/stat``), and so bound how
long a rank may stay stopped (hvdrun's ``--frozen-timeout``).  A process being
traced (a debugger attached, state ``t``) is not stopped in this sense.

:class:`StoppedWatch` looks at every process of the rank's process group (the
wrapper makes the command its own group leader), so a rank started through a
shell script counts too.  Where ``/proc`` is missing (not Linux) it sees
nothing stopped, ever.  Standard library only: the task wrapper imports it as a
plain file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["is_stopped", "stopped_in_group", "StoppedWatch"]

_PROC = "/proc"


def _state_and_group(stat_text: str) -> tuple[str, int] | None:
    """``(state, process group)`` from the text of ``/proc/PID/stat``; None when
    it cannot be read (the command name, in parentheses, may hold anything)."""
    end = stat_text.rfind(")")
    fields = stat_text[end + 2 :].split() if end >= 0 else []
    if len(fields) < 3:
        return None
    try:
        return fields[0], int(fields[2])
    except ValueError:
        return None


def _read(pid: int | str, proc: str) -> tuple[str, int] | None:
    try:
        with open(os.path.join(proc, str(pid), "stat"), encoding="ascii", errors="replace") as f:
            return _state_and_group(f.read())
    except OSError:  # it ended meanwhile, or there is no /proc
        return None


def is_stopped(pid: int, proc: str = _PROC) -> bool:
    """Whether process *pid* is stopped by a signal now."""
    found = _read(pid, proc)
    return found is not None and found[0] == "T"


def stopped_in_group(group: int, proc: str = _PROC) -> list[int]:
    """The pids of process group *group* that are stopped by a signal, sorted."""
    try:
        names = os.listdir(proc)
    except OSError:
        return []
    stopped = []
    for name in names:
        if name.isdigit():
            found = _read(name, proc)
            if found is not None and found[1] == group and found[0] == "T":
                stopped.append(int(name))
    return sorted(stopped)


class StoppedWatch:
    """How long process group *group* (led by process *group*) has had a stopped
    process, as seen by the calls to :meth:`look`.

    :meth:`look` returns the seconds since the group was first seen with a
    stopped process, without a look in between that found none (0.0 when none is
    stopped now).  Each look reads the leader's state (cheap); the whole group is
    scanned at most every *scan_every* seconds, since that reads every process's
    state on the machine: a stopped process other than the leader is seen up to
    that much later.
    """

    def __init__(
        self,
        group: int,
        scan_every: float = 10.0,
        proc: str = _PROC,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group, self.scan_every = group, scan_every
        self._proc, self._clock = proc, clock
        self._since: float | None = None
        self._next_scan = clock()
        self.pids: list[int] = []  # the stopped processes the last look found

    def _stopped_now(self, now: float) -> list[int]:
        if is_stopped(self.group, self._proc):
            return [self.group]
        if self._since is not None or now >= self._next_scan:  # keep following a stop
            self._next_scan = now + self.scan_every
            return stopped_in_group(self.group, self._proc)
        return []

    def look(self) -> float:
        now = self._clock()
        self.pids = self._stopped_now(now)
        if not self.pids:
            self._since = None
            return 0.0
        if self._since is None:
            self._since = now
        return now - self._since
