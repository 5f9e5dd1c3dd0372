"""``hvdrun --config-file``: option values from YAML, flat or in horovodrun's layout.

Two layouts, which one file may mix:

- flat: one key per option, spelled as its long flag without the dashes
  (``-`` or ``_``): ``fusion-threshold-mb: 32``, ``no-stall-check: true``;
- horovodrun's sections (what its ``--config-file`` reads)::

      controller: mpi
      params:          {fusion_threshold_mb, cycle_time_ms, cache_capacity,
                        hierarchical_allreduce, hierarchical_allgather, torus_allreduce}
      autotune:        {enabled, log_file, warmup_samples, steps_per_sample,
                        bayes_opt_max_samples, gaussian_process_noise}
      timeline:        {filename, mark_cycles}
      stall_check:     {enabled, warning_time_seconds, shutdown_time_seconds}
      library_options: {mpi_threads_disable, num_nccl_streams, thread_affinity,
                        ccl_bgt_affinity, gloo_timeout_seconds}
      logging:         {level, with_timestamp, hide_timestamp}
      elastic:         {min_np, max_np, slots_per_host, host_discovery_script,
                        elastic_timeout, reset_limit, blacklist_cooldown_range,
                        max_restarts, elastic_state_dir,
                        elastic_background_commit}   (hvdlite's own section)

An unknown key, a value of the wrong kind, an option set twice, or a setting
for something hvdlite does not have (the Gloo controller, torus allreduce) is a
:class:`~hvdlite.runner.errors.UsageError` that names the key and the file.
``autotune``'s other keys set their knobs whether or not it is enabled; they
only matter when it is.
"""

from __future__ import annotations

import argparse
import shlex

from .errors import UsageError
from .options import AFTER_MERGE, OPTIONS, UNAVAILABLE, Option

__all__ = ["read_config_file", "SECTIONS"]

_GLOO = "hvdlite has no Gloo controller: it always runs on MPI"
_UNUSED = None  # a key horovodrun reads that changes nothing here
# section -> key -> (option dest, inverted?) | _UNUSED | the error message for the key.
SECTIONS: dict[str, dict[str, tuple[str, bool] | str | None]] = {
    "params": {
        "fusion_threshold_mb": ("fusion_threshold", False),
        "cycle_time_ms": ("cycle_time_ms", False),
        "cache_capacity": ("cache_capacity", False),
        "hierarchical_allreduce": ("hierarchical_allreduce", False),
        "hierarchical_allgather": ("hierarchical_allgather", False),
        "torus_allreduce": ("torus_allreduce", False),
    },
    "autotune": {
        "enabled": ("autotune", False),
        "log_file": ("autotune_log", False),
        "warmup_samples": ("autotune_warmup_samples", False),
        "steps_per_sample": ("autotune_steps_per_sample", False),
        "bayes_opt_max_samples": ("autotune_bayes_opt_max_samples", False),
        "gaussian_process_noise": ("autotune_gaussian_process_noise", False),
    },
    "timeline": {"filename": ("timeline", False), "mark_cycles": ("timeline_mark_cycles", False)},
    "stall_check": {
        "enabled": ("stall_check_disable", True),
        "warning_time_seconds": ("stall_check_time_seconds", False),
        "shutdown_time_seconds": ("stall_shutdown_time_seconds", False),
    },
    "library_options": {
        "mpi_threads_disable": ("mpi_threads_disable", False),
        "num_nccl_streams": ("num_nccl_streams", False),
        "thread_affinity": ("thread_affinity", False),
        "ccl_bgt_affinity": ("thread_affinity", False),  # its name before Horovod 0.21
        "gloo_timeout_seconds": _GLOO + "; for a time limit on every wait between ranks "
        "use collective-timeout",
    },
    "logging": {
        "level": ("log_level", False),
        "with_timestamp": ("log_with_timestamp", False),
        "hide_timestamp": ("log_with_timestamp", True),
    },
    # hvdlite's own (horovodrun's file has no elastic section): the flags' names, and
    # the names of horovod.run's arguments.
    "elastic": {
        "min_np": ("min_np", False),
        "max_np": ("max_np", False),
        "slots_per_host": ("slots_per_host", False),
        "slots": ("slots_per_host", False),
        "host_discovery_script": ("host_discovery_script", False),
        "elastic_timeout": ("elastic_timeout", False),
        "timeout": ("elastic_timeout", False),
        "reset_limit": ("reset_limit", False),
        "blacklist_cooldown_range": ("blacklist_cooldown_range", False),
        "cooldown_range": ("blacklist_cooldown_range", False),
        "max_restarts": ("max_restarts", False),
        "elastic_state_dir": ("elastic_state_dir", False),
        "state_dir": ("elastic_state_dir", False),
        "elastic_background_commit": ("elastic_background_commit", False),
        "background_commit": ("elastic_background_commit", False),
    },
}


def _by_dest() -> dict[str, Option]:
    return {opt.dest: opt for opt in OPTIONS}


