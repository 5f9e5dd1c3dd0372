"""Error classes, named as in Horovod so that ``except hvd.HorovodInternalError`` keeps working."""

__all__ = [
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "HvdliteInternalError",
    "CollectiveTimeoutError",
    "ArgumentError",
    "MismatchError",
]


class HorovodInternalError(RuntimeError):
    """A collective failed on this rank.

    Raised from ``synchronize()``/``handle.result()`` when ranks disagree about a
    collective (shape, dtype, op, root, scale factors), when a stalled collective
    is cancelled by the stall inspector, and after ``shutdown()`` (local or on
    another rank).  The engine stays usable after a disagreement; after a
    shutdown it does not.  Elastic training treats this error as "restore the
    last committed state and retry".
    """


class MismatchError(HorovodInternalError):
    """Ranks disagreed about a collective: shape, dtype, op, root, scale factors,
    splits, or a rank's join() in the way of a kind that cannot run beside it.

    Raised on every rank that submitted the collective; the engine keeps
    working.  (The TensorFlow adapter raises it as a failed precondition, as
    Horovod's TF ops do.)
    """


class ArgumentError(ValueError, HorovodInternalError):
    """A collective's arguments are invalid (dtype, op, root, splits, process set...).

    Raised on the calling rank when the collective is submitted, so nothing is
    sent and no other rank waits for it.  Horovod reports such errors as
    collective failures (``HorovodInternalError``, a ``RuntimeError``); hvdlite
    has always raised ``ValueError``: this class is both, so either ``except``
    catches it.
    """


class CollectiveTimeoutError(HorovodInternalError):
    """A wait of this rank on the others outlasted ``HVDLITE_COLLECTIVE_TIMEOUT``.

    Raised inside the engine, which then ends the whole job (the ranks can no
    longer agree on what ran); its message names the wait and the limit.
    """


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed (elastic training); the caller should re-sync state."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


#: hvdlite's own name for the same class.
HvdliteInternalError = HorovodInternalError
