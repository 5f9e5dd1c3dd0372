"""How every rank comes to run rank 0's setting in the same cycle.

Each engine holds one :class:`TuningLink` while autotune is on.  Every cycle,
rank 0 puts its tuner's current setting (:func:`~hvdlite.autotune.setting.to_words`)
into the ``root`` field of the status vector, which every rank exchanges once
per cycle anyway (also in the response cache's steady state, where it is the
only message); the other ranks put all ones there, so the bitwise AND that
combines the vectors hands every rank rank 0's words.  Every rank then calls
:meth:`TuningLink.receive` with them right after that exchange, before the
cycle negotiates or executes anything: a setting that differs from the one in
force is applied by every rank in that same cycle, because it is decided by
the one combined vector every rank holds.

When the tuner has settled, the words say so (``final``); every rank applies
the last setting and, from the next cycle on, leaves the field out of the
vector (:attr:`TuningLink.words` drops to 0 everywhere in the same cycle).

Cross-rank contract: every rank holds a link (``HVDLITE_AUTOTUNE`` agrees) and
calls :meth:`outgoing` / :meth:`receive` once per cycle; only rank 0 has a
tuner and measures (:meth:`observe`).
"""

from __future__ import annotations

from ..engine.fusion import nbytes_of
from ..engine.messages import RESPONSE_OK
from .setting import WORDS, Setting, from_words, to_words

__all__ = ["TuningLink"]


class TuningLink:
    """One rank's end of autotune's per-cycle channel (see the module docstring)."""

    def __init__(self, start: Setting, tuner=None):
        self.tuner = tuner  # rank 0 only: the Tuner that decides
        self.applied = start  # the setting in force on this rank
        self.words = WORDS  # length of the status vector's root field; 0 once settled
        self.history: list[tuple[int, Setting]] = []  # (cycle, setting) at each change
        self._last_batches = None
        self._last_measure: tuple = ((), 0)

    def outgoing(self) -> int | None:
        """This rank's root field: the tuner's setting on rank 0, None elsewhere."""
        tuner = self.tuner
        if tuner is None:
            return None
        return to_words(tuner.setting, tuner.finished)

    def receive(self, words: int, cycle: int) -> Setting | None:
        """Rank 0's *words* of cycle *cycle*: the setting to apply now, or None."""
        setting, final = from_words(words)
        if final:
            self.words = 0
        if setting == self.applied:
            return None
        self.applied = setting
        self.history.append((cycle, setting))
        return setting

    def close(self) -> None:
        """The engine stops: close rank 0's sample log."""
        if self.tuner is not None and self.tuner.sample_log is not None:
            self.tuner.sample_log.close()

    def observe(self, batches) -> None:
        """Rank 0: the engine executed *batches* (lists of responses) this cycle."""
        tuner = self.tuner
        if tuner is None or tuner.finished:
            return
        if batches is not self._last_batches:  # a cached plan repeats the same list
            self._last_batches = batches
            self._last_measure = _measure(batches)
        keys, nbytes = self._last_measure
        tuner.observe(keys, nbytes)


def _measure(batches) -> tuple[tuple, int]:
    """The keys of the responses that ran, and the bytes they moved per rank."""
    keys = []
    nbytes = 0
    for batch in batches:
        for response in batch:
            if response.status == RESPONSE_OK and response.params is not None:
                keys.append(response.key)
                nbytes += nbytes_of(response.params)
    return tuple(keys), nbytes
