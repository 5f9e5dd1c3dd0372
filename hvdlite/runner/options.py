"""hvdrun's options: the argument parser, the YAML config file, and knob variables.

Every option that may also appear in ``--config-file`` is an :class:`Option`
in :data:`OPTIONS`; the knob options are generated from
:data:`hvdlite.config.KNOBS`, so a new knob gets its flag without an edit here.
Precedence, per option: the command line, then the config file, then (for
knobs) whatever the environment already says (``HVDLITE_*`` or ``HOROVOD_*``).

The parser never exits on bad input: it raises
:class:`~hvdlite.runner.errors.UsageError` with a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
from collections.abc import Callable, Mapping

from ..config import KNOBS, Knob
from ..version import __version__
from .errors import UsageError

__all__ = ["Option", "OPTIONS", "build_parser", "parse_args", "read_config_file",
           "merge", "knob_environment"]

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
MIB = 1024 * 1024


def _number(kind: type, minimum: float, strict: bool = False) -> Callable[[str], object]:
    def convert(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < minimum or (strict and value == minimum):
            bound = f"more than {minimum}" if strict else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


@dataclasses.dataclass(frozen=True)
class Option:
    """One configurable hvdrun option (a flag, and a key in the config file)."""

    dest: str
    flags: tuple[str, ...]
    help: str
    convert: Callable[[str], object] | None = None  # None: an on/off flag
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    knob: Knob | None = None
    to_env: Callable[[object], str] = str

    @property
    def is_flag(self) -> bool:
        return self.convert is None

    @property
    def key(self) -> str:
        """The config-file spelling: the long flag without dashes."""
        longs = [flag for flag in self.flags if flag.startswith("--")]
        return (longs[0] if longs else self.flags[0]).lstrip("-")


# Horovod's flag names for the knobs; a knob missing here gets --<attr-with-dashes>.
_KNOB_FLAGS = {
    "fusion_threshold": "--fusion-threshold-mb",
    "cycle_time_ms": "--cycle-time-ms",
    "cache_capacity": "--cache-capacity",
    "hierarchical_allreduce": "--hierarchical-allreduce",
    "hierarchical_allgather": "--hierarchical-allgather",
    "timeline": "--timeline-filename",
    "timeline_mark_cycles": "--timeline-mark-cycles",
    "stall_check_disable": "--no-stall-check",
    "stall_check_time_seconds": "--stall-check-warning-time-seconds",
    "stall_shutdown_time_seconds": "--stall-check-shutdown-time-seconds",
    "log_level": "--log-level",
    "mpi_threads_disable": "--mpi-threads-disable",
}


def _knob_option(knob: Knob) -> Option:
    flag = _KNOB_FLAGS.get(knob.attr, "--" + knob.attr.replace("_", "-"))
    help_text = f"{knob.help} [sets {knob.env}]"
    if knob.attr == "fusion_threshold":
        return Option(knob.attr, (flag,), "megabytes: " + help_text.split(": ", 1)[-1],
                      _number(float, 0), "MB", knob=knob,
                      to_env=lambda mb: str(int(round(float(mb) * MIB))))
    if knob.attr == "log_level":
        return Option(knob.attr, (flag,), help_text, _log_level, "LEVEL", knob=knob)
    if knob.attr == "overlap":
        return Option(knob.attr, (flag,), help_text, str, None, knob=knob,
                      choices=("auto", "on", "off"))
    if knob.kind is bool:
        return Option(knob.attr, (flag,), help_text, None, knob=knob,
                      to_env=lambda on: "1" if on else "0")
    if knob.kind in (int, float):
        return Option(knob.attr, (flag,), help_text, _number(knob.kind, 0),
                      "N", knob=knob, to_env=lambda v: str(v))
    return Option(knob.attr, (flag,), help_text, str, "VALUE", knob=knob)


LAUNCH_OPTIONS: tuple[Option, ...] = (
    Option("np", ("-np", "-n", "--num-proc"), "number of ranks to start "
           "(default inside SLURM: the allocation's task count)", _number(int, 1), "N"),
    Option("hosts", ("-H", "--hosts"), "hosts and their slots, e.g. node1:2,node2:2 "
           "(default inside SLURM: the allocation; else this machine)", str, "HOST:SLOTS,..."),
    Option("hostfile", ("--hostfile",), "file of 'host slots=N' lines", str, "FILE"),
    Option("launcher", ("--launcher",), "start ranks with mpiexec (default) or with "
           "SLURM's srun", str, None, choices=("mpiexec", "srun")),
    Option("mpi_args", ("--mpi-args",), "extra arguments for mpiexec/srun, "
           "e.g. \"-genv FOO 1\"", str, "ARGS"),
    Option("start_timeout", ("--start-timeout",), "seconds for every rank to start before "
           "hvdrun gives up (default 30, or $HOROVOD_START_TIMEOUT)", _number(float, 0, True),
           "SECONDS"),
    Option("output_filename", ("--output-filename",), "also write each rank's output to "
           "DIR/rank.N/stdout and DIR/rank.N/stderr", str, "DIR"),
    Option("verbose", ("--verbose",), "print the hosts, the MPI and the command before running"),
)
KNOB_OPTIONS: tuple[Option, ...] = tuple(_knob_option(knob) for knob in KNOBS)
OPTIONS: tuple[Option, ...] = LAUNCH_OPTIONS + KNOB_OPTIONS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, and no exit here
        raise UsageError(f"{message} (see hvdrun --help)")


def _add(group, opt: Option) -> None:
    if opt.is_flag:
        group.add_argument(*opt.flags, dest=opt.dest, action="store_const", const=True,
                           default=None, help=opt.help)
    else:
        group.add_argument(*opt.flags, dest=opt.dest, type=opt.convert, default=None,
                           metavar=opt.metavar, choices=opt.choices, help=opt.help)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hvdrun", allow_abbrev=False,
        usage="hvdrun [-np N] [-H HOST:SLOTS,... | --hostfile FILE] [options] command ...",
        description="Start a data-parallel training job: one rank per slot, under MPI "
                    "(mpiexec of MPICH, Open MPI or Intel MPI) or SLURM's srun.",
        epilog="Every knob flag sets an HVDLITE_* environment variable on every rank. "
               "--config-file takes a YAML mapping with the same keys as the flags "
               "(e.g. 'fusion-threshold-mb: 32'); flags on the command line win over it, "
               "and it wins over the environment.",
    )
    parser.add_argument("--version", action="version", version=f"hvdrun (hvdlite) {__version__}")
    launch = parser.add_argument_group("launch")
    for opt in LAUNCH_OPTIONS:
        _add(launch, opt)
    launch.add_argument("--config-file", dest="config_file", metavar="FILE",
                        help="YAML file of option values (keys as the long flags)")
    checks = parser.add_argument_group("diagnostics")
    checks.add_argument("--check-build", action="store_true",
                        help="print what is available (MPI, frameworks, GPU support) and exit")
    checks.add_argument("--dry-run", action="store_true",
                        help="print the command hvdrun would run, then exit")
    knobs = parser.add_argument_group("knobs (each sets an environment variable on every rank)")
    for opt in KNOB_OPTIONS:
        _add(knobs, opt)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program every rank runs, with its arguments")
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse hvdrun's command line; the user's command is ``namespace.command``."""
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args


