"""hvdrun's options: the argument parser, knob variables, and horovodrun's other flags.

Every option that may also appear in ``--config-file`` is an :class:`Option`
in :data:`OPTIONS`; the knob options are generated from
:data:`hvdlite.config.KNOBS`, so a new knob gets its flag without an edit here.
Precedence, per option: the command line, then the config file (see
:mod:`.configfile`), then (for knobs) whatever the environment already says
(``HVDLITE_*`` or ``HOROVOD_*``).

Every flag of ``horovodrun`` 0.28 parses.  The elastic options
(:data:`ELASTIC_OPTIONS`) are read by :mod:`.elastic_settings`.  Those naming
machinery hvdlite does not have (Gloo, jsrun, torus allreduce) end hvdrun
with exit 2 and a line that says what to use instead (:data:`UNAVAILABLE`,
:func:`check_available`); every on/off option also has its opposite
(``--no-hierarchical-allreduce``, ``--stall-check``).

The parser never exits on bad input: it raises
:class:`~hvdlite.runner.errors.UsageError` with a one-line message.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Mapping

from ..config import KNOBS, Knob
from ..version import __version__
from .errors import UsageError

__all__ = [
    "Option",
    "OPTIONS",
    "ELASTIC_OPTIONS",
    "UNAVAILABLE",
    "AFTER_MERGE",
    "build_parser",
    "parse_args",
    "merge",
    "check_available",
    "knob_environment",
]

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
MIB = 1024 * 1024
MAX_FUSION_MB = 1024 * 1024  # 1 TiB
_INTERFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def _number(
    kind: type, minimum: float, strict: bool = False, maximum: float | None = None
) -> Callable[[str], object]:
    """A converter for a numeric flag: a finite *kind* from *minimum* (excluded when
    *strict*) up to *maximum*; anything else is an ArgumentTypeError naming the range."""

    def convert(text: str):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if value < minimum or (strict and value == minimum):
            bound = f"more than {minimum}" if strict else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{text!r} must be {bound}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {maximum}")
        return value

    convert.__name__ = kind.__name__
    return convert


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return text.upper()


def _interfaces(text: str) -> tuple[str, ...]:
    """``eth0`` or ``eth0,eth1`` -> the interface names, each checked."""
    names = tuple(part.strip() for part in str(text).split(","))
    for name in names:
        if not _INTERFACE.match(name):
            raise argparse.ArgumentTypeError(f"{name!r} is not a network interface name")
    return names


def _core_list(text: str) -> str:
    """``3`` or ``0,8,16``: one core id per local rank (Horovod's HOROVOD_THREAD_AFFINITY)."""
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a core id or a comma-separated list of core ids"
        )
    return ",".join(str(int(part)) for part in parts)


def _ssh_identity(text: str) -> str:
    if not text.strip() or any(char.isspace() for char in text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the path must be non-empty and without white space (MPI launchers "
            "split their ssh arguments at spaces)"
        )
    return text


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
    to_env: Callable[[object], str | None] = str  # None: set nothing for this value
    env: str | None = None  # the variable a non-knob option sets on every rank
    negations: tuple[str, ...] = ()  # flags that turn an on/off option off
    repeat: bool = False  # the flag may repeat; each value is a comma-separated list
    nargs: int | None = None  # values the flag takes, when more than one (a list)

    @property
    def is_flag(self) -> bool:
        return self.convert is None

    @property
    def variable(self) -> str | None:
        """The variable this option sets on every rank, if any."""
        return self.knob.env if self.knob is not None else self.env

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
    "log_hide_time": "--log-without-timestamp",
    "autotune": "--autotune",
    "autotune_log": "--autotune-log-file",
    "autotune_warmup_samples": "--autotune-warmup-samples",
    "autotune_steps_per_sample": "--autotune-steps-per-sample",
    "autotune_bayes_opt_max_samples": "--autotune-bayes-opt-max-samples",
    "autotune_gaussian_process_noise": "--autotune-gaussian-process-noise",
}
# The smallest value of a numeric knob flag, where it is not 0: (minimum, excluded).
_KNOB_MINIMUM = {
    "autotune_steps_per_sample": (1, False),
    "autotune_bayes_opt_max_samples": (1, False),
    "autotune_gaussian_process_noise": (0, True),
}


