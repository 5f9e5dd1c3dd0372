"""This rank's collectives between admission and completion.

:class:`InFlight` holds the entries the engine took from its inbox and has not
finished: by key (``pending``), the ones that must go to the coordinator
(``uncached``), and whether this rank is inside ``join()``.  It admits each
new entry (a response-cache hit waits on its bit, anything else becomes a
request), finishes or fails entries as their batches run or their errors come
back, and applies the control responses (errors, join, adding and removing a
process set).

Local to the rank: what it decides comes from the responses every rank runs in
the same order, so every rank finishes the same collectives alike.
"""

from __future__ import annotations

from ..exceptions import HorovodInternalError, MismatchError
from .messages import CACHEABLE, JOIN_KEY, LEAVE_PARAMS, MISMATCH, RESPONSE_ERROR, Kind, Response
from .status import Flag
from .submissions import Entry

__all__ = ["InFlight"]

_JOIN = int(Kind.JOIN)


class InFlight:
    """The entries of this rank in flight, and how each one ends."""

    def __init__(self, inbox, bits, sets, check_order: bool):
        self.inbox = inbox
        self.bits = bits
        self.sets = sets
        self.check_order = check_order  # then the response cache is bypassed
        self.pending: dict[tuple, Entry] = {}
        self.uncached: list[Entry] = []
        self.joined = False  # this rank is inside join()
        self.others_joined = False  # some rank is, as of the last cycle
        self.timeline = None  # the engine's Timeline while one records
        self.set_control = None  # the engine's SetControl, for set responses

    def admit(self, entry: Entry) -> None:
        params = entry.params
        if params.kind == _JOIN and params == LEAVE_PARAMS:
            self._leave_join(entry)
            return
        self.pending[entry.key] = entry
        if params.set_id not in self.sets.members:
            self.fail(
                entry,
                f"process set {params.set_id} of {params.name!r} is not "
                "registered (was it removed?)",
            )
            return
        if params.kind == _JOIN:
            self.joined = True
        if self.check_order or params.kind not in CACHEABLE or not self.bits.admit(entry):
            self.uncached.append(entry)

    def _leave_join(self, leave: Entry) -> None:
        """The caller left join() before it returned: fail the join here and, where
        its request went out, have the coordinator stop counting this rank as joined."""
        self.inbox.release((leave.key,))
        leave.handle.set_result(None)  # nobody waits on it
        join = self.pending.get(JOIN_KEY)
        if join is None:  # it completed (or failed) before the caller left
            return
        sent = join.sent
        self.fail(
            join,
            "join() was left before every rank had joined; this rank takes "
            "part in collectives again.",
        )
        if sent:
            self.uncached.append(leave)

    def flags(self, new: bool, draining: bool, stall: bool) -> int:
        """This rank's flags for the cycle's status exchange."""
        return (
            (Flag.NEW if new else 0)
            | (Flag.UNCACHED if self.uncached else 0)
            | (Flag.SHUTDOWN if draining else 0)
            | (Flag.JOINED if self.joined else 0)
            | (Flag.INVALID if self.bits.invalid_mask else 0)
            | (Flag.STALL if stall else 0)
        )

    def some_joined(self, joined: bool, any_hit: int) -> tuple[bool, bool]:
        """Take this cycle's global JOINED flag: (it changed, cache hits were moved to
        the coordinator).  While some rank has joined the coordinator negotiates
        everything, by this cycle's global flag (not at admission, maybe a cycle
        apart on each rank); *any_hit* is global too, so every rank answers alike."""
        changed = self.others_joined != joined
        self.others_joined = joined
        if joined:
            self.uncached += self.bits.unhit_all()
        return changed, joined and bool(any_hit)

    def take_uncached(self) -> list[Entry]:
        """The entries for the coordinator, handed over once."""
        uncached, self.uncached = self.uncached, []
        return uncached

    def control(self, response: Response) -> None:
        """An error response, or one of a kind without tensors (join, process sets)."""
        if response.status == RESPONSE_ERROR:
            entry = self.pending.get(response.key)
            if entry is not None:
                self.fail(
                    entry,
                    response.error,
                    MismatchError if response.value == MISMATCH else HorovodInternalError,
                )
        elif response.params.kind == _JOIN:
            self.joined = False
            entry = self.pending.get(response.key)
            if entry is not None:
                self.finish(entry, response.value)
        elif response.params.kind == Kind.ADD_PROCESS_SET:
            self.set_control.add(response)
        else:
            self.set_control.remove(response)

    def finish(self, entry: Entry, value) -> None:
        tl = self.timeline
        if tl is not None:
            tl.finishing()
        self.pending.pop(entry.key, None)
        self.inbox.release((entry.key,))
        if entry.params.kind == _JOIN:
            self.joined = False
        entry.handle.set_result(entry.result(value))

    def finish_keys(self, keys) -> None:
        """Finish the local entries of *keys* with their outputs (a batch that ran):
        what :meth:`finish` does per entry, with the in-flight names released at once."""
        tl = self.timeline
        if tl is not None:
            tl.finishing()
        pending = self.pending
        entries = [pending.pop(key) for key in keys if key in pending]
        self.inbox.release([entry.key for entry in entries])
        for entry in entries:
            entry.handle.set_result(entry.result(None))

    def fail(self, entry: Entry, message: str, error=HorovodInternalError) -> None:
        self.pending.pop(entry.key, None)
        self.inbox.release((entry.key,))
        if entry.params.kind == _JOIN:
            self.joined = False
        self.bits.forget(entry)
        if entry in self.uncached:
            self.uncached.remove(entry)
        entry.handle.set_exception(error(message))

    def fail_everything(self, reason: str) -> None:
        """Fail every queued and pending entry with *reason* (the engine stops)."""
        for entry in self.inbox.close(reason) + list(self.pending.values()):
            self.fail(entry, reason)
