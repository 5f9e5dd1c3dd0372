"""What hvdrun and the ranks of an elastic job share: variables, files, exit codes.

hvdrun (the driver) and the ranks it starts talk through the environment and
through a few files in the job's state directory, never through a socket:

- variables hvdrun sets on every rank of every launch (:class:`WorkerContext`
  reads them): ``HVDLITE_ELASTIC=1`` (and Horovod's ``HOROVOD_ELASTIC=1``),
  ``HVDLITE_ELASTIC_JOB_DIR`` (this job's state directory),
  ``HVDLITE_ELASTIC_JOB_ID``, ``HVDLITE_ELASTIC_GENERATION`` (0 for the first
  launch, then 1, 2, ...) and ``HVDLITE_ELASTIC_EXPECT_COMMIT`` (the commit
  hvdrun saw on disk before this launch, 0 for none);
- files in the job directory: the commit (:data:`STATE_FILE`, see
  :mod:`.persistence`), a host-update notice per launch
  (:func:`notice_path`: hvdrun writes it, rank 0 looks for it at every
  ``commit()``) and a restart marker per launch (:func:`restart_path`: rank 0
  writes it once the state is on disk and every rank is about to exit with
  :data:`HOSTS_UPDATED_EXIT`).

The directory must be on a file system that hvdrun's host and every rank's host
see alike (the job's working directory on a cluster): a relaunched job may put
rank 0 on another host.

Standard library only: hvdrun imports this module, and it must not load MPI.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

__all__ = [
    "ENABLED_VARIABLE",
    "JOB_DIR_VARIABLE",
    "JOB_ID_VARIABLE",
    "GENERATION_VARIABLE",
    "EXPECT_COMMIT_VARIABLE",
    "STATE_FILE",
    "HOSTS_UPDATED_EXIT",
    "STATE_ERROR_EXIT",
    "STATE_WRITE_EXIT",
    "WorkerContext",
    "notice_path",
    "restart_path",
    "post_notice",
    "read_notice",
    "mark_restart",
    "record_launch",
    "last_launch",
    "MARKER_FILE",
    "write_marker",
    "has_marker",
]

ENABLED_VARIABLE = "HVDLITE_ELASTIC"
JOB_DIR_VARIABLE = "HVDLITE_ELASTIC_JOB_DIR"
JOB_ID_VARIABLE = "HVDLITE_ELASTIC_JOB_ID"
GENERATION_VARIABLE = "HVDLITE_ELASTIC_GENERATION"
EXPECT_COMMIT_VARIABLE = "HVDLITE_ELASTIC_EXPECT_COMMIT"
STATE_FILE = "state.hvdlite"
LAUNCH_FILE = "launch"  # the number of the job's latest launch (hvdrun writes it)
# hvdrun writes the job id here when it makes the job directory: a rank 0 that
# does not find it is looking at another directory (not shared with hvdrun).
MARKER_FILE = "job"
# Every rank exits with this code after HostsUpdatedInterrupt, once the state is
# persisted: hvdrun relaunches on the new hosts (75 is sysexits' EX_TEMPFAIL).
HOSTS_UPDATED_EXIT = 75
# Every rank exits with this code when the commit to resume from cannot be read:
# hvdrun reports it and does not relaunch (that would fail the same way).
STATE_ERROR_EXIT = 76
# Rank 0 exits with this code when a commit cannot be written (a full disk, a
# quota, a read-only file system): hvdrun ends the job with it, without a
# relaunch (the next commit would fail the same way) and without leaving the
# host out (the host is healthy).  74 is sysexits' EX_IOERR.
STATE_WRITE_EXIT = 74


@dataclasses.dataclass(frozen=True)
class WorkerContext:
    """This rank's view of the elastic job it belongs to (from hvdrun's variables).

    ``job_dir`` is None outside hvdrun's elastic mode: commits then stay in
    memory (Horovod's behaviour) and nothing relaunches the job.
    """

    job_dir: str | None = None
    job_id: str = ""
    generation: int = 0
    expect_commit: int = 0

    @property
    def relaunchable(self) -> bool:
        """True under hvdrun's elastic mode: hvdrun relaunches failed or resized jobs."""
        return self.job_dir is not None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> WorkerContext:
        env = os.environ if environ is None else environ
        job_dir = env.get(JOB_DIR_VARIABLE, "").strip()
        if not job_dir:
            return cls()
        return cls(
            job_dir=job_dir,
            job_id=env.get(JOB_ID_VARIABLE, ""),
            generation=_count(env, GENERATION_VARIABLE),
            expect_commit=_count(env, EXPECT_COMMIT_VARIABLE),
        )

    def state_path(self) -> str | None:
        return os.path.join(self.job_dir, STATE_FILE) if self.job_dir else None


def _count(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "").strip() or "0"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a whole number (hvdrun sets it; do not set it by hand)"
        ) from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def notice_path(job_dir: str, generation: int) -> str:
    """The file whose existence tells the ranks of launch *generation* that hosts changed."""
    return os.path.join(job_dir, f"hosts-updated.{generation}")


def restart_path(job_dir: str, generation: int) -> str:
    """The file rank 0 writes when launch *generation* ends to be relaunched on new hosts."""
    return os.path.join(job_dir, f"restart.{generation}")


def _write_small(path: str, text: str) -> None:
    """Write *path* whole (a new owner-only file renamed over it; a link at the temporary
    name is never followed)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # a full disk: leave no temporary behind, name the file
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if exc.filename is None:
            exc.filename = path
        raise


def post_notice(job_dir: str, generation: int, text: str) -> None:
    """hvdrun: tell the ranks of *generation* that the hosts changed (*text* says how)."""
    _write_small(notice_path(job_dir, generation), text + "\n")


def read_notice(job_dir: str, generation: int) -> str | None:
    """The notice for *generation*, or None when there is none (one ``stat`` when absent)."""
    path = notice_path(job_dir, generation)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip() or "hosts changed"
    except OSError:
        return "hosts changed"


def write_marker(job_dir: str, job_id: str) -> None:
    """hvdrun: mark *job_dir* as the directory of job *job_id*."""
    _write_small(os.path.join(job_dir, MARKER_FILE), f"{job_id}\n")


def has_marker(job_dir: str, job_id: str) -> bool:
    """Whether *job_dir* holds hvdrun's marker of job *job_id*."""
    try:
        with open(os.path.join(job_dir, MARKER_FILE), encoding="utf-8") as handle:
            return handle.read().strip() == job_id
    except OSError:
        return False


def record_launch(job_dir: str, generation: int) -> None:
    """hvdrun: launch *generation* starts (a resumed job's launches count on from it)."""
    _write_small(os.path.join(job_dir, LAUNCH_FILE), f"{generation}\n")


def last_launch(job_dir: str) -> int | None:
    """The number of the job's latest launch, None when hvdrun recorded none."""
    try:
        with open(os.path.join(job_dir, LAUNCH_FILE), encoding="utf-8") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def mark_restart(job_dir: str, generation: int, commit: int) -> None:
    """Rank 0: the state of *commit* is on disk and every rank exits to be relaunched."""
    _write_small(restart_path(job_dir, generation), f"{commit}\n")
