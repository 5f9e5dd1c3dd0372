"""No rank outlives hvdrun, even when hvdrun is killed with SIGKILL (Linux).

Two links, both optional (where one is not available the other, or hvdrun's
ordinary stop path, is all there is):

- the launcher (mpiexec or srun) gets a parent-death signal: SIGTERM as soon as
  hvdrun dies, which it handles as it handles Ctrl-C -- it stops every rank on
  every host (:func:`parent_death_signal`; also used by the task wrapper, whose
  command gets SIGKILL when the wrapper dies);
- hvdrun puts its identity -- boot id, PID and start time -- in
  ``$HVDLITE_JOB_OWNER``.  A task wrapper that can see that very process when
  it starts (same machine, same PID namespace) watches it and stops its command
  once it is gone (:func:`alive`).  On another host the identity names no
  visible process, so the wrapper ignores it there and the launcher's own
  teardown (mpiexec's proxies over ssh, srun's step) ends those ranks.

Standard library only: the task wrapper imports it as a plain file.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["OWNER_VARIABLE", "identity", "alive", "parent_death_signal"]

OWNER_VARIABLE = "HVDLITE_JOB_OWNER"
_PR_SET_PDEATHSIG = 1


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks); None when gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    if len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return fields[19].decode("ascii", "replace")


def identity(pid: int | None = None) -> str | None:
    """``BOOT_ID:PID:START_TIME`` of process *pid* (default: this one), or None without /proc."""
    pid = os.getpid() if pid is None else pid
    boot, start = _boot_id(), _start_time(pid)
    return f"{boot}:{pid}:{start}" if boot and start else None


def alive(owner: str) -> bool:
    """True while the process that *owner* (an :func:`identity`) names runs on this machine.

    False once it has exited (an unreaped zombie counts as exited), and for an
    identity from another machine or PID namespace, or a malformed one.
    """
    pid = owner.split(":")[1] if owner.count(":") == 2 else ""
    return pid.isdigit() and identity(int(pid)) == owner


def parent_death_signal(signum: int) -> Callable[[], None]:
    """A function for ``Popen(preexec_fn=...)``: the child gets *signum* when its parent dies.

    Uses ``prctl(PR_SET_PDEATHSIG)``, which fires when the thread that started
    the child ends, so call ``Popen`` from a thread that lives as long as the
    child should.  Should the parent be gone already by the time the child sets
    it up, the child sends itself *signum*.  Without prctl (not Linux) the
    function does nothing.
    """
    parent = os.getpid()
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signum)

    return setup