def _file_value(opt: Option, value: object, where: str) -> object:
    if opt.is_flag:
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
            return value.lower() in ("true", "yes", "on")
        raise UsageError(f"{where}: {opt.key} must be true or false, not {value!r}")
    if isinstance(value, (list, tuple)) and opt.dest == "mpi_args":
        value = shlex.join(str(item) for item in value)
    if value is None or isinstance(value, (dict, list, tuple)):
        raise UsageError(f"{where}: {opt.key} needs a single value, not {value!r}")
    text = str(value)
    try:
        converted = opt.convert(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise UsageError(f"{where}: {opt.key}: {exc}") from None
    if opt.choices and converted not in opt.choices:
        raise UsageError(f"{where}: {opt.key} must be one of {', '.join(opt.choices)}")
    return converted


def read_config_file(path: str) -> dict[str, object]:
    """Option values from a YAML config file, keyed by ``Option.dest``."""
    try:
        import yaml
    except ImportError:
        raise UsageError("--config-file needs PyYAML: pip install pyyaml") from None
    try:
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
    except OSError as exc:
        raise UsageError(f"--config-file {path!r}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise UsageError(f"--config-file {path!r}: not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"--config-file {path!r}: expected a mapping of option: value")
    by_name: dict[str, Option] = {}
    for opt in OPTIONS:
        by_name[opt.dest.replace("_", "-")] = opt
        for flag in opt.flags:
            if flag.startswith("--") or flag == "-np":
                by_name[flag.lstrip("-")] = opt
    values: dict[str, object] = {}
    for key, value in data.items():
        name = str(key).strip().lstrip("-").replace("_", "-")
        opt = by_name.get(name)
        if opt is None:
            raise UsageError(f"--config-file {path!r}: unknown key {key!r} "
                             "(keys are hvdrun's long flags, e.g. fusion-threshold-mb)")
        values[opt.dest] = _file_value(opt, value, f"--config-file {path!r}")
    return values


def merge(args: argparse.Namespace, file_values: Mapping[str, object]) -> dict[str, object]:
    """Each option's value: the command line's, else the config file's, else None."""
    merged = {}
    for opt in OPTIONS:
        value = getattr(args, opt.dest, None)
        merged[opt.dest] = value if value is not None else file_values.get(opt.dest)
    return merged


def knob_environment(values: Mapping[str, object]) -> dict[str, str]:
    """The ``HVDLITE_*`` variables to set on every rank for the knobs that were given."""
    env = {}
    for opt in KNOB_OPTIONS:
        value = values.get(opt.dest)
        if value is not None:
            env[opt.knob.env] = opt.to_env(value)
    return env
