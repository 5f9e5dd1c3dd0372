"""``hvdrun``: the command-line entry point (also ``python -m hvdlite.runner``).

``main`` turns the command line into a launch in four steps, each in its own
module: options (flags + config file -> values, knob variables), hosts (``-H``,
``--hostfile`` or the SLURM allocation -> hosts and slots), command (MPI flavour
-> argument list) and job (run, watch, report).  All input is checked before
anything starts; bad input exits 2 with one line on stderr.  With an elastic
option (:mod:`.elastic_settings`) the launch repeats under
:mod:`.elastic_driver`, each time through :func:`prepare` with the hosts it chose.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

# Not `from .. import horovod_compat`: that asks the hvdlite package for the name, and
# its lazy __getattr__ would import the basics (numpy) into hvdrun.
from ..horovod_compat import rank_environment as horovod_environment
from . import elastic_settings, lifeline, protocol, slurm, sshcheck
from .command import (
    LaunchSpec,
    forwarded_names,
    launcher_environment,
    mpiexec_command,
    srun_command,
    srun_mpi_plugin,
)
from .errors import USAGE_EXIT, UsageError
from .hosts import (
    Host,
    all_local,
    format_hosts,
    is_local_host,
    parse_hosts,
    rank_hosts,
    read_hostfile,
    total_slots,
    used_hosts,
)
from .mpi import NO_MPI_HINT, MpiInfo, detect, find_mpiexec
from .configfile import read_config_file
from .options import check_available, knob_environment, merge, parse_args

__all__ = ["main", "prepare", "describe", "Launch"]

WRAPPER = Path(__file__).resolve().with_name("task_wrapper.py")
DEFAULT_START_TIMEOUT = 30.0
HOST_CHECK_EXIT = 1  # ssh cannot reach a host: nothing was started (horovodrun's RuntimeError)
REPORT_TAIL_LINES = 10
# In an elastic job a rank stopped this long (SIGSTOP: a frozen process) is killed, so
# that the job relaunches from its last commit instead of waiting on it forever.
ELASTIC_FROZEN_TIMEOUT = 30.0
# In an elastic job a host none of whose ranks' wrappers has been heard from this long
# (a cut link, a hung host: TCP retries in silence) ends the launch, which relaunches
# without it, instead of every other rank waiting on it.
ELASTIC_SILENT_HOST_TIMEOUT = 30.0


@dataclasses.dataclass(frozen=True)
class Launch:
    """Everything decided before launch.

    ``cmd`` is the launcher's argument list, ``env`` the launcher's whole
    environment (inherited + knob variables + the job's status-line token and
    owner, see :mod:`.job`), ``extra_env`` the variables a shell line must show
    in front of ``cmd``: the job's variables (knobs, ``hvdlite.run(env=...)``),
    which travel in the launcher's environment, never on its command line, and
    the launcher's own; ``hosts`` is
    None when the job stays on this machine.  ``notes`` are lines hvdrun prints
    before it starts (options given that change nothing here).  ``ssh_hosts``
    are the other hosts the launcher reaches through ssh (with ``ssh_args``):
    hvdrun checks that it can log in to each before it starts anything.
    """

    cmd: list[str]
    env: dict[str, str]
    extra_env: dict[str, str]
    np: int
    hosts: Sequence[Host] | None
    start_timeout: float
    launcher: str
    mpi: MpiInfo | None
    verbose: bool
    notes: tuple[str, ...] = ()
    ssh_hosts: tuple[str, ...] = ()
    ssh_args: tuple[str, ...] = ()
    silent_timeout: float = 0.0  # --silent-host-timeout (0: off); the wrappers beat

    def shell_line(self) -> str:
        """The command as one shell line, the job's variables in front; a value that may
        be a secret (any but hvdrun's own knobs and launcher settings) shows as ``***``."""
        prefix = [f"{k}={shlex.quote(shown_value(k, v))}" for k, v in self.extra_env.items()]
        return " ".join(prefix + [shlex.join(self.cmd)])


# Variables whose values hvdrun prints: its own knobs and launcher settings (they come
# from hvdrun's flags, on its own command line anyway).  Any other value -- e.g. from
# hvdlite.run(env=...) -- may be a secret and is printed as ***.
_SHOWN_PREFIXES = (
    "HVDLITE_",
    "HOROVOD_",
    "NCCL_",
    "MPIR_CVAR_",
    "FI_",
    "UCX_",
    "HYDRA_",
    "I_MPI_",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TF_CPP_MIN_LOG_LEVEL",
    "PYTHONPATH",  # set by --as-horovod
)
MASK = "***"


def shown_value(name: str, value: str) -> str:
    """*value* as hvdrun prints it for variable *name* (``***`` unless it is public)."""
    return value if name.startswith(_SHOWN_PREFIXES) else MASK


def _check_command(
    command: Sequence[str], environ: Mapping[str, str], argv: Sequence[str] = ()
) -> None:
    """UsageError unless *command* can be started; *argv*: hvdrun's whole command line,
    for the hint when the command is a Python script given without ``python``."""
    if not command:
        raise UsageError("no command given: e.g. hvdrun -np 2 python train.py")
    program = command[0]
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UsageError(
                f"command not found or not executable: {program}" + _python_hint(command, argv)
            )
    elif shutil.which(program, path=environ.get("PATH")) is None:
        raise UsageError(
            f"command not found: {program} (not on PATH)" + _python_hint(command, argv)
        )


def _python_hint(command: Sequence[str], argv: Sequence[str]) -> str:
    """For a script ending in .py that cannot run as a program: the line that runs it."""
    if not command[0].endswith(".py"):
        return ""
    options = list(argv[: len(argv) - len(command)])
    if options[-1:] == ["--"]:
        options.pop()
    line = shlex.join(["hvdrun", *options, "python", *command])
    return f"; did you mean `{line}`?"


def _resolve_hosts(
    values: Mapping[str, object], environ: Mapping[str, str]
) -> tuple[int, list[Host] | None, str]:
    """(np, hosts or None for this machine only, where the hosts came from)."""
    np = values.get("np")
    if values.get("hosts") and values.get("hostfile"):
        raise UsageError("give either -H/--hosts or --hostfile, not both")
    if values.get("hosts"):
        hosts, source = parse_hosts(str(values["hosts"])), "-H"
    elif values.get("hostfile"):
        hosts, source = read_hostfile(str(values["hostfile"])), "--hostfile"
    elif slurm.in_allocation(environ):
        hosts, source = slurm.allocation_hosts(environ), "the SLURM allocation"
    else:
        if np is None:
            raise UsageError(
                "-np is required outside a SLURM allocation: e.g. hvdrun -np 2 python train.py"
            )
        return int(np), None, "this machine"
    slots = total_slots(hosts)
    if np is None:
        np = slots
    elif np > slots:
        raise UsageError(
            f"-np {np} is more than the {slots} slot(s) in {source} ({format_hosts(hosts)})"
        )
    return int(np), used_hosts(hosts, int(np)), source


def _start_timeout(values: Mapping[str, object], environ: Mapping[str, str]) -> float:
    if values.get("start_timeout") is not None:
        return float(values["start_timeout"])
    for name in ("HVDLITE_START_TIMEOUT", "HOROVOD_START_TIMEOUT"):
        raw = environ.get(name, "").strip()
        if raw:
            try:
                value = float(raw)
            except ValueError:
                raise UsageError(f"{name}={raw!r} is not a number of seconds") from None
            if not math.isfinite(value):
                raise UsageError(f"{name}={raw!r} is not a finite number of seconds")
            if value > 0:
                return value
    return DEFAULT_START_TIMEOUT


def _ssh_args(values: Mapping[str, object]) -> list[str]:
    """``-p PORT -i FILE`` for ssh to the other hosts, the identity file checked."""
    args = []
    if values.get("ssh_port") is not None:
        args += ["-p", str(values["ssh_port"])]
    if values.get("ssh_identity_file"):
        given = str(values["ssh_identity_file"])
        path = os.path.abspath(os.path.expanduser(given))
        if not (os.path.isfile(path) and os.access(path, os.R_OK)):
            raise UsageError(f"--ssh-identity-file {given!r}: cannot read it")
        if any(char.isspace() for char in path):
            raise UsageError(
                f"--ssh-identity-file {path!r}: the path must not contain white "
                "space (MPI launchers split their ssh arguments at spaces)"
            )
        args += ["-i", path]
    return args


def _mpich_environment(
    mpi: MpiInfo | None, nics: Sequence[str], other_hosts: bool, environ: Mapping[str, str]
) -> dict[str, str]:
    """Variables an MPICH job needs for its traffic between hosts.

    - An MPICH built with both the UCX and the libfabric (OFI) network module
      (``pip install mpich``) uses UCX by default, and its UCX module loses
      messages received with ``MPI_ANY_SOURCE`` (seen with MPICH 5.0.2: the
      message stays unmatched, the receive never completes).  A job with other
      hosts therefore runs on OFI (``MPIR_CVAR_CH4_NETMOD=ofi``).
    - On OFI, libfabric ranks the deprecated ``sockets`` provider first where no
      fabric is faster (plain Ethernet), and that provider now and then never
      finishes connecting the ranks of different hosts: every rank spins in
      ``MPI_Init`` (seen in about one 3-host start in ten with MPICH 5.0.2; MPICH's
      developers advise its ``tcp`` provider instead).  A job with other hosts
      therefore leaves it out (``FI_PROVIDER=^sockets``): libfabric then takes
      ``tcp``, or a real fabric (verbs, EFA, CXI, PSM3) where there is one.
    - Hydra's ``-iface`` moves only its own connections; the network modules
      choose their interfaces themselves: libfabric's tcp and sockets providers
      from ``FI_TCP_IFACE``/``FI_SOCKETS_IFACE``, UCX from ``UCX_NET_DEVICES``
      (otherwise it spreads messages over every interface it finds).

    A variable already in the environment is left alone.
    """
    if mpi is None or mpi.flavour != "mpich":
        return {}
    wanted = {}
    if other_hosts and {"ucx", "ofi"} <= set(mpi.netmods):
        wanted["MPIR_CVAR_CH4_NETMOD"] = "ofi"
    if other_hosts and "ofi" in mpi.netmods:
        wanted["FI_PROVIDER"] = "^sockets"
    if nics:
        wanted.update(
            FI_TCP_IFACE=nics[0], FI_SOCKETS_IFACE=nics[0], UCX_NET_DEVICES=",".join(nics)
        )
    return {name: value for name, value in wanted.items() if name not in environ}


def _ssh_hosts(
    hosts: Sequence[Host] | None,
    mpi: MpiInfo,
    from_allocation: bool,
    ssh_args: Sequence[str],
    mpi_args: Sequence[str],
    environ: Mapping[str, str],
) -> tuple[str, ...]:
    """The hosts the launcher will reach through ssh (see :mod:`.sshcheck`)."""
    if not hosts or not sshcheck.uses_ssh(mpi_args, environ):
        return ()
    # Inside an allocation the MPI starts its daemons through SLURM, unless -p/-i
    # made hvdrun ask MPICH or Intel MPI for ssh.
    if from_allocation and not (ssh_args and mpi.flavour in ("mpich", "intel")):
        return ()
    return tuple(host.name for host in hosts if not is_local_host(host.name))


def _notes(
    values: Mapping[str, object], mpi: MpiInfo | None, nics: Sequence[str]
) -> tuple[str, ...]:
    notes = []
    streams = values.get("num_nccl_streams")
    if streams is not None and streams != 1:
        notes.append(
            f"--num-nccl-streams {streams}: hvdlite runs each process set's NCCL "
            "collectives on one stream; the value is only passed on (as "
            "HVDLITE_NUM_NCCL_STREAMS)"
        )
    if len(nics) > 1 and mpi is not None and mpi.flavour in ("mpich", "intel"):
        notes.append(
            f"--network-interfaces {','.join(nics)}: {mpi.label}'s mpiexec takes one "
            f"interface (-iface {nics[0]}); NCCL gets them all"
        )
    return tuple(notes)


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, dict[str, object]]:
    """The command line and the config file, merged: ``(args, values)``; UsageError."""
    args = parse_args(list(argv))
    file_values = read_config_file(args.config_file) if args.config_file else {}
    values = merge(args, file_values)
    check_available(values)
    return args, values


