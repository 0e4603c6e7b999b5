"""What the live controller makes of an exception from its write path.

Two kinds of failure stop the controller's normal work, and they are told apart here:

- **fenced**: a newer controller took the state directory (a
  :class:`~xce_resize_plugin.errors.FencedError`, or an error it caused); this
  controller must stop for good (exit status 3);
- **a durable write failed**: the controller's own state
  (:class:`~xce_resize_plugin.controllers.violations.StoreError`), the plugin's journal
  (a :class:`~xce_resize_plugin.errors.JournalError` that is not a fenced one), or a
  file written with them (a hostfile) could not be written — a full or failing disk.
  The controller then goes back to what is on disk, refuses changes with
  :class:`StateNotWritable` (503) and tries again until the writes work
  (docs/live-controller.md, "When the state cannot be written").
"""

from __future__ import annotations

import errno

from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.errors import FencedError, JournalError
from xce_resize_plugin.journal.lmdb_env import is_failed_write

#: ``OSError`` numbers that mean the disk, not the request: full, over quota, a file
#: too large for the limits of the process, an I/O error, a read-only filesystem.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


class StateNotWritable(JournalError):
    """The controller's state cannot be written now; nothing was changed. A
    :class:`~xce_resize_plugin.errors.JournalError`, so the REST layer adds
    ``Retry-After`` (:func:`xce_resize_plugin.rest.problems.retry_after`)."""

    code = "XCE_STATE_NOT_WRITABLE"
    message = "The controller's state cannot be written (nothing was changed)"
    http_status = 503


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions that caused it, outermost first (no cycles)."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__
    return out


def fenced_cause(exc: BaseException) -> FencedError | None:
    """The :class:`FencedError` behind ``exc`` (itself or a cause), if any."""
    for item in _chain(exc):
        if isinstance(item, FencedError):
            return item
    return None


def storage_failure(exc: BaseException | None) -> BaseException | None:
    """The failed write behind ``exc`` (itself or a cause), ``None`` when ``exc`` is
    something else: fenced, a refusal, a bug."""
    if exc is None or fenced_cause(exc) is not None:
        return None
    for item in _chain(exc):
        if isinstance(item, StateNotWritable):
            return None  # a refusal because of an earlier failure, not a new one
        if isinstance(item, (StoreError, JournalError)) and is_failed_write(item):
            # Only a write that did not happen: a damaged record read for one request,
            # or a value that cannot be encoded, fails that request alone.
            return item
        if isinstance(item, OSError) and item.errno in DISK_ERRNOS:
            return item
    return None


__all__ = ["DISK_ERRNOS", "StateNotWritable", "fenced_cause", "storage_failure"]
