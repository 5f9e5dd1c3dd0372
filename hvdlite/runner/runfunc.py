"""``hvdlite.runner.run`` (also ``hvdlite.run``): call a Python function on every rank.

Horovod's ``horovod.run`` for notebooks and for code that launches jobs from
Python.  How it works:

1. ``(func, args, kwargs)`` is pickled into a fresh directory: with cloudpickle
   when it is installed (``pip install hvdlite[cloudpickle]``), which also ships
   lambdas, closures and functions defined in a notebook or in ``__main__``;
   otherwise with plain pickle, which ships only functions the ranks can
   import by name (anything else is a TypeError before anything starts);
2. hvdrun's own machinery starts the job: :func:`.cli.prepare` builds the launch
   from the same options as hvdrun's flags, :func:`.job.run_job` runs it, passes
   the ranks' output through to ``sys.stdout``/``sys.stderr`` and stops every
   rank when one fails; each rank runs :mod:`.run_task`;
3. each rank leaves its return value (or its exception and traceback) in the
   directory; they are read back in rank order, and the directory is removed.

The ranks import what this process can import: ``PYTHONPATH`` gets this
process's own ``sys.path`` entries (those outside the Python installation).
For jobs with other hosts the directory must be on a file system they all
see: pass ``work_dir``, or it is made in the current directory.
"""

from __future__ import annotations

import codecs
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from . import cli, slurm, sshcheck
from .errors import UsageError
from .hosts import rank_hosts
from .job import run_job
from .options import UNAVAILABLE
from .run_task import FUNCTION_FILE, result_file

__all__ = ["run", "RankFailedError"]

_GLOO = next(message for flags, _n, message in UNAVAILABLE if flags == ("--gloo",))
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding hvdlite/


class RankFailedError(RuntimeError):
    """The function raised on a rank (the first rank that did, by time).

    ``rank``, ``host``, ``exception_type`` (the class name) and
    ``remote_traceback`` (the formatted traceback, as the rank printed it)
    describe it; the message holds all of them.
    """

    def __init__(self, report: Mapping[str, object], failed: int) -> None:
        self.rank = int(report.get("rank", -1))
        self.host = str(report.get("host", "?"))
        self.exception_type = str(report.get("type", "Exception"))
        self.remote_traceback = str(report.get("traceback", "")).rstrip("\n")
        others = f" ({failed - 1} more rank(s) failed too)" if failed > 1 else ""
        super().__init__(
            f"hvdlite.run: rank {self.rank} on host {self.host}: {report.get('what')}: "
            f"{report.get('message')}{others}\n--- traceback of rank {self.rank} ---\n"
            f"{self.remote_traceback}"
        )


def _why_plain_pickle_cannot(func) -> str | None:
    qualname = getattr(func, "__qualname__", "")
    if "<lambda>" in qualname:
        return "a lambda"
    if "<locals>" in qualname:
        return "a closure (a function defined inside another function)"
    if getattr(func, "__module__", None) == "__main__":
        return (
            "defined in __main__ (a notebook, or the script being run), which the ranks "
            "cannot import"
        )
    return None


def _serialize(func, args: tuple, kwargs: dict) -> bytes:
    payload = (func, args, kwargs)
    try:
        import cloudpickle
    except ImportError:
        cloudpickle = None
    if cloudpickle is not None:
        try:
            return cloudpickle.dumps(payload)
        except Exception as exc:
            raise TypeError(
                f"hvdlite.run: cannot pickle the function or its arguments with cloudpickle: {exc}"
            ) from exc
    why = _why_plain_pickle_cannot(func)
    fix = (
        "install cloudpickle (pip install 'hvdlite[cloudpickle]'), or define the function "
        "at the top level of a module the ranks can import"
    )
    if why is not None:
        raise TypeError(
            f"hvdlite.run: {getattr(func, '__qualname__', func)!r} is {why}; "
            f"without cloudpickle only importable functions can be shipped: {fix}"
        )
    try:
        return pickle.dumps(payload)
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise TypeError(
            f"hvdlite.run: cannot pickle the function or its arguments ({exc}): {fix}"
        ) from exc