def _opposite(flag: str) -> str:
    """``--x`` <-> ``--no-x``: the flag that turns an on/off option the other way."""
    return "--" + flag[5:] if flag.startswith("--no-") else "--no-" + flag[2:]


def _on_off(on: object) -> str:
    return "1" if on else "0"


def _knob_option(knob: Knob) -> Option:
    flag = _knob_flag(knob)
    help_text = f"{knob.help} [sets {knob.env}]"
    if knob.attr == "fusion_threshold":
        return Option(
            knob.attr,
            (flag,),
            "megabytes: " + help_text.split(": ", 1)[-1],
            _number(float, 0, maximum=MAX_FUSION_MB),
            "MB",
            knob=knob,
            to_env=lambda mb: str(int(round(float(mb) * MIB))),
        )
    if knob.attr == "log_level":
        return Option(knob.attr, (flag,), help_text, _log_level, "LEVEL", knob=knob)
    if knob.attr == "overlap":
        return Option(
            knob.attr, (flag,), help_text, str, None, knob=knob, choices=("auto", "on", "off")
        )
    if knob.kind is bool:
        return Option(
            knob.attr,
            (flag,),
            help_text,
            None,
            knob=knob,
            to_env=_on_off,
            negations=(_opposite(flag),),
        )
    if knob.kind in (int, float):
        minimum, strict = _KNOB_MINIMUM.get(knob.attr, (0, False))
        return Option(
            knob.attr,
            (flag,),
            help_text,
            _number(knob.kind, minimum, strict),
            "N",
            knob=knob,
            to_env=lambda v: str(v),
        )
    return Option(knob.attr, (flag,), help_text, str, "VALUE", knob=knob)


def _knob_flag(knob: Knob) -> str:
    return _KNOB_FLAGS.get(knob.attr, "--" + knob.attr.replace("_", "-"))


def _rank_count(text: str) -> object:
    """-np's value.  ``-np2`` (no space) reaches argparse as ``-n`` with the value
    ``p2``: take it as the 2 it means."""
    if re.fullmatch(r"p=?\d+", text.strip()):
        text = text.strip().lstrip("p=")
    return _number(int, 1)(text)


_rank_count.__name__ = "int"

