"""Elastic state: what survives a lost rank, a new host, a relaunch.

:class:`State` is Horovod's ``horovod.common.elastic.State``; :class:`ObjectState`
keeps plain Python values as attributes.  The framework states
(``hvdlite.torch.elastic.TorchState``, ``hvdlite.tensorflow.elastic.TensorFlowKerasState``)
build on them.

Cross-rank contract (every method below is collective unless it says otherwise:
every rank calls it at the same point of the program, as for any collective):

- ``save()`` -- (local) copy the live values into memory, the in-memory commit
  Horovod has;
- ``commit()`` -- ``save()``; then, under hvdrun's elastic mode, rank 0 writes
  the state to the job's state directory (:mod:`.persistence`: atomic); then
  ``check_host_updates()``, whose broadcast from rank 0 rank 0 joins only after
  its write.  So by default ``commit()`` returns, on every rank, only once the
  commit is on disk (written, fsync-ed, renamed): a rank lost after that costs
  the work since this commit, never more.  With background writes
  (``HVDLITE_ELASTIC_BACKGROUND_COMMIT=1``, ``hvdrun --elastic-background-commit``;
  :mod:`.writer`) rank 0 only starts the write: the commit is on disk shortly
  after ``commit()`` returns and before the next ``commit()`` saves (which waits
  for it; ``flush()`` too), and rank 0 ending in between loses it.  (A
  synchronous commit of a ``TorchState`` on rank 0 writes the live tensors and
  keeps no copy in memory: the file is its saved state, which ``restore()``
  reads back);
- ``check_host_updates()`` -- rank 0 looks for hvdrun's host-update notice
  (:mod:`.layout`) and broadcasts what it saw; every rank then raises
  :class:`~hvdlite.exceptions.HostsUpdatedInterrupt` together, or none does;
- ``restore()`` -- (local) put the last saved values back into the live objects;
- ``sync()`` -- every rank takes rank 0's values (a broadcast);
- ``register_reset_callbacks(callbacks)`` -- (local) functions run after each
  reset, e.g. to rescale the learning rate to the new ``size()``.

The difference between ``save()`` and ``commit()``: ``save()`` alone keeps the
state in this process's memory only, so it dies with the process; a commit under
hvdrun's elastic mode is on disk and is where a relaunched job resumes.
Outside hvdrun's elastic mode (plain ``hvdrun -np N``, ``mpiexec``) nothing
relaunches the job, and a commit is ``save()`` plus ``check_host_updates()``,
as in Horovod.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable

from ..exceptions import HostsUpdatedInterrupt
from .layout import HOSTS_UPDATED_EXIT, WorkerContext, has_marker, mark_restart, read_notice
from .persistence import CommitStore, CommitWriteError, CorruptStateError, ElasticStateError
from .writer import CommitWriter, InBand, background_commits, dump

__all__ = ["State", "ObjectState"]

_SUMMARY_TYPES = (bool, int, float, str)
_SUMMARY_MAX = 8


def say(text: str) -> None:
    """One line on stderr, marked as coming from the elastic machinery."""
    sys.stderr.write(f"hvdlite.elastic: {text}\n")
    sys.stderr.flush()


def _default_broadcast(obj):
    from ..objects import broadcast_object

    return broadcast_object(obj, root_rank=0)


def _default_rank() -> int:
    from ..basics import rank

    return rank()


def _world_size() -> int:
    from ..basics import is_initialized, size

    return size() if is_initialized() else 1


class State:
    """Horovod's elastic ``State``: see the module doc for the cross-rank contract.

    *bcast_object* broadcasts a picklable object from rank 0 and returns it on
    every rank; *get_rank* returns this process's rank.  Both default to
    hvdlite's own (Horovod requires them; the framework states pass theirs).
    """

    def __init__(
        self, bcast_object: Callable | None = None, get_rank: Callable[[], int] | None = None
    ) -> None:
        self._bcast_object = bcast_object or _default_broadcast
        self._rank = get_rank or _default_rank
        self._reset_callbacks: list[Callable[[], None]] = []
        self._update_posted = False  # on_hosts_updated() was called on this rank
        self._context = WorkerContext.from_environ()
        self._commit_number = 0
        self._writer: CommitWriter | None = None
        self._background = background_commits(os.environ)

    # -- Horovod's interface -------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Run each of *callbacks* (no arguments) after every reset: once the state is in
        sync again on a relaunched job (where ``size()`` may differ) or after a reset in
        this process."""
        callbacks = list(callbacks)
        for callback in callbacks:
            if not callable(callback):
                raise TypeError(
                    f"register_reset_callbacks: {callback!r} is not callable; "
                    "pass a list of functions taking no arguments"
                )
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self._update_posted = False
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp=None, update_res=None) -> None:
        """Horovod's notification hook: the next ``check_host_updates()`` raises on every
        rank when it was called on rank 0."""
        self._update_posted = True

    def commit(self) -> None:
        """Save the state, persist it (under hvdrun's elastic mode), check for new hosts.

        Commits cost a copy of the state (and, on rank 0, a write to disk): commit
        every few batches, trading that cost against the work a failure loses.
        """
        self._settle()
        self._prepare_commit()
        live = None
        if self._context.relaunchable and not self._background and self._rank() == 0:
            live = self._live_snapshot()
        if live is None:
            self.save()
            self._persist()
        else:
            self._commit_live(live)
        self.check_host_updates()

    def _prepare_commit(self) -> None:
        """Every rank, first in ``commit()``: what the state must do together before
        rank 0 snapshots it and the others save it (nothing here)."""

    def _commit_live(self, live: tuple[object, dict]) -> None:
        """Rank 0's synchronous commit, straight from the live state (which stands still:
        this thread is inside ``commit()``): the file is written, and it is the saved
        copy from now on (:meth:`_saved_in_commit`); returns once it is on disk."""
        self._commit_number += 1
        self._check_shared()
        if self._writer is None:
            self._writer = CommitWriter(self._store())
        snapshot, summary = live
        self._writer.write(dump(snapshot), self._commit_number, _world_size(), summary)
        self._saved_in_commit()

    def check_host_updates(self) -> None:
        """Raise HostsUpdatedInterrupt on every rank when hvdrun announced new or lost hosts."""
        seen = None
        if self._rank() == 0:
            seen = self._notice()
        seen = self._bcast_object(seen)
        if seen:
            raise HostsUpdatedInterrupt(skip_sync=False)

    def save(self) -> None:
        """Copy the live values into this process's memory."""
        raise NotImplementedError()

    def restore(self) -> None:
        """Put the last saved values back, undoing what changed since."""
        raise NotImplementedError()

    def sync(self) -> None:
        """Give every rank rank 0's values."""
        raise NotImplementedError()

    def reset(self) -> None:
        """Hook for subclasses: runs at each reset, before the reset callbacks."""

    # -- persistence (hvdlite) -----------------------------------------------------------
    def _snapshot(self) -> object:
        """The saved state as one picklable object (what a commit writes)."""
        raise NotImplementedError()

    def _live_snapshot(self) -> tuple[object, dict] | None:
        """What :meth:`_snapshot` and :meth:`_summary` will give after the next ``save()``,
        taken from the live objects without copying them; None when the state cannot say
        (the commit then saves first and writes the saved copy).  A state that gives one
        implements :meth:`_saved_in_commit`."""
        return None

    def _saved_in_commit(self) -> None:
        """Rank 0, once the live state is on disk as the last commit: make that commit
        the saved state, in place of a copy in memory (``restore()`` reads it back)."""
        raise NotImplementedError()

    def _load_snapshot(self, snapshot: object) -> None:
        """Make *snapshot* (from :meth:`_snapshot`) the saved state and the live one."""
        raise NotImplementedError()

    def _summary(self) -> dict:
        """A few simple values that name a commit in the logs (e.g. epoch and batch)."""
        return {}

    def _notice(self) -> str | None:
        if self._update_posted:
            return "on_hosts_updated() was called"
        ctx = self._context
        return read_notice(ctx.job_dir, ctx.generation) if ctx.relaunchable else None

    def _store(self) -> CommitStore:
        ctx = self._context
        return CommitStore(ctx.state_path(), ctx.job_id, ctx.generation)

    def _check_shared(self) -> None:
        """Rank 0, before its first write: the job directory must be the one hvdrun made
        (its marker is there), not a directory of the same name on this host's own disk."""
        ctx = self._context
        if self._writer is None and not has_marker(ctx.job_dir, ctx.job_id):
            raise CommitWriteError(
                f"the elastic state directory {ctx.job_dir} on this host has no marker of "
                f"job {ctx.job_id}, which hvdrun wrote into it: this host does not see "
                "hvdrun's directory, and a commit written here would be lost or resumed "
                "stale later. Give hvdrun an --elastic-state-dir on a file system that its "
                "host and every rank's host share, then start the job again"
            )

    def flush(self) -> None:
        """(+) Wait until the last commit is on disk (rank 0; elsewhere it returns at once).

        Local: no other rank takes part.  Only background commits
        (``HVDLITE_ELASTIC_BACKGROUND_COMMIT=1``) can be in flight; a default commit is
        on disk when ``commit()`` returns.  Raises ElasticStateError when writing it failed.
        """
        if self._writer is not None:
            self._writer.wait()

    def _settle(self) -> None:
        """Wait for the background write in flight (if any): it reads the saved state,
        which the next ``save()`` overwrites in place."""
        if self._writer is not None:
            self._writer.wait()

    def _persist(self) -> None:
        """Rank 0 writes the saved state as the next commit (hvdrun's elastic mode): by
        default before it returns, with background commits on the writer's thread."""
        if not self._context.relaunchable:
            return
        self._commit_number += 1
        if self._rank() == 0:
            self._check_shared()
            if self._writer is None:
                self._writer = CommitWriter(self._store())
            # Pickled here, on the training thread: the commit holds the values as they
            # are now; the tensors' bytes stay in the saved copies, out of band.
            parts = dump(self._snapshot())
            write = self._writer.submit if self._background else self._writer.write
            write(parts, self._commit_number, _world_size(), self._summary())

    def _resume(self) -> None:
        """Collective: rank 0 loads the job's last commit, if any; every rank learns the
        outcome and raises the same ElasticStateError when the commit cannot be used."""
        ctx = self._context
        if not ctx.relaunchable:
            return None
        outcome: tuple = ("none", 0, "")
        if self._rank() == 0:
            outcome = self._load_commit()
        kind, number, text = self._bcast_object(outcome)
        if kind == "error":
            raise ElasticStateError(text)
        self._commit_number = number
        if kind == "loaded" and self._rank() == 0:
            say(f"resuming from {text} with {_world_size()} rank(s) (launch {ctx.generation})")

    def _load_commit(self) -> tuple:
        ctx = self._context
        try:
            commit, fell_back = self._read_commit()
            if commit is None:
                if ctx.expect_commit:
                    raise ElasticStateError(
                        f"the elastic state file {ctx.state_path()} is missing, but hvdrun "
                        f"saw commit {ctx.expect_commit} there before this launch: the "
                        "state directory must be one that hvdrun and every host share "
                        "(--elastic-state-dir on a shared file system)"
                    )
                return ("none", 0, "")
            if (
                commit.number > ctx.expect_commit
                and commit.launch is not None
                and commit.launch < ctx.generation
            ):
                raise ElasticStateError(
                    f"the elastic state file {ctx.state_path()} holds commit {commit.number} "
                    f"of launch {commit.launch}, written after hvdrun saw commit "
                    f"{ctx.expect_commit} and started this launch ({ctx.generation}): a "
                    "leftover rank of an earlier launch wrote it. Stop that process (its "
                    "host was cut off), then start the job again"
                )
            if commit.number < ctx.expect_commit and not fell_back:
                raise ElasticStateError(
                    f"the elastic state file {ctx.state_path()} holds commit {commit.number}, "
                    f"but hvdrun saw commit {ctx.expect_commit} there before this launch: "
                    "another copy of the directory is in the way (give every host the same "
                    "shared --elastic-state-dir)"
                )
            try:
                snapshot = commit.load()
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is the file's
                raise ElasticStateError(
                    f"the elastic state file {ctx.state_path()} cannot be unpickled ({exc}); "
                    "was the state made with other classes than this script has?"
                ) from None
            self._load_snapshot(snapshot)
            return ("loaded", commit.number, commit.describe())
        except ElasticStateError as exc:
            return ("error", 0, str(exc))

    def _read_commit(self) -> tuple:
        """``(commit, from the spare)``: the last commit, or -- when it is damaged -- the
        one before it from the spare copy, if that one is whole (said on stderr)."""
        store = self._store()
        try:
            return store.read(), False
        except CorruptStateError as exc:
            spare = store.spare()
            try:
                older = spare.read()
            except ElasticStateError as again:
                raise ElasticStateError(
                    f"{exc} (its spare copy {spare.path} cannot be used either: {again})"
                ) from None
            if older is None:
                raise
            say(
                f"warning: {exc}. Resuming instead from the commit before it, "
                f"{older.describe()}, in {spare.path}, whose checksum matches: the work "
                "since that commit is done again"
            )
            return older, True

    def _leave_for_new_hosts(self) -> None:
        """Every rank, after HostsUpdatedInterrupt under hvdrun's elastic mode: persist the
        current state as a commit, mark the launch for a relaunch, and exit."""
        self.save()
        self._persist()
        self.flush()
        if self._rank() == 0:
            mark_restart(self._context.job_dir, self._context.generation, self._commit_number)
            say(
                f"hosts changed: saved commit {self._commit_number}; every rank exits "
                f"(code {HOSTS_UPDATED_EXIT}) and hvdrun relaunches on the new hosts"
            )
        raise SystemExit(HOSTS_UPDATED_EXIT)