def _python_path(environ: Mapping[str, str]) -> str:
    """PYTHONPATH for the ranks: hvdlite's root, this process's own path entries, the old one."""
    installed = {os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    entries = [_PACKAGE_ROOT]
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(
            path == p or path.startswith(p + os.sep) for p in installed
        ):
            continue
        if path not in entries:
            entries.append(path)
    old = environ.get("PYTHONPATH")
    return os.pathsep.join(entries + ([old] if old else []))


class _TextSink:
    """A binary sink for run_job that writes into a text stream (a notebook's stdout)."""

    def __init__(self, stream) -> None:
        self._stream = stream
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data: bytes) -> None:
        self._stream.write(self._decoder.decode(data))

    def flush(self) -> None:
        self._stream.flush()


def _sink(stream):
    """Where run_job writes the ranks' output: *stream*'s bytes, or *stream* itself."""
    if stream is None:  # no console (pythonw): drop the output
        return open(os.devnull, "wb")  # noqa: SIM115 - lives as long as the process
    stream.flush()
    buffer = getattr(stream, "buffer", None)
    return buffer if buffer is not None else _TextSink(stream)


def _hvdrun_argv(
    np: int,
    hosts,
    hostfile,
    start_timeout,
    ssh_port,
    ssh_identity_file,
    disable_cache,
    output_filename,
    verbose,
    mpi_args,
    network_interface,
) -> list[str]:
    argv = ["-np", str(np)]
    if hosts:
        argv += ["-H", hosts if isinstance(hosts, str) else ",".join(map(str, hosts))]
    if hostfile:
        argv += ["--hostfile", os.fspath(hostfile)]
    if start_timeout is not None:
        argv += ["--start-timeout", str(start_timeout)]
    if ssh_port is not None:
        argv += ["--ssh-port", str(ssh_port)]
    if ssh_identity_file:
        argv += ["--ssh-identity-file", os.fspath(ssh_identity_file)]
    if disable_cache:
        argv.append("--disable-cache")
    if output_filename:
        argv += ["--output-filename", os.fspath(output_filename)]
    if verbose:
        argv.append("--verbose")
    if mpi_args:
        argv.append(f"--mpi-args={mpi_args}")
    if network_interface:
        nics = (
            network_interface if isinstance(network_interface, str) else ",".join(network_interface)
        )
        argv += ["--network-interfaces", nics]
    return argv


def _check_arguments(
    func, args, kwargs, env, use_gloo, hosts, hostfile
) -> tuple[tuple, dict, dict[str, str]]:
    if not callable(func):
        raise TypeError(f"hvdlite.run: func must be callable, not {type(func).__name__}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"hvdlite.run: args must be a tuple, not {type(args).__name__} "
            "(for one argument: args=(value,))"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"hvdlite.run: kwargs must be a dict, not {type(kwargs).__name__}")
    if use_gloo:
        raise ValueError(f"hvdlite.run: use_gloo: {_GLOO}")
    if hosts and hostfile:
        raise ValueError("hvdlite.run: give either hosts or hostfile, not both")
    env = dict(env or {})
    bad = [
        name
        for name, value in env.items()
        if not isinstance(name, str) or not isinstance(value, str)
    ]
    if bad:
        raise TypeError(f"hvdlite.run: env must map names to strings; not so for {bad}")
    return tuple(args), dict(kwargs or {}), env


