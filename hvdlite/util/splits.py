"""Cutting a count into near-equal parts, the one rule every collective uses.

Reducescatter's dim-0 shards, the hierarchical allreduce's node shards and
groups of gradients all split this way: as even as possible, the first
``count % parts`` parts one larger.  Every rank computes the same split.
"""

from __future__ import annotations

__all__ = ["even_split", "offsets"]


def even_split(count: int, parts: int) -> list[int]:
    """*count* cut into *parts* sizes that differ by at most one, larger ones first."""
    base, extra = divmod(count, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def offsets(sizes) -> list[int]:
    """Where each of *sizes* starts when they are laid end to end."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size
    return out
