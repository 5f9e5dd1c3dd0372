"""Rank 0's commit writer: the disk work of a commit, on the training thread or off it.

The commit is pickled on the training thread (:func:`dump`: the plain values
into the pickle, tensors' and arrays' bytes left where they are, out of band);
the checksum, the write, ``fsync`` and the rename (:mod:`.persistence`) then
run in one of two ways:

- by default (synchronous): ``commit()`` on rank 0 returns once they are done.
  A :class:`~hvdlite.torch.elastic.TorchState` writes its live tensors (nothing
  changes them while ``commit()`` runs) and keeps no copy of them in memory on
  rank 0: the commit file is its saved state, read back by ``restore()``.
- background (``HVDLITE_ELASTIC_BACKGROUND_COMMIT=1``, or
  ``HVDLITE_ELASTIC_SYNC_COMMIT=0``; ``HVDLITE_ELASTIC_SYNC_COMMIT=1`` wins
  over both): rank 0 starts the write from its saved state on a thread and
  ``commit()`` returns while it runs.  The commit is on disk a short while
  later (the time to write the state: milliseconds to seconds by its size and
  the disk), and surely once the next ``commit()`` -- or ``save()``, or
  ``flush()`` -- starts, which wait for it first: the saved tensors are reused
  by the next save.  Rank 0 ending before then (its own death, or hvdrun ending
  the job for another rank's) loses that commit; the job resumes from the one
  before.  Measured on this project's 2-core machine the background write saved
  0.5-2.4 % of a step against the synchronous one (``bench_elastic.py``): it is
  meant for slow shared file systems.

One write is in flight at a time.  :meth:`CommitWriter.wait` waits for it and
raises, as :class:`~.persistence.ElasticStateError`, what went wrong writing it
(a full disk, say); a synchronous write raises at once.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import sys
import threading
from collections.abc import Mapping

from .persistence import CommitStore, CommitWriteError, ElasticStateError

__all__ = ["CommitWriter", "InBand", "background_commits", "dump"]


_YES = ("1", "true", "yes", "on")
_NO = ("0", "false", "no", "off")


def background_commits(environ: Mapping[str, str]) -> bool:
    """True when *environ* asks for background commit writes.

    ``HVDLITE_ELASTIC_BACKGROUND_COMMIT=1`` (``hvdrun --elastic-background-commit``)
    asks for them; ``HVDLITE_ELASTIC_SYNC_COMMIT=1``, the older spelling of the
    default, wins over it, and ``HVDLITE_ELASTIC_SYNC_COMMIT=0`` asks for them too."""
    sync = environ.get("HVDLITE_ELASTIC_SYNC_COMMIT", "").strip().lower()
    if sync in _YES:
        return False
    background = environ.get("HVDLITE_ELASTIC_BACKGROUND_COMMIT", "").strip().lower()
    return background in _YES or sync in _NO


class CommitWriter:
    """Writes commits to *store*: :meth:`write` at once, :meth:`submit` on a thread."""

    def __init__(self, store: CommitStore) -> None:
        self.store = store
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._number = 0

    def write(self, parts: list, number: int, size: int, summary: dict) -> None:
        """Write *parts* (from :func:`dump`) as commit *number*; on return it is on disk."""
        self.wait()
        self._number = number
        try:
            self.store.write(parts, number, size, summary)
        except Exception as exc:  # noqa: BLE001 - one message for every way it fails
            raise self._failed(exc) from exc

    def submit(self, parts: list, number: int, size: int, summary: dict) -> None:
        """Wait for the previous commit, then start writing *parts* as commit *number*.

        The buffers of *parts* must stay as they are until :meth:`wait` returns."""
        self.wait()
        self._number = number

        def write() -> None:
            try:
                self.store.write(parts, number, size, summary)
            except BaseException as exc:  # noqa: BLE001 - reported by wait()
                self._error = exc

        self._thread = threading.Thread(target=write, name=f"hvdlite-commit-{number}", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Return once the commit in flight (if any) is on disk; raise what failed it."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise self._failed(error) from error

    def _failed(self, error: BaseException) -> ElasticStateError:
        if isinstance(error, OSError) and error.errno is not None:
            name = errno.errorcode.get(error.errno, str(error.errno))
            directory = os.path.dirname(self.store.path) or "."
            return CommitWriteError(
                f"writing commit {self._number} to {self.store.path} failed: "
                f"{error.strerror or error} (errno {error.errno}, {name}); the commit before "
                f"it stays in {directory}. Free space or raise the quota there (or give "
                "hvdrun an --elastic-state-dir with room), then start the job again: hvdrun "
                "does not relaunch it, the next commit would fail the same way"
            )
        return ElasticStateError(
            f"writing commit {self._number} to {self.store.path} failed: {error}"
        )


class InBand:
    """Pickles *value* inside the commit's pickle, never out of band (a copy of its
    arrays' bytes, taken when the commit is pickled); unpickles as *value* itself."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __reduce__(self):
        return pickle.loads, (pickle.dumps(self.value, protocol=5),)


def dump(snapshot: object) -> list:
    """*snapshot* as a pickle and its out-of-band buffers (protocol 5): numpy
    arrays and CPU tensors are written from their own memory, not copied into
    the pickle (:meth:`~.persistence.Commit.load` reads them back)."""
    buffers: list = []
    out = io.BytesIO()
    _StatePickler(out, protocol=5, buffer_callback=buffers.append).dump(snapshot)
    return [out.getbuffer()] + [buffer.raw() for buffer in buffers]


def _tensor_from_array(array):
    import torch

    return torch.from_numpy(array)


class _StatePickler(pickle.Pickler):
    """Pickles torch CPU tensors as numpy arrays, whose bytes go out of band."""

    def reducer_override(self, obj):
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and isinstance(obj, torch.Tensor)
            and obj.is_cpu
            and obj.layout is torch.strided
            and not obj.requires_grad
            and obj.dtype not in (torch.bfloat16, torch.complex32)
            and not obj.is_quantized
        ):
            return _tensor_from_array, (obj.contiguous().numpy(),)
        return NotImplemented
