"""Opening the files a user names as input: regular files only, read with a bound.

A name may lead anywhere: a symlink to ``/dev/zero`` or ``/dev/stdin``, a FIFO no one
writes to, a file of gigabytes. Opened as a plain file, the first never ends (a
``MemoryError`` after a while), the second blocks the run forever, the third takes the
memory. :func:`open_regular` opens without blocking (``O_NONBLOCK``: a FIFO's open does
not wait for a writer) and refuses what is not a regular file; :func:`read_capped`
reads at most a given number of bytes. Both raise :class:`OSError` subclasses, so the
readers that already turn an unreadable file into one line naming it (``cannot
read: ...``) say these too (docs/simulation.md, "Limits on inputs").
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

__all__ = ["NotRegularFile", "TooLarge", "open_regular", "read_capped"]


class NotRegularFile(OSError):
    """The name is a directory, a FIFO, a device or a socket, not a file."""


class TooLarge(OSError):
    """The file is larger than its reader takes."""


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading in binary, or :class:`NotRegularFile` (a directory
    keeps its usual ``Is a directory``) without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise NotRegularFile(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
        if not stat.S_ISREG(mode):
            what = _kind(mode)
            raise NotRegularFile(f"{what}, not a regular file" if what[0] == "a" else what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_capped(path: str | os.PathLike[str], limit: int, what: str = "the file") -> bytes:
    """The bytes of the regular file ``path``, or :class:`TooLarge` when it holds more
    than ``limit`` bytes (found by reading one more: a file that grows while it is read
    is bounded too)."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{what} is larger than {_size(limit)}, the most it may be")
    return data


def _size(n: int) -> str:
    """``16 MiB``, ``512 KiB``, ``100 bytes``: a limit as the docs write it."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n:,} bytes"
