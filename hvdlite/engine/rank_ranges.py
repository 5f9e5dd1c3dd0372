"""Rank lists in messages, compressed to ranges: "ranks 0, 2, 5-31".

A message about 32 or 4,096 ranks that names each rank is unreadable; one that
names runs of consecutive ranks as ranges stays one line.  Runs of three or
more ranks become ``first-last``; shorter runs stay as they are, so a message
about a few ranks reads as before.  Pure Python: unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["rank_ranges", "describe_ranks"]


def rank_ranges(ranks: Iterable[int]) -> str:
    """The sorted, distinct *ranks* as ``"0, 2, 5-31"`` (empty string for none)."""
    parts: list[str] = []
    run: list[int] = []
    for r in sorted(set(ranks)):
        if run and r != run[-1] + 1:
            parts.append(_run_text(run))
            run = []
        run.append(r)
    if run:
        parts.append(_run_text(run))
    return ", ".join(parts)


def describe_ranks(ranks: Iterable[int]) -> str:
    """``"rank 3"`` for one rank, ``"ranks 0, 2, 5-31"`` for several."""
    ranks = sorted(set(ranks))
    return f"rank{'s' if len(ranks) != 1 else ''} {rank_ranges(ranks)}"


def _run_text(run: list[int]) -> str:
    if len(run) >= 3:
        return f"{run[0]}-{run[-1]}"
    return ", ".join(map(str, run))
