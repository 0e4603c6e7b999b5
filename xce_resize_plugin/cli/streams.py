"""A standard stream that could not be written, pointed at /dev/null: :func:`to_devnull`.

Shared by ``xce-resize`` and ``bresize``; standard library only, as ``bresize``'s start
path must be (cli/bresize.py).
"""

from __future__ import annotations

import contextlib
import os

TYPE_CHECKING = False  # typing is not imported on bresize's start path (see lsf/lean.py)
if TYPE_CHECKING:
    from typing import TextIO

__all__ = ["to_devnull"]


def to_devnull(stream: TextIO | None) -> None:
    """Point ``stream``'s descriptor at /dev/null: what it still holds, which could not
    be written, goes there when Python flushes it at exit, instead of failing a second
    time (a second message, exit status 120). A stream without a descriptor (none, or
    one replaced by the caller) holds nothing for the exit either."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
