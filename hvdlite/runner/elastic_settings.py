"""hvdrun's elastic options, checked and with their defaults: :class:`ElasticSettings`.

Elastic mode is on when any of ``--host-discovery-script``, ``--min-np``,
``--max-np`` or ``--max-restarts`` is given.  The hosts then come from, in
order: the discovery script; ``-H``/``--hostfile`` or this machine (a fixed
list: only ``--max-restarts`` makes sense there); the SLURM allocation (its
nodes, minus those SLURM drains).  The other elastic options alone are an
error that says which option turns elastic mode on.

Environment fallbacks: ``HVDLITE_ELASTIC_TIMEOUT`` / ``HOROVOD_ELASTIC_TIMEOUT``
for ``--elastic-timeout``, ``HVDLITE_ELASTIC_STATE_DIR`` for
``--elastic-state-dir``, and ``HVDLITE_ELASTIC_DISCOVERY_INTERVAL`` (seconds
between two runs of the discovery script while the job runs, default 1).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import shutil
from collections.abc import Mapping

from . import slurm
from .errors import UsageError

__all__ = [
    "ElasticSettings",
    "elastic_requested",
    "settings_from",
    "DEFAULT_TIMEOUT",
    "DEFAULT_STATE_DIR",
]

DEFAULT_TIMEOUT = 600.0
DEFAULT_STATE_DIR = ".hvdlite-elastic"
DEFAULT_INTERVAL = 1.0
_TURN_ON = ("host_discovery_script", "min_np", "max_np", "max_restarts")
_NEED_ELASTIC = {
    "slots_per_host": "--slots-per-host",
    "elastic_timeout": "--elastic-timeout",
    "reset_limit": "--reset-limit",
    "blacklist_cooldown_range": "--blacklist-cooldown-range",
    "elastic_state_dir": "--elastic-state-dir",
    "elastic_resume": "--elastic-resume",
    "elastic_background_commit": "--elastic-background-commit",
}


@dataclasses.dataclass(frozen=True)
class ElasticSettings:
    """What the relaunch loop needs to know (see the module doc)."""

    min_np: int
    max_np: int | None  # None: every slot the hosts have
    discovery_script: str | None
    slots_per_host: int
    timeout: float
    reset_limit: int | None  # None: no limit
    cooldown_range: tuple[float, float] | None
    max_restarts: int | None  # None: no limit
    state_dir: str
    poll_interval: float
    source: str  # "script", "slurm" or "fixed"
    resume: str | None = None  # --elastic-resume: the job id to resume


def elastic_requested(values: Mapping[str, object]) -> bool:
    return any(values.get(name) is not None for name in _TURN_ON)


def _seconds(environ: Mapping[str, str], names: tuple[str, ...], default: float) -> float:
    for name in names:
        raw = environ.get(name, "").strip()
        if not raw:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise UsageError(f"{name}={raw!r} is not a number of seconds") from None
        if not math.isfinite(value) or value <= 0:
            raise UsageError(f"{name}={raw!r} must be a positive number of seconds")
        return value
    return default


def _check_script(script: str, environ: Mapping[str, str]) -> None:
    if os.path.isfile(script):  # a path, whatever it holds: run as it is, no shell
        if not os.access(script, os.X_OK):
            raise UsageError(
                f"--host-discovery-script {script!r} is not executable (chmod +x "
                "it, or give its interpreter: 'sh discover.sh')"
            )
        return
    try:
        words = shlex.split(script)
    except ValueError as exc:
        raise UsageError(f"--host-discovery-script {script!r}: cannot split it ({exc})") from None
    if not words:
        raise UsageError("--host-discovery-script: the command is empty")
    program = words[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UsageError(
                f"--host-discovery-script {script!r}: {program} is not an "
                "executable file (chmod +x it, or give its interpreter: "
                "'sh discover.sh')"
            )
    elif shutil.which(program, path=environ.get("PATH")) is None:
        raise UsageError(
            f"--host-discovery-script {script!r}: {program} is not on PATH "
            "(give the script's path, e.g. ./discover.sh)"
        )


def settings_from(
    values: Mapping[str, object], environ: Mapping[str, str]
) -> ElasticSettings | None:
    """The elastic settings for the merged option *values*, or None when elastic mode is
    off; UsageError for every inconsistent combination, naming the options."""
    if not elastic_requested(values):
        given = [flag for dest, flag in _NEED_ELASTIC.items() if values.get(dest) is not None]
        if given:
            raise UsageError(
                f"{', '.join(given)} only apply to elastic jobs: add "
                "--host-discovery-script, --min-np/--max-np (with hosts that "
                "can change) or --max-restarts N"
            )
        return None
    script = values.get("host_discovery_script")
    fixed_list = values.get("hosts") or values.get("hostfile")
    if script is not None:
        if fixed_list:
            raise UsageError(
                "give either --host-discovery-script or -H/--hostfile: with a "
                "discovery script the hosts come from the script"
            )
        _check_script(str(script), environ)
        source = "script"
    elif not fixed_list and slurm.in_allocation(environ):
        source = "slurm"
    else:
        source = "fixed"
    np = values.get("np")
    min_np, max_np = values.get("min_np"), values.get("max_np")
    if source == "fixed" and (min_np is not None or max_np is not None):
        raise UsageError(
            "--min-np/--max-np need hosts that can change: add "
            "--host-discovery-script (or run inside a SLURM allocation); to "
            "relaunch a job of fixed size after failures use --max-restarts N"
        )
    if values.get("slots_per_host") is not None and source != "script":
        raise UsageError(
            "--slots-per-host applies to the hosts a --host-discovery-script "
            "prints: drop it, or give the slots in -H host:SLOTS"
        )
    if min_np is not None and max_np is not None and min_np > max_np:
        raise UsageError(f"--min-np {min_np} is more than --max-np {max_np}")
    if np is not None and min_np is not None and np < min_np:
        raise UsageError(f"-np {np} is less than --min-np {min_np}")
    if np is not None and max_np is not None and np > max_np:
        raise UsageError(f"-np {np} is more than --max-np {max_np}")
    min_np = int(min_np if min_np is not None else (np if np is not None else 1))
    max_np = int(max_np) if max_np is not None else (int(np) if np is not None else None)
    cooldown = values.get("blacklist_cooldown_range")
    if cooldown is not None:
        low, high = (float(v) for v in cooldown)
        if low > high:
            raise UsageError(
                f"--blacklist-cooldown-range {low:g} {high:g}: MIN must not be more than MAX"
            )
        cooldown = (low, high)
    timeout = values.get("elastic_timeout")
    if timeout is None:
        timeout = _seconds(
            environ, ("HVDLITE_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"), DEFAULT_TIMEOUT
        )
    state_dir = (
        values.get("elastic_state_dir")
        or environ.get("HVDLITE_ELASTIC_STATE_DIR", "").strip()
        or DEFAULT_STATE_DIR
    )
    max_restarts = values.get("max_restarts")
    resume = values.get("elastic_resume")
    if resume is not None and (
        not str(resume).strip() or os.sep in str(resume) or str(resume) in (".", "..")
    ):
        raise UsageError(
            f"--elastic-resume {resume!r}: give the job id hvdrun printed at the "
            "job's start (a name in --elastic-state-dir, not a path)"
        )
    return ElasticSettings(
        min_np=min_np,
        max_np=max_np,
        discovery_script=str(script) if script is not None else None,
        slots_per_host=int(values.get("slots_per_host") or 1),
        timeout=float(timeout),
        reset_limit=values.get("reset_limit"),
        cooldown_range=cooldown,
        max_restarts=int(max_restarts)
        if max_restarts is not None
        else (0 if source == "fixed" else None),
        state_dir=os.path.abspath(os.path.expanduser(str(state_dir))),
        poll_interval=_seconds(environ, ("HVDLITE_ELASTIC_DISCOVERY_INTERVAL",), DEFAULT_INTERVAL),
        source=source,
        resume=str(resume) if resume is not None else None,
    )
