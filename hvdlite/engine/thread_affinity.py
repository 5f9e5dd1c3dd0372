"""Pinning the engine thread to a core: ``HVDLITE_THREAD_AFFINITY`` (``hvdrun --thread-affinity``).

The variable (or Horovod's ``HOROVOD_THREAD_AFFINITY``; the ``HVDLITE_``
spelling wins) lists one core id per local rank, ``"0,8"`` for two ranks a
node: local rank *i* pins its engine thread to the *i*-th id.  One id alone
pins the engine thread of a node's only rank.  Unset or empty: no pinning.

Per rank, no cross-rank contract.  Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["VARIABLES", "core_for", "pin_current_thread"]

VARIABLES = ("HVDLITE_THREAD_AFFINITY", "HOROVOD_THREAD_AFFINITY")


def core_for(
    local_rank: int, local_size: int, environ: Mapping[str, str] | None = None
) -> int | None:
    """The core local rank *local_rank* (of *local_size*) pins its engine thread to.

    None when no variable is set; ValueError (naming the variable and the fix)
    when the list is malformed or has fewer ids than there are local ranks.
    """
    env = os.environ if environ is None else environ
    name = next((n for n in VARIABLES if env.get(n, "").strip()), None)
    if name is None:
        return None
    raw = env[name]
    parts = [part.strip() for part in raw.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ValueError(
            f"{name}={raw!r} is not valid: give one core id per local rank, "
            "e.g. 0,8 for two ranks per node."
        )
    if len(parts) < local_size:
        raise ValueError(
            f"{name}={raw!r} names {len(parts)} core(s) for {local_size} local "
            "ranks: give one core id per local rank."
        )
    return int(parts[local_rank])


def pin_current_thread(
    local_rank: int, local_size: int, environ: Mapping[str, str] | None = None
) -> int | None:
    """Pin the calling thread (Linux: affinity is per thread) as :func:`core_for` says.

    Returns the core, or None when nothing was pinned (no variable, or no
    ``os.sched_setaffinity`` on this platform).  OSError when the core does
    not exist or is outside this process's allowed set.
    """
    core = core_for(local_rank, local_size, environ)
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    os.sched_setaffinity(0, {core})
    return core
