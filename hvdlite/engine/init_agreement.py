"""How ranks agree that ``init()`` may go on, before any collective set-up.

``init()`` first prepares what can fail on one rank alone (reading the knobs,
resolving ``process_sets``, opening the timeline file on rank 0), then every
rank calls :func:`agree` once, with what it found.  Either every rank goes on,
or every rank raises the same error: one rank's bad value can no longer leave
the others blocked in the next communicator split.

Cross-rank contract: collective over the job's communicator, called exactly
once by every rank at the same point of ``init()``; every rank gets back the same
lists of process sets (see :mod:`~hvdlite.engine.initial_sets`).
"""

from __future__ import annotations

from .. import config as _config
from .initial_sets import Entry, inconsistency
from .rank_ranges import describe_ranks

__all__ = ["Preparation", "agree", "check"]


class Preparation:
    """What one rank brings to the agreement."""

    def __init__(self, error: BaseException | None, cfg, sets: list[Entry]):
        self.error = error
        self.cfg = cfg
        self.sets = sets

    def summary(self) -> tuple:
        """The picklable part every rank sends."""
        if self.error is not None:
            return (f"{type(self.error).__name__}: {self.error}", None, None)
        return (None, _config.agreed_values(self.cfg), self.sets)


def check(summaries: list[tuple]) -> str | None:
    """None when every rank may go on, else the one message every rank raises.

    *summaries*: :meth:`Preparation.summary` of every rank, indexed by rank.
    """
    failed: dict[str, list[int]] = {}  # ranks by error: one entry for 31 ranks alike
    for rank, s in enumerate(summaries):
        if s[0] is not None:
            failed.setdefault(s[0], []).append(rank)
    if failed:
        lines = "; ".join(f"{describe_ranks(ranks)}: {error}" for error, ranks in failed.items())
        count = sum(len(ranks) for ranks in failed.values())
        return (
            f"hvdlite.init() failed on {count} of {len(summaries)} ranks, so no "
            f"rank is initialized. {lines}"
        )
    mismatches = _config.disagreements([s[1] for s in summaries])
    if mismatches:
        return (
            "hvdlite.init(): knobs that change what ranks do together must be equal on "
            "every rank, but " + "; ".join(mismatches) + ". Give every rank the same "
            "environment (hvdrun forwards its own to every rank)."
        )
    return inconsistency([s[2] for s in summaries])


def agree(world, mine: Preparation) -> list[list[Entry]]:
    """Collective: every rank's process sets (indexed by rank) when every rank
    prepared the same way, else raise on every rank.

    The rank whose preparation failed re-raises its own exception's class; the
    others raise ValueError, since a bad value is what makes ``init()`` fail.
    """
    summaries = world.allgather(mine.summary())
    message = check(summaries)
    if message is None:
        return [s[2] for s in summaries]
    if mine.error is not None and isinstance(mine.error, (ValueError, OSError)):
        raise type(mine.error)(message) from mine.error
    raise ValueError(message)