LAUNCH_OPTIONS: tuple[Option, ...] = (
    Option(
        "np",
        ("-np", "-n", "--num-proc"),
        "number of ranks to start (default inside SLURM: the allocation's task count)",
        _rank_count,
        "N",
    ),
    Option(
        "hosts",
        ("-H", "--hosts"),
        "hosts and their slots, e.g. node1:2,node2:2 "
        "(default inside SLURM: the allocation; else this machine)",
        str,
        "HOST:SLOTS,...",
    ),
    Option("hostfile", ("-hostfile", "--hostfile"), "file of 'host slots=N' lines", str, "FILE"),
    Option(
        "launcher",
        ("--launcher",),
        "start ranks with mpiexec (default) or with SLURM's srun",
        str,
        None,
        choices=("mpiexec", "srun"),
    ),
    Option(
        "mpi_args",
        ("--mpi-args",),
        'extra arguments for mpiexec/srun, e.g. --mpi-args="-genv FOO 1"',
        str,
        "ARGS",
    ),
    Option(
        "start_timeout",
        ("--start-timeout",),
        "seconds for every rank to start before "
        "hvdrun gives up (default 30, or $HOROVOD_START_TIMEOUT)",
        _number(float, 0, True),
        "SECONDS",
    ),
    Option(
        "frozen_timeout",
        ("--frozen-timeout",),
        "seconds a rank may stay stopped (SIGSTOP) before its task wrapper kills it, "
        "which ends the job naming the rank, or relaunches it under an elastic option "
        "(default 30 in elastic jobs, 0 otherwise; 0: never)",
        _number(float, 0),
        "SECONDS",
    ),
    Option(
        "silent_host_timeout",
        ("--silent-host-timeout",),
        "seconds without a word from a rank's task wrapper (they speak every few "
        "seconds) before hvdrun takes its host as cut off (down, or its link cut), "
        "stops the job naming it, and under an elastic option relaunches without it "
        "(default 30 in elastic jobs, 0 otherwise; 0: never)",
        _number(float, 0),
        "SECONDS",
    ),
    Option(
        "output_filename",
        ("--output-filename",),
        "also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr",
        str,
        "DIR",
    ),
    Option(
        "prefix_output_with_timestamp",
        ("-prefix-timestamp", "--prefix-output-with-timestamp"),
        "start every output line of every rank with the time it was printed",
    ),
    Option("verbose", ("--verbose",), "print the hosts, the MPI and the command before running"),
    Option(
        "use_mpi",
        ("--mpi",),
        "run on MPI (accepted for horovodrun scripts: hvdlite always runs on MPI)",
    ),
    Option(
        "disable_cache",
        ("--disable-cache",),
        "accepted for horovodrun scripts: hvdrun "
        "keeps no cache of its start-up checks, it runs them every time",
    ),
    Option(
        "as_horovod",
        ("--as-horovod",),
        "run a program written for Horovod unchanged: in every rank `import horovod` "
        "(horovod.torch, horovod.tensorflow, horovod.keras, horovod.run, ...) gives hvdlite "
        "(puts hvdlite's horovod package first on the ranks' PYTHONPATH)",
    ),
)

NETWORK_OPTIONS: tuple[Option, ...] = (
    Option(
        "ssh_port",
        ("-p", "--ssh-port"),
        "ssh port of the other hosts (MPICH: "
        "HYDRA_LAUNCHER_EXTRA_ARGS, Intel MPI: -bootstrap-exec-args, Open MPI: "
        "--mca plm_rsh_args)",
        _number(int, 1, maximum=65535),
        "PORT",
    ),
    Option(
        "ssh_identity_file",
        ("-i", "--ssh-identity-file"),
        "private key file ssh uses to reach the other hosts",
        _ssh_identity,
        "FILE",
    ),
    Option(
        "network_interfaces",
        ("--network-interfaces", "--network-interface"),
        "network interface(s) for the job's traffic, comma-separated or repeated "
        "(MPICH/Intel MPI: -iface, Open MPI: btl_tcp_if_include and oob_tcp_if_include; "
        "NCCL: NCCL_SOCKET_IFNAME)",
        _interfaces,
        "NIC[,NIC...]",
        repeat=True,
    ),
    Option(
        "binding_args",
        ("--binding-args",),
        "CPU binding arguments for the launcher, "
        "instead of its 'no binding' default, e.g. --binding-args=\"-bind-to core\"",
        str,
        "ARGS",
    ),
    Option(
        "tcp",
        ("--tcp",),
        "keep NCCL off InfiniBand: TCP only (sets NCCL_IB_DISABLE=1, as horovodrun does)",
        env="NCCL_IB_DISABLE",
        to_env=lambda on: "1" if on else None,
    ),
)

