"""Opening an output file for writing without following a link someone else put there.

``open(path, "w")`` follows a symbolic link at *path* and truncates what it
points to: in a shared or world-writable directory (``/tmp``, a group's
project directory) another user can make ``timeline.json`` a link to the
victim's ``~/.bashrc``, and the job overwrites it.  :func:`open_for_writing`
refuses a link (``O_NOFOLLOW``), anything but a regular file or a character
device (``/dev/null``), and a file with other names (a hard link), and
truncates only after those checks.  Used for the
files hvdlite streams into as it runs (the timeline, the autotune log, the
task wrapper's per-rank output); files written whole are written to a new file
beside them and renamed over them instead.

Standard library only: the launcher's task wrapper, run as a plain file, imports it as
a plain module from this folder.
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["open_for_writing"]


def open_for_writing(path: str, binary: bool = False, **text_options):
    """*path* opened for writing from its start, as ``open(path, "w")`` would, but
    ``OSError`` (naming the path, the problem and the fix) when it is a symbolic link,
    not a regular file, or a file with more than one name."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise OSError(
                exc.errno,
                f"{path} is a symbolic link: hvdlite does not write "
                "through links (one in a shared directory could point at any of "
                "your files); remove the link or choose another path",
            ) from None
        raise
    try:
        info = os.fstat(fd)
        if stat.S_ISCHR(info.st_mode):  # a device: /dev/null, or /dev/full in a test
            pass
        elif not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a regular file: choose another path")
        elif info.st_nlink > 1:
            raise OSError(
                errno.EMLINK,
                f"{path} has {info.st_nlink} names (hard links): "
                "writing it would change the other names' file too; remove it or "
                "choose another path",
            )
        if stat.S_ISREG(info.st_mode):
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    if binary:
        return open(fd, "wb", **text_options)
    return open(fd, "w", **text_options)