def prepare(
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    rank_env: Mapping[str, str] | None = None,
    placement: tuple[int, Sequence[Host]] | None = None,
) -> tuple[argparse.Namespace, Launch | None]:
    """Parse *argv* and decide the launch without starting anything.

    Returns ``(args, launch)``; ``launch`` is None for ``--check-build``.  Raises
    UsageError for every kind of bad input.  *rank_env*: more variables to set
    on every rank (the knob flags win over them).  *placement*: ``(np, hosts)``
    chosen by the caller (the elastic loop) instead of -np/-H/--hostfile/SLURM.
    """
    environ = dict(os.environ if environ is None else environ)
    args, values = parse(argv)
    if args.check_build:
        return args, None
    _check_command(args.command, environ, argv)
    if placement is None:
        np, hosts, _source = _resolve_hosts(values, environ)
    else:
        np, hosts = placement[0], list(placement[1])
    nics = tuple(values.get("network_interfaces") or ())
    knob_env = {**(rank_env or {}), **knob_environment(values)}
    if nics:
        knob_env["NCCL_SOCKET_IFNAME"] = ",".join(nics)
    if values.get("as_horovod"):
        knob_env.update(horovod_environment({**environ, **knob_env}))
    if values.get("master_port") is not None and not values.get("master_addr"):
        knob_env["MASTER_ADDR"] = hosts[0].name if hosts else "127.0.0.1"
    ssh_args = _ssh_args(values)
    binding = shlex.split(str(values["binding_args"])) if values.get("binding_args") else None
    # The job's variables are in the launch so that Open MPI's -x forwards them too.
    env = {
        **environ,
        **knob_env,
        protocol.TOKEN_VARIABLE: protocol.new_token(),
        lifeline.OWNER_VARIABLE: lifeline.identity() or "",
    }
    launcher = values.get("launcher") or "mpiexec"
    mpi_args = shlex.split(str(values.get("mpi_args") or ""))
    program = [sys.executable, str(WRAPPER), "--tail", str(REPORT_TAIL_LINES)]
    if values.get("prefix_output_with_timestamp"):
        program.append("--timestamp")
    if values.get("output_filename"):
        program += ["--output-dir", os.path.abspath(str(values["output_filename"]))]
    frozen = values.get("frozen_timeout")
    if frozen is None and placement is not None:  # an elastic launch: see ELASTIC_FROZEN_TIMEOUT
        frozen = ELASTIC_FROZEN_TIMEOUT
    if frozen:
        program += ["--frozen-after", f"{frozen:g}"]
    silent = values.get("silent_host_timeout")
    if silent is None and placement is not None:  # see ELASTIC_SILENT_HOST_TIMEOUT
        silent = ELASTIC_SILENT_HOST_TIMEOUT
    silent = float(silent or 0.0)
    if silent:
        program += ["--beat", f"{protocol.beat_interval(silent):g}"]
    program += ["--", *args.command]
    local = hosts is None or all_local(hosts)
    from_allocation = slurm.in_allocation(environ) and not (
        values.get("hosts") or values.get("hostfile")
    )
    ssh_hosts: tuple[str, ...] = ()
    if launcher == "srun":
        srun = shutil.which("srun", path=environ.get("PATH"))
        if srun is None:
            raise UsageError(
                "--launcher srun: srun is not on PATH (run inside SLURM, or "
                "use the default mpiexec launcher)"
            )
        if ssh_args or nics:
            raise UsageError(
                "--launcher srun starts ranks through SLURM, not ssh, and has no "
                "interface choice: drop -p/-i/--network-interface, or use the "
                "default mpiexec launcher"
            )
        try:
            path = find_mpiexec(environ)
            mpi = detect(path) if path else None
        except UsageError:
            mpi = None
        mpich_env = _mpich_environment(mpi, (), not local, environ)
        knob_env.update(mpich_env)
        env.update(mpich_env)
        spec = LaunchSpec(
            np=np,
            program=program,
            mpi_args=mpi_args,
            hosts=None if from_allocation and placement is None else hosts,
            binding=binding,
        )
        cmd, extra_env = srun_command(spec, srun_mpi_plugin(mpi), srun=srun), knob_env
    else:
        path = find_mpiexec(environ)
        if path is None:
            raise UsageError(NO_MPI_HINT.format(python=Path(sys.executable).parent))
        mpi = detect(path)
        mpich_env = _mpich_environment(mpi, nics, not local, environ)
        knob_env.update(mpich_env)
        env.update(mpich_env)
        if not local:
            ssh_hosts = _ssh_hosts(hosts, mpi, from_allocation, ssh_args, mpi_args, environ)
        spec = LaunchSpec(
            np=np,
            program=program,
            hosts=None if local else hosts,
            env=knob_env,
            mpi_args=mpi_args,
            forward=forwarded_names(env, exclude=knob_env),
            binding=binding,
            nics=nics,
            ssh_args=ssh_args,
        )
        cmd, extra_env = mpiexec_command(mpi, spec), launcher_environment(mpi, spec)
        env.update(extra_env)
        extra_env = {**knob_env, **extra_env}
    return args, Launch(
        cmd,
        env,
        extra_env,
        np,
        None if local else hosts,
        _start_timeout(values, environ),
        launcher,
        mpi,
        bool(values.get("verbose")),
        _notes(values, mpi, nics),
        ssh_hosts,
        tuple(ssh_args),
        silent,
    )


