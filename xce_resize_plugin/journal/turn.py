"""A mutex granted in arrival order: how the journal's handles share one environment."""

from __future__ import annotations

import threading
from collections import deque


class TurnLock:
    """A mutex granted in arrival order: the lock of one environment in this process.

    Every piece of LMDB work on the environment (one read chunk, one whole write
    transaction, a remap, the close) takes a turn. py-lmdb serialises its calls on an
    environment anyway (an internal lock per environment), but that lock is not fair:
    threads that read in a tight loop can keep a writer out indefinitely (seen with
    three readers: a commit did not get its turn within minutes). Handing the lock over
    in arrival order bounds every wait by the work queued ahead of it (a reader waits
    at most for the write transaction in progress, fsync included). Holding the turn
    also means no transaction of this process is open, which LMDB requires for changing
    the map size. Other processes are not affected: LMDB readers never block writers.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._queue: deque[threading.Lock] = deque()
        self._held = False

    def __enter__(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        try:
            turn.acquire()  # released by the previous holder, who hands its turn over
        except BaseException:  # e.g. KeyboardInterrupt while waiting
            with self._guard:
                if turn in self._queue:
                    self._queue.remove(turn)  # never reached: just leave the line
                else:
                    self._pass_on()  # the turn was handed over already: pass it on
            raise

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            self._pass_on()

    def _pass_on(self) -> None:
        # Called with the guard held by the holder of the turn.
        if self._queue:
            self._queue.popleft().release()  # still held: now by the next in line
        else:
            self._held = False
