"""The commit file: one elastic job's last committed state, written atomically.

Format 3: a first line ``HVDLITE-ELASTIC-STATE 3``, a second line of JSON (the
header: job id, commit number, world size, time, a summary of the simple
values, the payload's length, the number of its parts and the checksum,
:mod:`.checksum`), then the part table (each part's length, 8 bytes
little-endian), then the payload (the pickled state, then the tensors' bytes).
The checksum covers the table and the payload.  The header line stays short
whatever the number of parts (a state of 100,000 tensors has as many), and a
commit whose header would be longer than a reader takes (``_MAX_HEADER``) is
refused when it is written, never when it is read back.  Formats 2 (the part
lengths in the JSON header) and 1 (the same with a CRC-32) are still read;
another format is an error that names it.

Writing (rank 0 only, see :meth:`CommitStore.write`): the whole file goes to a
spare name in the same directory (``<state>.spare``: the commit before last,
overwritten in place): first the payload, written and ``fsync``-ed while its checksum is
computed, then the header line (its length is known before the checksum is),
``fsync``-ed again; then the file is renamed over the previous commit
(:func:`_publish`, which keeps the previous commit as the next spare) and the
directory is ``fsync``-ed.  A crash at any point before the rename leaves the
previous commit as it was; a crash after it leaves the new one: a reader sees
one complete commit or the other, never a mixture.

Reading (:meth:`CommitStore.read`): a missing file is ``None`` (no commit yet);
anything else that is not a complete commit of this job -- a wrong first line,
a broken header, a short payload, a checksum that differs, another job's id --
raises :class:`ElasticStateError` naming the file and what is wrong with it.
The payload is unpickled by the caller: a state file must come from a
trusted job, as any pickle.  So the job directory is made ``0700`` and the
commit ``0600`` whatever the umask, and a reader refuses (before it reads
anything) a file or directory that another user owns or that its group or
others may write (:func:`check_private`): with write access there, another
user could put a crafted pickle in place and run code as this one at the next
restore.

The standard library and numpy (for the checksum) only: hvdrun reads commits
with it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pickle
import stat
import struct
import sys
import threading
import time
import zlib

from .checksum import state_sum

__all__ = [
    "ElasticStateError",
    "CommitWriteError",
    "CorruptStateError",
    "StaleLaunchError",
    "Commit",
    "CommitStore",
    "MAGIC",
    "check_private",
    "make_private_dir",
]

MAGIC = b"HVDLITE-ELASTIC-STATE 3\n"
_MAGIC_V2 = b"HVDLITE-ELASTIC-STATE 2\n"  # part lengths in the JSON header: still read
_MAGIC_V1 = b"HVDLITE-ELASTIC-STATE 1\n"  # CRC-32 over the payload: still read
_PREFIX = b"HVDLITE-ELASTIC-STATE "
_SPARE = ".spare"  # the file the next commit is written into (the one before last)
_PREVIOUS = ".previous"  # a second name of the last commit, for a moment
_MAX_HEADER = 64 * 1024
_NO_SUM = "0" * 32  # stands in for the checksum (32 hex digits) until it is known
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class ElasticStateError(RuntimeError):
    """The committed state of an elastic job cannot be used (corrupt, missing, foreign).

    Raised on every rank, never a silent fresh start: resuming from nothing
    would repeat work and diverge from the committed run without a word.
    """


class CommitWriteError(ElasticStateError):
    """A commit could not be written (no space, a quota, a read-only file system).

    Nothing is lost yet (the previous commit stays on disk), but relaunching
    would fail the same way: the job ends (:data:`.layout.STATE_WRITE_EXIT`) and
    the message names the file, the error and the fix.
    """


class CorruptStateError(ElasticStateError):
    """The commit file is damaged (a wrong header, a short payload, a checksum that
    differs); the spare copy beside it may still hold the commit before."""


class StaleLaunchError(ElasticStateError):
    """This process belongs to an earlier launch of the job than the one hvdrun runs now
    (a rank 0 left alive on a host that was cut off): it must not touch the job's state."""