def _flat_names() -> dict[str, tuple[Option, bool] | str]:
    """Flat key (dashes) -> (option, inverted?), or the error message of a missing feature."""
    names: dict[str, tuple[Option, bool] | str] = {}
    for opt in OPTIONS:
        names[opt.dest.replace("_", "-")] = (opt, False)
        for flag in opt.flags:
            if flag.startswith("--") or flag in ("-np", "-hostfile"):
                names[flag.lstrip("-")] = (opt, False)
        for flag in opt.negations:
            names[flag.lstrip("-")] = (opt, True)
    for flags, _nargs, message in UNAVAILABLE:
        for flag in flags:
            names[flag.lstrip("-")] = message
    return names


def _file_value(opt: Option, value: object, where: str, label: str, invert: bool = False) -> object:
    """*value* from the file, converted and checked as the flag's would be."""
    if opt.is_flag:
        if isinstance(value, bool) or value in (0, 1):
            on = bool(value)
        elif isinstance(value, str) and value.lower() in (
            "true",
            "false",
            "yes",
            "no",
            "on",
            "off",
        ):
            on = value.lower() in ("true", "yes", "on")
        else:
            raise UsageError(f"{where}: {label} must be true or false, not {value!r}")
        return not on if invert else on
    if opt.nargs:  # a fixed number of values: a list in the file, or one string
        items = value.split() if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or len(items) != opt.nargs:
            raise UsageError(
                f"{where}: {label} needs {opt.nargs} values, e.g. "
                f"[{', '.join(['1'] * opt.nargs)}], not {value!r}"
            )
        try:
            return [opt.convert(str(item)) for item in items]
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise UsageError(f"{where}: {label}: {exc}") from None
    if isinstance(value, (list, tuple)) and opt.dest == "mpi_args":
        value = shlex.join(str(item) for item in value)
    if isinstance(value, (list, tuple)) and opt.repeat:
        value = ",".join(str(item) for item in value)
    if value is None or isinstance(value, (dict, list, tuple)):
        raise UsageError(f"{where}: {label} needs a single value, not {value!r}")
    try:
        converted = opt.convert(str(value))
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UsageError(f"{where}: {label}: {exc}") from None
    if opt.choices and converted not in opt.choices:
        raise UsageError(f"{where}: {label} must be one of {', '.join(opt.choices)}")
    return converted


def _load(path: str) -> object:
    try:
        import yaml
    except ImportError:
        raise UsageError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise UsageError(f"--config-file {path!r}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"--config-file {path!r}: not valid YAML{line}") from None


class _Values:
    """The values read so far, each with the key it came from (an option set twice is
    an error)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.values: dict[str, object] = {}
        self.labels: dict[str, str] = {}

    def set(self, dest: str, value: object, label: str) -> None:
        if dest in self.labels:
            raise UsageError(
                f"{self.where}: {label} sets what {self.labels[dest]} already "
                "sets; keep one of them"
            )
        self.values[dest], self.labels[dest] = value, label


def _read_section(section: str, body: object, out: _Values) -> None:
    where, keys = out.where, SECTIONS[section]
    if body is None:
        return
    if not isinstance(body, dict):
        raise UsageError(f"{where}: {section} must be a mapping of key: value, not {body!r}")
    options = _by_dest()
    for key, value in body.items():
        label = f"{section}.{key}"
        if str(key) not in keys:
            known = ", ".join(keys)
            raise UsageError(
                f"{where}: unknown key {label!r} (horovodrun's keys in {section}: {known})"
            )
        target = keys[str(key)]
        if target is _UNUSED:
            continue
        if isinstance(target, str):
            raise UsageError(f"{where}: {label}: {target}")
        dest, invert = target
        out.set(dest, _file_value(options[dest], value, where, label, invert), label)


def _read_controller(value: object, out: _Values) -> None:
    name = str(value).strip().lower()
    if name == "gloo":
        raise UsageError(
            f"{out.where}: controller: {_GLOO}; write 'controller: mpi' or leave it out"
        )
    if name != "mpi":
        raise UsageError(f"{out.where}: controller must be mpi, not {value!r}")
    out.set("use_mpi", True, "controller")


def read_config_file(path: str) -> dict[str, object]:
    """Option values from the YAML file at *path*, keyed by ``Option.dest``."""
    data = _load(path)
    where = f"--config-file {path!r}"
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of option: value")
    out = _Values(where)
    flat = _flat_names()
    for key, value in data.items():
        label = str(key).strip()
        found = flat.get(label.lstrip("-").replace("_", "-"))
        if label in SECTIONS and (isinstance(value, dict) or value is None or found is None):
            _read_section(label, value, out)  # e.g. 'timeline: {filename: t.json}'
            continue
        if label == "controller":
            _read_controller(value, out)
            continue
        if found is None:
            raise UsageError(
                f"{where}: unknown key {key!r} (keys are hvdrun's long flags, "
                "e.g. fusion-threshold-mb, or horovodrun's sections, e.g. params)"
            )
        if isinstance(found, str):
            if value in (False, None):
                continue
            raise UsageError(f"{where}: {label}: {found}")
        opt, invert = found
        out.set(opt.dest, _file_value(opt, value, where, label, invert), label)
    for dest, (_flag, message) in AFTER_MERGE.items():
        if out.values.get(dest):
            raise UsageError(f"{where}: {out.labels[dest]}: {message}")
    return out.values
