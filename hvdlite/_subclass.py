"""Wrap a framework object's class while ``isinstance(obj, type(original))`` stays true.

Horovod's optimizers and tapes are instances of the user's class; hvdlite builds,
once per (mixin, class) pair, a subclass that puts the distributed methods in
front and carries the original class's name.
"""

from __future__ import annotations

import functools

__all__ = ["with_mixin"]


@functools.cache
def with_mixin(mixin: type, base: type, module: str | None = None) -> type:
    """*base* with *mixin* in front of it, named like *base* (``__module__``: *module*,
    default *base*'s own, which lets saved models reload with the plain class)."""
    return type(
        base.__name__,
        (mixin, base),
        {"__module__": module or base.__module__, "__qualname__": base.__qualname__},
    )