class ObjectState(State):
    """Plain Python values, each given as a keyword argument and kept as an attribute.

    ``ObjectState(epoch=0, batch=0)`` -> ``state.epoch``, ``state.batch``.  The
    values must be picklable (they are broadcast, and committed to disk under
    hvdrun's elastic mode).
    """

    def __init__(
        self,
        bcast_object: Callable | None = None,
        get_rank: Callable[[], int] | None = None,
        **kwargs,
    ) -> None:
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def _snapshot(self) -> object:
        # In band: a numpy array among the values would otherwise be written from its own
        # memory, which training may change while a background write reads it.
        return {"objects": InBand(self._saved_state)}

    def _load_snapshot(self, snapshot: object) -> None:
        if not isinstance(snapshot, dict) or "objects" not in snapshot:
            raise ElasticStateError(
                "the committed state was not written by an ObjectState "
                "(or a state class built on it)"
            )
        saved = dict(snapshot["objects"])
        missing = sorted(set(self._saved_state) - set(saved))
        if missing:
            raise ElasticStateError(
                f"the committed state has no value for {missing}: the "
                "script's state has attributes the commit lacks"
            )
        self._saved_state.update(saved)
        self.restore()

    def _summary(self) -> dict:
        return _summary_of(self._saved_state)


def _summary_of(values: dict) -> dict:
    """The simple values of *values* that name a commit in the logs (a few, short)."""
    simple = {
        name: value
        for name, value in values.items()
        if isinstance(value, _SUMMARY_TYPES) and len(repr(value)) <= 40
    }
    return dict(list(simple.items())[:_SUMMARY_MAX])