@dataclasses.dataclass(frozen=True)
class Commit:
    """One commit read back: its header fields and its payload (pickled state)."""

    number: int
    job_id: str
    size: int
    time: float
    summary: dict
    payload: bytes
    parts: tuple = ()  # lengths: the pickle, then its out-of-band buffers (empty: one pickle)
    launch: int | None = None  # the launch that wrote it (None: a file from before launches)

    def load(self) -> object:
        """The committed state, unpickled (tensors and arrays from the buffers written
        beside the pickle, without another copy)."""
        if len(self.parts) <= 1:
            return pickle.loads(self.payload)
        view = memoryview(self.payload)
        ends = list(itertools.accumulate(self.parts))
        buffers = [view[start:end] for start, end in zip(ends, ends[1:])]
        return pickle.loads(view[: ends[0]], buffers=buffers)

    def describe(self) -> str:
        """``commit 4 (epoch=1, batch=20)``: how logs name it."""
        details = ", ".join(f"{k}={v}" for k, v in self.summary.items())
        return f"commit {self.number}" + (f" ({details})" if details else "")


def _publish(temporary: str, final: str) -> None:
    """Make the fully written *temporary* the commit (one atomic rename), and keep the
    commit it replaces as the next *temporary*, to be overwritten in place.

    The previous commit gets a second name first (a hard link), so the rename of
    *temporary* over *final* is the one step that switches commits; the old file
    then takes the name *temporary*.  Writing the next commit into an existing
    file of the same size costs a copy into cached pages, where a new file costs
    allocating them (measured on ext4, 15 MB: 0.9 ms against 10 ms).  On a file
    system without hard links, the previous commit is simply replaced."""
    previous = final + _PREVIOUS
    _unlink(previous)
    try:
        os.link(final, previous)
    except OSError:  # no commit yet, or no hard links here: nothing to keep
        previous = None
    os.replace(temporary, final)
    if previous is not None:
        os.replace(previous, temporary)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _write_all(fd: int, chunks: list, offset: int = 0) -> int:
    """Write each of *chunks* (bytes-like) to *fd* from *offset* on; the end offset."""
    for chunk in chunks:
        view = memoryview(chunk).cast("B")
        while view.nbytes:
            done = os.pwrite(fd, view, offset)
            offset += done
            view = view[done:]
    return offset


def _header_line(header: dict) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode() + b"\n"


def _write_payload(fd: int, views: list, offset: int) -> None:
    os.ftruncate(fd, _write_all(fd, views, offset))
    os.fsync(fd)


class _Alongside:
    """``with _Alongside(function, *args): ...`` -- run the call on a thread while the
    body runs; the ``with`` ends once both are done and raises what the call raised."""

    def __init__(self, function, *args) -> None:
        self._call = (function, args)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hvdlite-commit-write", daemon=True)

    def _run(self) -> None:
        function, args = self._call
        try:
            function(*args)
        except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread
            self._error = exc

    def __enter__(self) -> _Alongside:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._thread.join()
        if self._error is not None and exc_info[0] is None:
            raise self._error


def make_private_dir(path: str) -> None:
    """Create directory *path* (and its missing parents), readable and writable by its
    owner only (``0700``, whatever the umask); an existing *path* is left as it is."""
    try:
        os.makedirs(path, mode=0o700)
    except FileExistsError:
        return
    os.chmod(path, 0o700)


def check_private(path: str, info: os.stat_result | None = None) -> None:
    """Raise ElasticStateError when *path* (a state file or its directory) is owned by
    another user or writable by its group or others: whoever may write it can replace
    a commit with a pickle of their own, which runs as this user at the next restore."""
    info = os.stat(path) if info is None else info
    what = "directory" if stat.S_ISDIR(info.st_mode) else "file"
    problem = None
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        problem = f"is owned by user id {info.st_uid}, not by you ({os.geteuid()})"
    elif info.st_mode & 0o022:
        problem = f"may be written by its group or others (mode {stat.S_IMODE(info.st_mode):04o})"
    if problem:
        fix = "chmod go-w" if "mode" in problem else "take a copy you own, or delete it"
        raise ElasticStateError(
            f"the elastic state {what} {path} {problem}: refusing to load the state, a "
            "pickle that anyone who can write there could have replaced to run code as you. "
            f"Check who changed it; if you trust it, {fix} {path} (hvdrun makes state "
            "directories 0700 and files 0600)"
        )


_fsync_warned = False


def _fsync_directory(directory: str) -> None:
    """Make the rename durable; a file system that refuses is named once per process."""
    global _fsync_warned
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as exc:
        failure = exc
    else:
        try:
            os.fsync(fd)
            return
        except OSError as exc:
            failure = exc
        finally:
            os.close(fd)
    if not _fsync_warned:  # some file systems refuse fsync on a directory
        _fsync_warned = True
        sys.stderr.write(
            f"hvdlite.elastic: warning: cannot fsync the directory {directory} "
            f"({failure.strerror or failure}): each commit is renamed into "
            "place, but a crash of the machine right after a commit may lose "
            "that rename (said once)\n"
        )


