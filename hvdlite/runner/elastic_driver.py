"""hvdrun's elastic loop: launch the job, watch its hosts, relaunch it from the last commit.

MPI cannot shrink or grow a running job (no ULFM in the MPIs pip installs), so
the unit of recovery is the whole MPI job.  Each turn of the loop is a *launch*
(generation 0, 1, ...):

1. ask the host source (:mod:`.discovery`) for the usable hosts, leaving out
   blacklisted ones (:mod:`.blacklist`); with fewer than ``--min-np`` slots,
   wait up to ``--elastic-timeout`` seconds, then end with an error naming the
   hosts that were lost and why;
2. read the header of the commit in the job's state directory
   (:mod:`hvdlite.elastic.persistence`): a corrupt one ends the job with that
   error, nothing relaunches it (a payload that does not match its checksum is
   found by rank 0 as it resumes, and ends the job the same way);
3. start ``min(slots, --max-np)`` ranks through the ordinary launch path
   (:func:`.cli.prepare`, :func:`.job.run_job_outcome`), with the variables that
   tell each rank where the state is (:mod:`hvdlite.elastic.layout`), once
   ssh can log in to every host (with a source that can change, a host it
   cannot log in to is left out as in step 4 and the launch placed again
   without it: a host whose link went down mid-job ends that launch once
   hvdrun has not heard from its ranks for ``--silent-host-timeout``, and is
   found here); while it
   runs, poll the source every ``HVDLITE_ELASTIC_DISCOVERY_INTERVAL`` seconds
   and, when the placement would change, post the host-update notice: the
   ranks raise ``HostsUpdatedInterrupt`` at their next ``commit()``, commit, and
   exit together with ``HOSTS_UPDATED_EXIT``;
4. then: every rank succeeded -> done (the state directory is removed); the
   ranks left for new hosts -> relaunch (counts against ``--reset-limit``); a
   rank failed -> relaunch (counts against ``--max-restarts`` and
   ``--reset-limit``), or give up with the failure's exit code when a budget is
   spent.  A rank's failure leaves its host out (sources that can change only)
   only on evidence about the host (:class:`.elastic_hosts.FailureHistory`):
   every rank on it ended at once, it cannot be reached, or it failed again
   soon after; otherwise the job is relaunched on the same hosts.  A rank that
   could not write a commit (``STATE_WRITE_EXIT``: a full disk, a quota) ends
   the job with that code: no relaunch, no host left out.

Every decision is one ``hvdrun: elastic: ...`` line on stderr.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

from ..elastic.layout import (
    EXPECT_COMMIT_VARIABLE,
    GENERATION_VARIABLE,
    HOSTS_UPDATED_EXIT,
    JOB_DIR_VARIABLE,
    JOB_ID_VARIABLE,
    ENABLED_VARIABLE,
    STATE_ERROR_EXIT,
    STATE_FILE,
    STATE_WRITE_EXIT,
    has_marker,
    last_launch,
    post_notice,
    record_launch,
    restart_path,
    write_marker,
)
from ..elastic.persistence import Commit, CommitStore, ElasticStateError, make_private_dir
from . import sshcheck
from .blacklist import Blacklist
from .discovery import DiscoveryError
from .elastic_hosts import (
    REPEAT_WINDOW_SECONDS,
    FailureHistory,
    HostPool,
    describe_change,
    rank_host,
    ranks_on,
)
from .elastic_settings import DEFAULT_STATE_DIR, ElasticSettings
from .errors import USAGE_EXIT
from .hosts import Host, format_hosts, rank_hosts, total_slots
from .job import JobOutcome, run_job_outcome

__all__ = ["run_elastic", "GiveUp", "new_job_id", "rank_environment"]


def say(text: str) -> None:
    sys.stderr.write(f"hvdrun: elastic: {text}\n")
    sys.stderr.flush()


class GiveUp(Exception):
    """The elastic job ends here; the message says why, ``code`` is hvdrun's exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@contextlib.contextmanager
def _own_writes(job_dir: str, job_id: str):
    """hvdrun's own small files in the job's directory (its marker, the launch count):
    a write that fails (a full disk, a quota) ends the job with ``STATE_WRITE_EXIT``
    and a message naming the error, as a commit that cannot be written does."""
    try:
        yield
    except OSError as exc:
        name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        where = exc.filename or job_dir
        raise GiveUp(
            f"hvdrun cannot write {where}: {exc.strerror or exc} (errno {exc.errno}, {name}). "
            f"Free space or raise the quota there, then resume with --elastic-resume {job_id}",
            STATE_WRITE_EXIT,
        ) from None


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def rank_environment(
    job_dir: str, job_id: str, generation: int, commit: Commit | None
) -> dict[str, str]:
    """The variables every rank of launch *generation* gets (HOROVOD_ELASTIC too)."""
    return {
        ENABLED_VARIABLE: "1",
        "HOROVOD_ELASTIC": "1",
        JOB_DIR_VARIABLE: job_dir,
        JOB_ID_VARIABLE: job_id,
        GENERATION_VARIABLE: str(generation),
        EXPECT_COMMIT_VARIABLE: str(commit.number if commit else 0),
    }


