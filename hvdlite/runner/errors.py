"""The launcher's one error type for bad input.

A :class:`UsageError` means the user asked for something hvdrun cannot do
(unknown flag, bad host list, missing MPI, ...).  ``hvdrun`` turns it into a
one-line message on stderr and exit status 2, before anything is started.
"""

from __future__ import annotations

__all__ = ["UsageError", "USAGE_EXIT"]

USAGE_EXIT = 2


class UsageError(ValueError):
    """Bad input to hvdrun; the message is a single line that says the fix."""