class CommitStore:
    """The commit file at *path*, for the job *job_id* (see the module doc).

    *launch*: the launch of the job this process belongs to; each commit's header
    records it, and :meth:`write` refuses to write once hvdrun has recorded a later
    launch in the directory (:func:`~.layout.last_launch`): a stale rank 0 of an
    earlier launch, left alive on a cut-off host, cannot overwrite the state the
    current launch resumed from."""

    def __init__(self, path: str, job_id: str = "", launch: int | None = None) -> None:
        self.path = path
        self.job_id = job_id
        self.launch = launch

    def _fix(self) -> str:
        return (
            "nothing starts it afresh on its own: start the job again to begin from "
            "scratch, or put a good copy of the file back and relaunch"
        )

    def write(self, payload, number: int, size: int, summary: dict | None = None) -> None:
        """Persist *payload* as commit *number*; on return the commit is on disk.

        *payload* is bytes, or a list of buffers (a pickle, then its out-of-band
        buffers) written one after the other, without joining them first."""
        parts = [payload] if isinstance(payload, (bytes, bytearray)) else list(payload)
        views = [memoryview(part).cast("B") for part in parts]
        directory = os.path.dirname(self.path) or "."
        make_private_dir(directory)
        self._check_launch(number, directory)
        header = {
            "job": self.job_id,
            "commit": int(number),
            "size": int(size),
            "time": time.time(),
            "summary": summary or {},
            "bytes": sum(view.nbytes for view in views),
            "sum": _NO_SUM,
            "nparts": len(views),
            "launch": self.launch,
        }
        line = _header_line(header)
        if len(line) > _MAX_HEADER:  # a reader would refuse it: refuse it now
            raise ElasticStateError(
                f"commit {number} cannot be written to {self.path}: its header is "
                f"{len(line)} bytes, more than the {_MAX_HEADER} a reader takes (the job id "
                "or the state's summary values are too long); shorten them"
            )
        table = struct.pack(f"<{len(views)}Q", *(view.nbytes for view in views))
        spare = self.path + _SPARE
        # in place (see _publish); never through a symbolic link, and owner-only
        fd = os.open(spare, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o600)
        # (checked again just before the rename: the write may take a while)
        try:
            os.fchmod(fd, 0o600)
            # The payload goes first, after room for the header line and the part
            # table, and is fsync-ed on a thread while this one computes its checksum
            # (the fsync leaves the core idle); then the header line, of the same
            # length with the sum in it, and the table.
            offset = len(MAGIC) + len(line) + len(table)
            with _Alongside(_write_payload, fd, views, offset):
                header["sum"] = state_sum([table, *views])
            _write_all(fd, [MAGIC, _header_line(header), table])
            os.fsync(fd)
        finally:
            os.close(fd)
        self._check_launch(number, directory)
        _publish(spare, self.path)
        _fsync_directory(directory)

    def _check_launch(self, number: int, directory: str) -> None:
        if self.launch is None:
            return
        from .layout import last_launch

        newest = last_launch(directory)
        if newest is not None and newest > self.launch:
            raise StaleLaunchError(
                f"commit {number} of launch {self.launch} is not written to {self.path}: "
                f"hvdrun has started launch {newest} of this job since, so this process is a "
                "leftover of an earlier launch (its host was cut off, or hvdrun lost track "
                "of it); it stops here so that it cannot overwrite the state the current "
                "launch uses"
            )

    def read(self) -> Commit | None:
        """The commit on disk, None when there is none; ElasticStateError when unusable."""
        try:
            with open(self.path, "rb") as handle:
                self._check_private(handle)
                # writable bytes: the loaded tensors are made on them, in place
                data = bytearray(os.fstat(handle.fileno()).st_size)
                del data[handle.readinto(data) :]
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ElasticStateError(
                f"cannot read the elastic state file {self.path}: {exc.strerror}"
            ) from None
        return self._parse(data)

    def _check_private(self, handle) -> None:
        check_private(os.path.dirname(self.path) or ".")
        check_private(self.path, os.fstat(handle.fileno()))

    def spare(self) -> CommitStore:
        """The store of the spare copy beside this commit: the commit before it, kept to
        be overwritten by the next one (a torn one, should a write have stopped)."""
        return CommitStore(self.path + _SPARE, self.job_id, self.launch)

    def _corrupt(self, why: str) -> ElasticStateError:
        return CorruptStateError(
            f"the elastic state file {self.path} is corrupt ({why}): the "
            f"job cannot resume from it; {self._fix()}"
        )

    def read_header(self) -> Commit | None:
        """The commit on disk as its header says (number, job, summary), without reading
        or checking its payload (``payload`` is empty): what hvdrun needs to know.  None
        when there is no commit; ElasticStateError when the header is unusable."""
        try:
            with open(self.path, "rb") as handle:
                self._check_private(handle)
                head = handle.read(len(MAGIC) + _MAX_HEADER)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ElasticStateError(
                f"cannot read the elastic state file {self.path}: {exc.strerror}"
            ) from None
        version, header, _end = self._parse_header(head)
        commit = self._commit_of(header, b"", ())
        self._check_job(commit)
        return commit

    def _parse_header(self, data) -> tuple[bytes, dict, int]:
        """``(first line, header fields, where the header line ends)`` of *data*."""
        if not data.startswith(_PREFIX):
            raise self._corrupt("it does not start with the hvdlite state header")
        version = bytes(data[: len(MAGIC)])
        if version not in (MAGIC, _MAGIC_V2, _MAGIC_V1):
            raise ElasticStateError(
                f"the elastic state file {self.path} has the format "
                f"{version[len(_PREFIX) :].strip().decode(errors='replace')!r}, which "
                "this hvdlite does not read (it reads 1, 2 and 3): resume it with the hvdlite "
                f"that wrote it, or {self._fix()}"
            )
        end = data.find(b"\n", len(MAGIC), len(MAGIC) + _MAX_HEADER)
        if end < 0:
            raise self._corrupt("its header line is cut short")
        try:
            header = json.loads(data[len(MAGIC) : end])
            if not isinstance(header, dict):
                raise TypeError(header)
            self._commit_of(header, b"", ())  # every field is there and of its type
            if version == _MAGIC_V1:
                int(header["crc32"])
            else:
                str(header["sum"])
            int(header.get("nparts", 0))
            tuple(int(n) for n in header.get("parts", ()))
        except (ValueError, KeyError, TypeError):
            raise self._corrupt("its header is not valid") from None
        return version, header, end

    @staticmethod
    def _commit_of(header: dict, payload, parts: tuple) -> Commit:
        launch = header.get("launch")
        return Commit(
            int(header["commit"]),
            str(header.get("job", "")),
            int(header["size"]),
            float(header.get("time", 0.0)),
            dict(header.get("summary") or {}),
            payload,
            parts,
            None if launch is None else int(launch),
        )

    def _check_job(self, commit: Commit) -> None:
        if self.job_id and commit.job_id != self.job_id:
            raise ElasticStateError(
                f"the elastic state file {self.path} belongs to job {commit.job_id!r}, not to "
                f"this job ({self.job_id!r}): give each job its own --elastic-state-dir, or "
                f"{self._fix()}"
            )

    def _parse(self, data: bytes) -> Commit:
        version, header, end = self._parse_header(data)
        length = int(header["bytes"])
        start, table = end + 1, b""
        if version == MAGIC:
            count = int(header.get("nparts", 0))
            if count < 0 or start + 8 * count > len(data):
                raise self._corrupt(f"its table of {count} parts is cut short")
            table = bytes(data[start : start + 8 * count])
            parts = struct.unpack(f"<{count}Q", table)
            start += 8 * count
        else:
            parts = tuple(int(n) for n in header.get("parts", ()))
        payload = data[start:]
        if len(payload) != length:
            raise self._corrupt(f"it holds {len(payload)} bytes of state, its header says {length}")
        if parts and sum(parts) != length:
            raise self._corrupt("its parts do not add up to its length")
        if version == _MAGIC_V1:
            good = zlib.crc32(payload) == int(header["crc32"])
        else:
            view = memoryview(payload)
            ends = list(itertools.accumulate(parts or (length,)))
            pieces = [view[a:b] for a, b in zip([0] + ends, ends)]
            good = state_sum([table, *pieces] if table else pieces) == str(header["sum"])
        if not good:
            raise self._corrupt("the checksum of its state does not match")
        commit = self._commit_of(header, payload, tuple(parts))
        self._check_job(commit)
        return commit