LIBRARY_OPTIONS: tuple[Option, ...] = (
    Option(
        "thread_affinity",
        ("--thread-affinity",),
        "pin each rank's engine thread to a "
        "core: one id, or one per local rank (sets HVDLITE_THREAD_AFFINITY)",
        _core_list,
        "CORE[,CORE...]",
        env="HVDLITE_THREAD_AFFINITY",
    ),
    Option(
        "num_nccl_streams",
        ("--num-nccl-streams",),
        "NCCL streams per device (sets "
        "HVDLITE_NUM_NCCL_STREAMS; hvdlite uses one stream per process set)",
        _number(int, 1),
        "N",
        env="HVDLITE_NUM_NCCL_STREAMS",
    ),
    Option(
        "log_with_timestamp",
        ("--log-with-timestamp", "--no-log-hide-timestamp"),
        "time-stamp hvdlite's log lines (--log-without-timestamp: do not; sets "
        "HVDLITE_LOG_HIDE_TIME)",
        env="HVDLITE_LOG_HIDE_TIME",
        to_env=lambda on: "0" if on else "1",
        negations=("--log-without-timestamp", "--log-hide-timestamp"),
    ),
    Option(
        "master_port",
        ("--master-port",),
        "set MASTER_PORT=PORT and MASTER_ADDR (rank 0's host, or --master-addr) on every "
        "rank, for torch.distributed code written for torchrun (RANK, LOCAL_RANK, "
        "WORLD_SIZE and LOCAL_WORLD_SIZE are always set)",
        _number(int, 1, maximum=65535),
        "PORT",
        env="MASTER_PORT",
    ),
    Option(
        "master_addr",
        ("--master-addr",),
        "the MASTER_ADDR every rank gets (default with --master-port: the first host, "
        "where rank 0 runs)",
        str,
        "HOST",
        env="MASTER_ADDR",
    ),
    Option(
        "torus_allreduce",
        ("--torus-allreduce",),
        "not available in hvdlite (an error "
        "that names --hierarchical-allreduce); --no-torus-allreduce is accepted",
        negations=("--no-torus-allreduce",),
    ),
)


def _directory(text: str) -> str:
    if not str(text).strip():
        raise argparse.ArgumentTypeError("the directory name must not be empty")
    return str(text)


ELASTIC_OPTIONS: tuple[Option, ...] = (
    Option(
        "min_np",
        ("--min-np", "--min-num-proc"),
        "elastic: the fewest ranks the job may "
        "run with (default -np); below it hvdrun waits up to --elastic-timeout for hosts, "
        "then ends the job",
        _number(int, 1),
        "N",
    ),
    Option(
        "max_np",
        ("--max-np", "--max-num-proc"),
        "elastic: the most ranks the job may "
        "grow to (default -np, or every discovered slot without -np)",
        _number(int, 1),
        "N",
    ),
    Option(
        "slots_per_host",
        ("--slots-per-host",),
        "elastic: slots of a discovered host whose line has no ':SLOTS' (default 1)",
        _number(int, 1),
        "N",
    ),
    Option(
        "host_discovery_script",
        ("--host-discovery-script",),
        "elastic: a program that "
        "prints the hosts available now, one 'host' or 'host:slots' a line; hvdrun runs "
        "it before every launch and polls it while the job runs",
        str,
        "SCRIPT",
    ),
    Option(
        "elastic_timeout",
        ("--elastic-timeout",),
        "elastic: seconds to wait for "
        "--min-np slots before a (re)launch (default 600, or $HOROVOD_ELASTIC_TIMEOUT)",
        _number(float, 0, True),
        "SECONDS",
    ),
    Option(
        "reset_limit",
        ("--reset-limit",),
        "elastic: the most relaunches, for any reason "
        "(host changes and failures); default no limit",
        _number(int, 0),
        "N",
    ),
    Option(
        "blacklist_cooldown_range",
        ("--blacklist-cooldown-range",),
        "elastic: a host "
        "where a rank failed is left out for MIN seconds, doubling with each failure up "
        "to MAX (default: for the rest of the job)",
        _number(float, 0),
        ("MIN", "MAX"),
        nargs=2,
    ),
    Option(
        "max_restarts",
        ("--max-restarts",),
        "relaunch the job from its last elastic "
        "commit after up to N failures (also without host discovery: hvdrun -np 4 "
        "--max-restarts 3); default 0 for a fixed host list, no limit with discovery",
        _number(int, 0),
        "N",
    ),
    Option(
        "elastic_state_dir",
        ("--elastic-state-dir",),
        "elastic: where commits are kept "
        "(a subdirectory per job); must be shared by hvdrun's host and every rank's host "
        "(default .hvdlite-elastic in the working directory, or "
        "$HVDLITE_ELASTIC_STATE_DIR)",
        _directory,
        "DIR",
    ),
    Option(
        "elastic_resume",
        ("--elastic-resume",),
        "elastic: resume the job JOB_ID (its "
        "subdirectory of --elastic-state-dir, named at its start) from its last commit, "
        "after hvdrun itself ended (a node reboot, a batch time limit)",
        str,
        "JOB_ID",
    ),
    Option(
        "elastic_background_commit",
        ("--elastic-background-commit",),
        "elastic: rank 0 "
        "writes each commit on a thread while training goes on, for slow shared file "
        "systems; a commit is then on disk only by the next commit() and rank 0 dying "
        "before can lose it (default --elastic-sync-commit: commit() returns on every "
        "rank once the file is on disk; sets HVDLITE_ELASTIC_BACKGROUND_COMMIT)",
        env="HVDLITE_ELASTIC_BACKGROUND_COMMIT",
        to_env=lambda on: "1" if on else "0",
        negations=("--elastic-sync-commit",),
    ),
)