def describe(p: Launch) -> str:
    """What --verbose prints before the launch: hosts, MPI, knob variables, the command."""
    where = format_hosts(p.hosts) if p.hosts else "this machine"
    mpi = f"{p.mpi.label} ({p.mpi.path})" if p.mpi else "unknown MPI"
    job_variables = (protocol.TOKEN_VARIABLE, lifeline.OWNER_VARIABLE)
    knobs = (
        " ".join(
            f"{k}={v}"
            for k, v in p.env.items()
            if k.startswith("HVDLITE_") and k not in job_variables
        )
        or "none"
    )
    ssh = f"hvdrun: checking ssh login to {', '.join(p.ssh_hosts)} first\n" if p.ssh_hosts else ""
    return (
        f"hvdrun: {p.np} rank(s) on {where}, launcher {p.launcher}, {mpi}\n"
        f"hvdrun: knob variables: {knobs}\n{ssh}"
        f"hvdrun: running: {p.shell_line()}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run hvdrun with *argv* (default ``sys.argv[1:]``); returns the exit status."""
    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:  # Ctrl-C before the job started: nothing to stop yet
        sys.stderr.write("hvdrun: interrupted\n")
        return 130


def run_elastic_job(
    argv: list[str],
    environ: Mapping[str, str],
    *,
    rank_env: Mapping[str, str] | None = None,
    out=None,
    err=None,
) -> int:
    """Run hvdrun's *argv*, which asks for elastic mode, under the elastic loop (see
    :mod:`.elastic_driver`), launching through :func:`prepare`; hvdrun's exit status.

    *rank_env*: more variables for every rank; *out*/*err*: where the ranks'
    output goes.  UsageError for bad options, before anything starts."""
    from .discovery import FixedHosts, ScriptDiscovery, SlurmDiscovery
    from .elastic_driver import run_elastic

    args, values = parse(argv)
    settings = elastic_settings.settings_from(values, environ)
    if settings is None:
        raise UsageError(
            "not an elastic job: give --host-discovery-script, --min-np/"
            "--max-np or --max-restarts N"
        )
    environ = dict(environ)
    _check_command(args.command, environ, argv)
    if settings.source == "script":
        source = ScriptDiscovery(settings.discovery_script, settings.slots_per_host)
    elif settings.source == "slurm":
        source = SlurmDiscovery(environ)
    else:
        np, hosts, where = _resolve_hosts(values, environ)
        source = FixedHosts(hosts or [Host("localhost", np)], where)
    extra = dict(rank_env or {})

    def make_launch(np: int, hosts: list[Host], elastic_env: dict[str, str]) -> Launch:
        return prepare(argv, environ, rank_env={**extra, **elastic_env}, placement=(np, hosts))[1]

    for note in make_launch(1, [Host("localhost", 1)], {}).notes:
        sys.stderr.write(f"hvdrun: note: {note}\n")
    return run_elastic(
        settings,
        source,
        make_launch,
        dry_run=bool(args.dry_run),
        describe=describe if values.get("verbose") else None,
        out=out,
        err=err,
    )


def _run(argv: list[str]) -> int:
    try:
        args, values = parse(argv)
        settings = elastic_settings.settings_from(values, os.environ)
        if settings is not None and not args.check_build:
            return run_elastic_job(argv, os.environ)
        args, launch = prepare(argv)
        if launch is None:  # --check-build
            from .checkbuild import check_build

            sys.stdout.write(check_build())
            return 0
        for note in launch.notes:
            sys.stderr.write(f"hvdrun: note: {note}\n")
        if args.dry_run:
            sys.stdout.write(launch.shell_line() + "\n")
            return 0
    except UsageError as exc:
        sys.stderr.write(f"hvdrun: error: {exc}\n")
        return USAGE_EXIT
    if launch.verbose:
        sys.stderr.write(describe(launch))
        sys.stderr.flush()
    try:
        sshcheck.check_hosts(launch.ssh_hosts, launch.ssh_args, launch.env)
    except sshcheck.HostCheckError as exc:
        sys.stderr.write(f"hvdrun: error: {exc}\n")
        return HOST_CHECK_EXIT
    from .job import run_job

    placed = rank_hosts(launch.hosts, launch.np) if launch.hosts else None
    return run_job(
        launch.cmd,
        launch.env,
        np=launch.np,
        start_timeout=launch.start_timeout,
        placed=placed,
        silent_timeout=launch.silent_timeout,
    )