def run(
    func,
    args=(),
    kwargs=None,
    np=1,
    min_np=None,
    max_np=None,
    slots=None,
    reset_limit=None,
    cooldown_range=None,
    hosts=None,
    hostfile=None,
    start_timeout=None,
    ssh_port=None,
    ssh_identity_file=None,
    disable_cache=None,
    output_filename=None,
    verbose=None,
    use_gloo=None,
    use_mpi=None,
    mpi_args=None,
    network_interface=None,
    executable=None,
    *,
    num_proc: int | None = None,
    min_num_proc=None,
    max_num_proc=None,
    host_discovery_script=None,
    max_restarts: int | None = None,
    elastic_timeout: float | None = None,
    elastic_state_dir=None,
    env: Mapping[str, str] | None = None,
    work_dir: str | os.PathLike | None = None,
) -> list:
    """Run ``func(*args, **kwargs)`` on every rank of a new job; the return values, by rank.

    Horovod's ``horovod.run``, same arguments: ``np`` ranks (``num_proc`` is
    its newer name), on ``hosts`` (``"host1:2,host2:2"``) or ``hostfile``, else
    on this machine; ``start_timeout``, ``ssh_port``, ``ssh_identity_file``,
    ``disable_cache``, ``output_filename``, ``verbose``, ``mpi_args``,
    ``network_interface`` (``"eth0,eth1"``) as hvdrun's flags of those names;
    ``executable``: the Python the ranks run (default: this one); ``use_mpi`` is
    accepted (hvdlite always runs on MPI); ``use_gloo`` is a ValueError.
    (+) ``env``: variables to set on every rank (e.g.
    ``{"HVDLITE_CYCLE_TIME": "2"}``); ``work_dir``: where the function and
    results are exchanged (needed on a shared file system for jobs with other
    hosts).

    Elastic jobs: ``min_np``, ``max_np`` (``min_num_proc``, ``max_num_proc``),
    ``slots`` (slots per discovered host), ``reset_limit`` and
    ``cooldown_range`` (``(min, max)`` seconds) are hvdrun's ``--min-np``,
    ``--max-np``, ``--slots-per-host``, ``--reset-limit`` and
    ``--blacklist-cooldown-range``, and so are the (+) ``host_discovery_script``,
    ``max_restarts``, ``elastic_timeout`` and ``elastic_state_dir``.  With any
    of them the job runs under hvdrun's elastic loop: *func* runs its training
    in an ``@hvd.elastic.run`` function with an elastic state, a lost rank or a
    host change relaunches the job from the last commit, and the return values
    are those of the launch that finished, one per rank of that launch.  As with
    hvdrun, ``min_np``/``max_np`` need hosts that can change (a discovery
    script, or a SLURM allocation); ``max_restarts`` relaunches a fixed set.

    Cross-rank contract: every rank calls the same function with the same
    arguments; collectives inside it (``hvdlite.init()`` first) work as in any
    job.  Returns ``[value of rank 0, value of rank 1, ...]``.  Raises
    :class:`RankFailedError` (a RuntimeError) with the first failing rank's
    traceback when the function raised on some rank (hvdrun has then stopped
    the others), RuntimeError when the job failed otherwise, ValueError for bad
    options (as hvdrun's exit 2), TypeError when the function cannot be shipped.
    """
    if num_proc is not None:
        if np not in (1, num_proc):
            raise ValueError(f"hvdlite.run: np={np} and num_proc={num_proc} disagree; give one")
        np = num_proc
    args, kwargs, rank_env = _check_arguments(func, args, kwargs, env, use_gloo, hosts, hostfile)
    elastic = _elastic_argv(
        min_np if min_np is not None else min_num_proc,
        max_np if max_np is not None else max_num_proc,
        slots,
        reset_limit,
        cooldown_range,
        host_discovery_script,
        max_restarts,
        elastic_timeout,
        elastic_state_dir,
    )
    payload = _serialize(func, args, kwargs)
    options = _hvdrun_argv(
        np,
        hosts,
        hostfile,
        start_timeout,
        ssh_port,
        ssh_identity_file,
        disable_cache,
        output_filename,
        verbose,
        mpi_args,
        network_interface,
    )
    environ = dict(os.environ)
    environ["PYTHONPATH"] = _python_path(environ)
    python = os.fspath(executable) if executable else sys.executable
    if elastic:
        remote = _elastic_hosts_are_remote(hosts, hostfile, host_discovery_script, environ)
        return _run_elastic(
            [*options, *elastic], python, payload, environ, rank_env, work_dir, remote
        )

    def launch_for(directory: Path) -> cli.Launch:
        argv = _task_argv(options, python, directory)
        try:
            _args, launch = cli.prepare(argv, environ, rank_env=rank_env)
        except UsageError as exc:
            raise ValueError(f"hvdlite.run: {exc}") from None
        return launch

    directory = Path(tempfile.mkdtemp(prefix="hvdlite-run-", dir=work_dir))
    try:
        launch = launch_for(directory)
        if launch.hosts is not None and work_dir is None:  # other hosts: not /tmp
            shutil.rmtree(directory, ignore_errors=True)
            directory = Path(tempfile.mkdtemp(prefix=".hvdlite-run-", dir=os.getcwd()))
            launch = launch_for(directory)
        (directory / FUNCTION_FILE).write_bytes(payload)
        for note in launch.notes:
            sys.stderr.write(f"hvdrun: note: {note}\n")
        if launch.verbose:
            sys.stderr.write(cli.describe(launch))
        try:
            sshcheck.check_hosts(launch.ssh_hosts, launch.ssh_args, launch.env)
        except sshcheck.HostCheckError as exc:
            raise RuntimeError(f"hvdlite.run: {exc}") from None
        code = run_job(
            launch.cmd,
            launch.env,
            np=launch.np,
            start_timeout=launch.start_timeout,
            out=_sink(sys.stdout),
            err=_sink(sys.stderr),
            placed=rank_hosts(launch.hosts, launch.np) if launch.hosts else None,
            silent_timeout=launch.silent_timeout,
        )
        return _collect(directory, launch.np, code, remote=launch.hosts is not None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _task_argv(options: list[str], python: str, directory: Path) -> list[str]:
    """hvdrun's argv: *options*, then every rank running the function in *directory*."""
    return [*options, "--", python, "-m", "hvdlite.runner.run_task", str(directory)]


def _elastic_hosts_are_remote(hosts, hostfile, discovery_script, environ) -> bool:
    """Whether an elastic job may run beyond this host: hosts given, discovered, or
    a SLURM allocation's (then its exchange directory must be a shared one)."""
    return bool(hosts or hostfile or discovery_script) or slurm.in_allocation(environ)


def _elastic_argv(
    min_np,
    max_np,
    slots,
    reset_limit,
    cooldown_range,
    discovery_script,
    max_restarts,
    elastic_timeout,
    state_dir,
) -> list[str]:
    """hvdrun's elastic flags for run()'s elastic arguments (empty: not an elastic job)."""
    argv: list[str] = []
    for flag, value in (
        ("--min-np", min_np),
        ("--max-np", max_np),
        ("--slots-per-host", slots),
        ("--reset-limit", reset_limit),
        ("--max-restarts", max_restarts),
        ("--elastic-timeout", elastic_timeout),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if cooldown_range is not None:
        try:
            low, high = cooldown_range
        except (TypeError, ValueError):
            raise ValueError(
                f"hvdlite.run: cooldown_range must be (min, max) in seconds, not {cooldown_range!r}"
            ) from None
        argv += ["--blacklist-cooldown-range", str(low), str(high)]
    if discovery_script is not None:
        argv += ["--host-discovery-script", os.fspath(discovery_script)]
    if state_dir is not None:
        argv += ["--elastic-state-dir", os.fspath(state_dir)]
    return argv


def _run_elastic(
    options: list[str],
    python: str,
    payload: bytes,
    environ: dict,
    rank_env: dict,
    work_dir,
    remote: bool,
) -> list:
    """run() for an elastic job: hvdrun's elastic loop; the last launch's values."""
    if remote and work_dir is None:  # other hosts: a directory they can see, not /tmp
        work_dir = os.getcwd()
    directory = Path(
        tempfile.mkdtemp(prefix=".hvdlite-run-" if remote else "hvdlite-run-", dir=work_dir)
    )
    try:
        (directory / FUNCTION_FILE).write_bytes(payload)
        argv = _task_argv(options, python, directory)
        try:
            code = cli.run_elastic_job(
                argv, environ, rank_env=rank_env, out=_sink(sys.stdout), err=_sink(sys.stderr)
            )
        except UsageError as exc:
            raise ValueError(f"hvdlite.run: {exc}") from None
        launches = sorted(directory.glob("launch.*"), key=lambda p: int(p.suffix[1:]))
        last = launches[-1] if launches else directory / "launch.0"
        return _collect(last, None, code, remote)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _collect(directory: Path, np: int | None, code: int, remote: bool) -> list:
    """The ranks' values in rank order, or the error that says why there are none.

    *np* None: as many ranks as left a value (an elastic job's last launch)."""
    reports = []
    for path in directory.glob("error.*.json"):
        try:
            reports.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    if reports:
        first = min(reports, key=lambda r: (float(r.get("time") or 0), int(r.get("rank", 0))))
        raise RankFailedError(first, len(reports))
    if code == 128 + signal.SIGINT:
        raise KeyboardInterrupt("hvdlite.run: interrupted; every rank was stopped")
    if code != 0:
        raise RuntimeError(
            f"hvdlite.run: the job failed with exit code {code} before every "
            "rank returned; hvdrun's report above names the rank and why"
        )
    if np is None:
        np = len(list(directory.glob("result.*.pkl")))
    values = []
    for rank in range(np):
        path = result_file(directory, rank)
        if not path.exists():
            hint = (
                " (with other hosts, work_dir must be on a file system every host shares)"
                if remote
                else ""
            )
            raise RuntimeError(
                f"hvdlite.run: rank {rank} ended without leaving its result in {directory}{hint}"
            )
        try:
            values.append(pickle.loads(path.read_bytes()))
        except Exception as exc:
            raise RuntimeError(
                f"hvdlite.run: cannot unpickle the value rank {rank} returned: {exc}"
            ) from exc
    return values