class _HostWatch(threading.Thread):
    """Polls the pool while a launch runs; posts the notice once the placement would change."""

    def __init__(
        self, pool: HostPool, placement: list[Host], job_dir: str, generation: int, interval: float
    ) -> None:
        super().__init__(daemon=True, name="hvdrun-host-watch")
        self.pool, self.placement = pool, placement
        self.job_dir, self.generation, self.interval = job_dir, generation, interval
        self.notice: str | None = None
        self._stop_event = threading.Event()
        self._warned: set[str] = set()  # at most _MAX_WARNINGS distinct messages

    def _warn(self, text: str) -> None:
        """Say *text* once (a bounded number of distinct warnings, then one last line)."""
        if text in self._warned or len(self._warned) > _MAX_WARNINGS:
            return
        self._warned.add(text)
        if len(self._warned) > _MAX_WARNINGS:
            say("warning: more distinct warnings follow; not shown")
            return
        say(f"warning: {text}")

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5.0)

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                wanted = self.pool.placement(self.pool.available())
            except DiscoveryError as exc:
                self._warn(f"{exc} (the job goes on; hvdrun keeps asking)")
                continue
            if wanted != self.placement:
                notice = describe_change(self.placement, wanted)
                try:
                    post_notice(self.job_dir, self.generation, notice)
                except OSError as exc:  # the ranks must still hear of it: try again
                    self._warn(
                        f"cannot post the host-update notice in {self.job_dir} "
                        f"({exc.strerror or exc}); retrying every "
                        f"{self.interval:g} s"
                    )
                    continue
                self.notice = notice
                say(f"hosts changed: {self.notice}; the ranks leave at their next commit")
                return


_MAX_WARNINGS = 32


def _wait_for_slots(pool: HostPool, settings: ElasticSettings) -> list[Host]:
    deadline = time.monotonic() + settings.timeout
    announced, last_error = False, None
    while True:
        try:
            hosts = pool.available()
            last_error = None
        except DiscoveryError as exc:
            hosts, last_error = [], str(exc)
        have = total_slots(hosts)
        if have >= settings.min_np:
            return hosts
        left = deadline - time.monotonic()
        if left <= 0:
            lost = pool.lost(hosts)
            raise GiveUp(
                f"only {have} slot(s) available ({format_hosts(hosts) or 'no host'}), fewer "
                f"than --min-np {settings.min_np}, after waiting {settings.timeout:g} s "
                f"(--elastic-timeout)"
                + (f"; lost: {'; '.join(lost)}" if lost else "")
                + (f"; last discovery error: {last_error}" if last_error else "")
            )
        if not announced:
            announced = True
            say(
                f"{have} slot(s) available, fewer than --min-np {settings.min_np}: waiting up "
                f"to {settings.timeout:g} s for more"
            )
        time.sleep(min(settings.poll_interval, max(left, 0.01)))


def _commit_on_disk(job_dir: str, job_id: str) -> Commit | None:
    """The last commit's header (its number and summary): the payload, however large,
    is read and checked by rank 0 only, when it resumes."""
    try:
        return CommitStore(os.path.join(job_dir, STATE_FILE), job_id).read_header()
    except ElasticStateError as exc:
        raise GiveUp(str(exc)) from None


def _what_failed(outcome: JobOutcome) -> str:
    if outcome.reason == "silent-host":
        hosts = ", ".join(outcome.silent_hosts)
        return f"host{'s' if len(outcome.silent_hosts) > 1 else ''} {hosts} stopped answering"
    failure = outcome.failure
    if failure is not None:
        return f"rank {failure.rank} on host {failure.host} {failure.how}"
    if outcome.reason == "start-timeout":
        return "the ranks did not all start within --start-timeout"
    return f"the launcher failed (exit code {outcome.code})"


def _unreachable(launch) -> Callable[[str], str | None]:
    """Why a host of *launch* cannot be reached now (an ssh login, for the hosts the
    launcher reaches through ssh; the others count as reachable)."""

    def why(host: str) -> str | None:
        if host not in launch.ssh_hosts:
            return None
        try:
            sshcheck.check_hosts([host], launch.ssh_args, launch.env)
        except sshcheck.HostCheckError as exc:
            lines = str(exc).splitlines()
            return lines[1].strip() if len(lines) > 1 else str(exc)
        return None

    return why


