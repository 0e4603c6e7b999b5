"""The live controller's state lock, which a request may hand over while its fsync runs.

:class:`ControllerLock` is a re-entrant lock that knows how many times its owner holds
it. That is what lets the live controller release it safely around the plugin's wait
for a durable journal write (:meth:`ControllerLock.handed_over`): only when the waiting
thread holds it exactly once — the hold the hook-call monitor took around the request
hook — is it released; a caller that holds it around a compound operation of its own
keeps it, because releasing it there would let another thread in between the parts of
that operation. Why and when the controller hands it over: docs/architecture.md,
"Concurrency".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ControllerLock:
    """A re-entrant lock with its owner's hold count (:meth:`held_once`).

    The count is only ever changed by the thread that holds the lock, while it holds
    it, so it needs no lock of its own.
    """

    __slots__ = ("_depth", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking, timeout):
            self._depth += 1
            return True
        return False

    def release(self) -> None:
        self._depth -= 1
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def held_once(self) -> bool:
        """Whether the calling thread holds the lock exactly once."""
        # _is_owned: the C RLock's own check (threading.Condition uses it too); the
        # depth alone cannot tell which thread holds the lock.
        return self._depth == 1 and bool(self._lock._is_owned())  # type: ignore[attr-defined]

    @contextmanager
    def handed_over(self) -> Iterator[bool]:
        """Release the lock for the body when the calling thread holds it exactly once,
        and take it back afterwards (whatever the body raised); yields whether it did.
        Held more than once, or not at all, nothing changes."""
        if not self.held_once():
            yield False
            return
        self.release()
        try:
            yield True
        finally:
            self.acquire()


__all__ = ["ControllerLock"]