_OWN_FLAGS = {
    flag
    for opt in LAUNCH_OPTIONS + NETWORK_OPTIONS + LIBRARY_OPTIONS
    for flag in opt.flags + opt.negations
}
# A knob whose flag a hand-written option already has is set through that option.
KNOB_OPTIONS: tuple[Option, ...] = tuple(
    _knob_option(knob) for knob in KNOBS if _knob_flag(knob) not in _OWN_FLAGS
)
OPTIONS: tuple[Option, ...] = (
    LAUNCH_OPTIONS + NETWORK_OPTIONS + LIBRARY_OPTIONS + ELASTIC_OPTIONS + KNOB_OPTIONS
)

# horovodrun flags for machinery hvdlite does not have: (flags, values taken, message).
UNAVAILABLE: tuple[tuple[tuple[str, ...], int, str], ...] = (
    (
        ("--gloo",),
        0,
        "hvdlite has no Gloo controller: it always runs on MPI; drop --gloo (or say --mpi)",
    ),
    (
        ("--gloo-timeout-seconds",),
        1,
        "hvdlite has no Gloo controller; for a time limit on "
        "every wait between ranks use --collective-timeout "
        "SECONDS",
    ),
    (
        ("--jsrun",),
        0,
        "hvdrun does not launch with LSF's jsrun: use its default mpiexec "
        "launcher with -H/--hostfile (or --launcher srun under SLURM)",
    ),
)
AFTER_MERGE = {
    "torus_allreduce": (
        "--torus-allreduce",
        "hvdlite has no torus allreduce: use "
        "--hierarchical-allreduce (reduce inside each "
        "node, then across nodes)",
    )
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump, and no exit here
        raise UsageError(f"{message} (see hvdrun --help)")


class _Unavailable(argparse.Action):
    """A horovodrun flag hvdlite cannot honour: using it is an error that says why."""

    def __init__(self, option_strings, dest, message: str = "", **kwargs) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        raise UsageError(f"{option_string}: {self.message}")


class _CommaList(argparse.Action):
    """A repeatable flag whose value is a comma-separated list; the values accumulate."""

    def __call__(self, parser, namespace, values, option_string=None):
        so_far = getattr(namespace, self.dest, None) or ()
        setattr(namespace, self.dest, so_far + tuple(v for v in values if v not in so_far))


def _add(group, opt: Option) -> None:
    if opt.repeat:
        group.add_argument(
            *opt.flags,
            dest=opt.dest,
            action=_CommaList,
            type=opt.convert,
            default=None,
            metavar=opt.metavar,
            help=opt.help,
        )
    elif opt.is_flag:
        group.add_argument(
            *opt.flags, dest=opt.dest, action="store_const", const=True, default=None, help=opt.help
        )
        if opt.negations:
            group.add_argument(
                *opt.negations,
                dest=opt.dest,
                action="store_const",
                const=False,
                default=None,
                help=argparse.SUPPRESS,
            )
    else:
        group.add_argument(
            *opt.flags,
            dest=opt.dest,
            type=opt.convert,
            default=None,
            metavar=opt.metavar,
            choices=opt.choices,
            help=opt.help,
            nargs=opt.nargs,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hvdrun",
        allow_abbrev=False,
        usage="hvdrun [-np N] [-H HOST:SLOTS,... | --hostfile FILE] [options] command ...",
        description="Start a data-parallel training job: one rank per slot, under MPI "
        "(mpiexec of MPICH, Open MPI or Intel MPI) or SLURM's srun.",
        epilog="Every knob flag sets an HVDLITE_* environment variable on every rank. "
        "Every on/off flag has an opposite: --no-X for --X (--stall-check for "
        "--no-stall-check, --log-without-timestamp for --log-with-timestamp). "
        "--config-file takes a YAML mapping with the same keys as the flags "
        "(e.g. 'fusion-threshold-mb: 32') or horovodrun's nested layout "
        "('params:', 'timeline:', ...); flags on the command line win over it, "
        "and it wins over the environment.",
    )
    parser.add_argument(
        "-v", "--version", action="version", version=f"hvdrun (hvdlite) {__version__}"
    )
    launch = parser.add_argument_group("launch")
    for opt in LAUNCH_OPTIONS:
        _add(launch, opt)
    launch.add_argument(
        "--config-file",
        dest="config_file",
        metavar="FILE",
        help="YAML file of option values (keys as the long flags, or horovodrun's sections)",
    )
    network = parser.add_argument_group("hosts, ssh and network")
    for opt in NETWORK_OPTIONS:
        _add(network, opt)
    checks = parser.add_argument_group("diagnostics")
    checks.add_argument(
        "-cb",
        "--check-build",
        action="store_true",
        help="print what is available (MPI, frameworks, GPU support) and exit",
    )
    checks.add_argument(
        "--dry-run", action="store_true", help="print the command hvdrun would run, then exit"
    )
    elastic = parser.add_argument_group(
        "elastic training (relaunch from the last commit after a failure or a host change)"
    )
    for opt in ELASTIC_OPTIONS:
        _add(elastic, opt)
    library = parser.add_argument_group("library (each sets a variable on every rank)")
    for opt in LIBRARY_OPTIONS:
        _add(library, opt)
    knobs = parser.add_argument_group("knobs (each sets an environment variable on every rank)")
    for opt in KNOB_OPTIONS:
        _add(knobs, opt)
    missing = parser.add_argument_group(
        "horovodrun flags for what hvdlite does not have (each is an error saying what to "
        "use instead)"
    )
    for flags, nargs, message in UNAVAILABLE:
        metavar = {0: None, 1: "VALUE", 2: ("MIN", "MAX")}[nargs]
        missing.add_argument(
            *flags,
            action=_Unavailable,
            nargs=nargs,
            metavar=metavar,
            message=message,
            help=message.split(":")[0],
        )
    parser.add_argument(
        "command", nargs=argparse.REMAINDER, help="the program every rank runs, with its arguments"
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse hvdrun's command line; the user's command is ``namespace.command``."""
    args = build_parser().parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    return args


def merge(args: argparse.Namespace, file_values: Mapping[str, object]) -> dict[str, object]:
    """Each option's value: the command line's, else the config file's, else None."""
    merged = {}
    for opt in OPTIONS:
        value = getattr(args, opt.dest, None)
        merged[opt.dest] = value if value is not None else file_values.get(opt.dest)
    return merged


def check_available(values: Mapping[str, object]) -> None:
    """UsageError when the merged *values* turn on something hvdlite does not have."""
    for dest, (flag, message) in AFTER_MERGE.items():
        if values.get(dest):
            raise UsageError(f"{flag}: {message}")


def knob_environment(values: Mapping[str, object]) -> dict[str, str]:
    """The variables to set on every rank for the knob (and library) options given."""
    env = {}
    for opt in OPTIONS:
        value = values.get(opt.dest)
        if value is not None and opt.variable is not None:
            text = opt.to_env(value)
            if text is not None:
                env[opt.variable] = text
    return env