def _judge_failure(
    outcome: JobOutcome, placement: list[Host], history: FailureHistory, launch
) -> tuple[str, str | None]:
    """``(host, why it is the host's failure or None)`` for a launch a rank failed."""
    failure = outcome.failure
    host = rank_host(placement, failure.rank) or failure.host
    placed = ranks_on(placement, host)
    failed = {f.rank for f in outcome.failures if not f.stopped}
    return host, history.judge(host, placed, failed, _unreachable(launch))


def _remove_job_dir(job_dir: str, settings: ElasticSettings) -> None:
    shutil.rmtree(job_dir, ignore_errors=True)
    if os.path.basename(settings.state_dir) == DEFAULT_STATE_DIR:
        try:
            os.rmdir(settings.state_dir)  # only when no other job uses it
        except OSError:
            pass


def run_elastic(
    settings: ElasticSettings,
    source,
    make_launch: Callable[[int, list[Host], dict[str, str]], object],
    *,
    dry_run: bool = False,
    describe: Callable[[object], str] | None = None,
    out: BinaryIO | None = None,
    err: BinaryIO | None = None,
) -> int:
    """Run the elastic job (see the module doc); returns hvdrun's exit status.

    *make_launch(np, hosts, rank_env)* returns the launch :class:`~.cli.Launch` for one
    launch; *describe* (``--verbose``) the text printed before each launch; *out*
    and *err* take the ranks' output (default: this process's stdout and stderr).
    """
    pool = HostPool(source, Blacklist(settings.cooldown_range), settings.max_np)
    try:
        first = pool.available()
    except DiscoveryError as exc:
        sys.stderr.write(f"hvdrun: error: {exc}\n")
        return USAGE_EXIT
    job_id = settings.resume or new_job_id()
    job_dir = os.path.join(settings.state_dir, job_id)
    if settings.resume and not os.path.exists(os.path.join(job_dir, STATE_FILE)):
        if has_marker(job_dir, job_id):  # hvdrun ended before the first commit: nothing lost
            say(f"job {job_id} has no commit yet (hvdrun ended before the first): starting over")
        else:
            sys.stderr.write(
                f"hvdrun: error: --elastic-resume {job_id}: no commit of that job in "
                f"{job_dir}; give the job id hvdrun printed at its start, and the "
                "same --elastic-state-dir\n"
            )
            return USAGE_EXIT
    if dry_run:
        placement = pool.placement(first)
        if not placement:
            sys.stderr.write(f"hvdrun: error: {source.label} offers no host now\n")
            return USAGE_EXIT
        launch = make_launch(
            total_slots(placement), placement, rank_environment(job_dir, job_id, 0, None)
        )
        sys.stdout.write(launch.shell_line() + "\n")
        return 0
    try:
        with _own_writes(job_dir, job_id):
            make_private_dir(settings.state_dir)  # 0700 when hvdrun makes it; kept as it is
            make_private_dir(job_dir)
            write_marker(job_dir, job_id)  # rank 0 writes commits only where it sees this
    except GiveUp as exc:
        say(f"error: {exc}")
        return exc.code
    if not settings.resume:
        say(
            f"job {job_id}: commits go to {job_dir} (should hvdrun itself end, resume with "
            f"--elastic-resume {job_id})"
        )
    try:
        return _loop(settings, source, pool, make_launch, describe, job_id, job_dir, (out, err))
    except GiveUp as exc:
        say(f"error: {exc}")
        if os.path.exists(os.path.join(job_dir, STATE_FILE)):
            say(f"the last commit stays in {job_dir}")
        return exc.code


def _loop(
    settings: ElasticSettings,
    source,
    pool: HostPool,
    make_launch,
    describe,
    job_id: str,
    job_dir: str,
    streams: tuple,
) -> int:
    generation = restarts = resets = 0
    if settings.resume:  # count on from the launches of the hvdrun that ended
        generation = (last_launch(job_dir) or 0) + 1
    first = generation
    window = max(REPEAT_WINDOW_SECONDS, (settings.cooldown_range or (0.0, 0.0))[1])
    history = FailureHistory(window)
    while True:
        hosts = _wait_for_slots(pool, settings)
        placement = pool.placement(hosts)
        pool.record(placement)
        np = total_slots(placement)
        commit = _commit_on_disk(job_dir, job_id)
        start = f"resuming from {commit.describe()}" if commit else "from the start"
        say(f"launch {generation}: {np} rank(s) on {format_hosts(placement)}, {start}")
        with _own_writes(job_dir, job_id):
            record_launch(job_dir, generation)
        launch = make_launch(np, placement, rank_environment(job_dir, job_id, generation, commit))
        if describe is not None:
            sys.stderr.write(describe(launch))
        try:
            sshcheck.check_hosts(launch.ssh_hosts, launch.ssh_args, launch.env)
        except sshcheck.HostCheckError as exc:
            if not (source.dynamic and exc.failed):
                raise GiveUp(str(exc)) from None
            # A host that went away since the last launch (its link cut, powered off): the
            # others go on from the commit, as when the host's ranks fail together.
            for host, why in exc.failed:
                pool.blacklist.add(host, f"ssh cannot log in to it ({why})")
                say(f"host {host} is left out: {pool.blacklist.reason(host)}")
            say(f"launch {generation} not started; placing it again without those hosts")
            continue
        watch = _HostWatch(pool, placement, job_dir, generation, settings.poll_interval)
        if source.dynamic:
            watch.start()
        try:
            outcome = run_job_outcome(
                launch.cmd,
                launch.env,
                np=np,
                start_timeout=launch.start_timeout,
                out=streams[0],
                err=streams[1],
                quiet_codes=(HOSTS_UPDATED_EXIT, STATE_ERROR_EXIT),
                host_names=rank_hosts(placement),
                silent_timeout=launch.silent_timeout,
            )
        finally:
            if watch.is_alive():
                watch.stop()
        if outcome.reason == "signal":
            return outcome.code
        if STATE_ERROR_EXIT in outcome.quiet_exits.values():
            raise GiveUp(
                "the ranks could not load the commit to resume from (their message "
                "is above); not relaunching"
            )
        unwritable = [f for f in outcome.failures if f.code == STATE_WRITE_EXIT]
        if unwritable:
            raise GiveUp(
                f"rank {unwritable[0].rank} could not write a commit (its message "
                "is above: the file, the error and the fix); not relaunching, and its "
                "host stays in (it is not the host's failure)",
                STATE_WRITE_EXIT,
            )
        if HOSTS_UPDATED_EXIT in outcome.quiet_exits.values() and not os.path.exists(
            restart_path(job_dir, generation)
        ):
            raise GiveUp(
                f"the ranks left to be relaunched (exit {HOSTS_UPDATED_EXIT}: they committed "
                f"first), but hvdrun sees neither their commit's restart marker nor a new "
                f"commit in {job_dir}: rank 0 wrote into a directory hvdrun does not see. "
                "Give --elastic-state-dir on a file system that hvdrun's host and every rank's "
                "host share; not relaunching (it would start from an older state)"
            )
        if os.path.exists(restart_path(job_dir, generation)):
            resets += 1
            _check_reset_limit(settings, resets, "the hosts changed")
            say(f"the ranks left for new hosts ({watch.notice or 'notice posted'}): relaunching")
        elif outcome.code == 0 and outcome.reason is None:
            if generation > first:
                say(f"the job finished after {generation - first} relaunch(es)")
            _remove_job_dir(job_dir, settings)
            return 0
        else:
            what = _what_failed(outcome)
            restarts += 1
            resets += 1
            # A silent host is judged by the next launch's ssh check: one that is still
            # cut off is left out there, one that answers again stays in.
            if outcome.failure is not None and source.dynamic and not outcome.silent_hosts:
                host, why = _judge_failure(outcome, placement, history, launch)
                if why is None:
                    say(
                        f"{what}: a process failure, not the host's (host {host} is reachable "
                        "and its other ranks were healthy); it stays in"
                    )
                else:
                    pool.blacklist.add(
                        host,
                        f"rank {outcome.failure.rank} failed there "
                        f"({outcome.failure.how}) and {why}",
                    )
                    say(f"host {host} is left out: {pool.blacklist.reason(host)}")
            budget = settings.max_restarts
            if budget is not None and restarts > budget:
                raise GiveUp(
                    f"{what}; the restart budget is spent (--max-restarts {budget})",
                    outcome.code or 1,
                )
            _check_reset_limit(settings, resets, what, outcome.code or 1)
            count = f"restart {restarts}" + (f" of {budget}" if budget is not None else "")
            say(f"{what}: relaunching ({count})")
        generation += 1


def _check_reset_limit(settings: ElasticSettings, resets: int, what: str, code: int = 1) -> None:
    if settings.reset_limit is not None and resets > settings.reset_limit:
        raise GiveUp(
            f"{what}, but the job was relaunched {resets - 1} time(s) already "
            f"(--reset-limit {settings.reset_limit})",
            code,
        )
