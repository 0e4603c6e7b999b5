"""The live controller's clock: wall time that never goes back (:class:`WallClock`).

Everything the controller stamps (job starts and ends, the plugin's facts, their
charge steps) and every deadline it keeps (a drain's, a grow's readiness) is wall time,
seconds since the epoch, because that is what accounting records and users read. A
wall clock can be stepped back (an administrator's ``date``, a bad NTP source): read as
it is, a release would then be stamped before the grow it follows, and the usage
between them counted twice. The clock therefore stands still until wall time has caught
up with the latest time it gave, and the step is logged once (docs/live-controller.md,
"The clock").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

__all__ = ["STEP_LOGGED", "WallClock"]

log = logging.getLogger(__name__)

#: A step back of at least this many seconds is logged (smaller ones are the jitter of
#: a clock being slewed, and are only absorbed).
STEP_LOGGED = 1.0


class WallClock:
    """Real time (seconds since the epoch), never earlier than a time it gave before;
    ``advance_to`` is a no-op because wall time moves by itself (the embedded controller
    calls it only in simulated runs)."""

    def __init__(self, source: Callable[[], float] = time.time) -> None:
        self._source = source
        self._last = -float("inf")
        self._held = False  # standing still after a logged step back
        self._lock = threading.Lock()

    def now(self) -> float:
        t = self._source()
        with self._lock:
            last = self._last
            if t >= last:
                if self._held:
                    self._held = False
                    log.warning("the wall clock has caught up: the controller's time moves again")
                self._last = t
                return t
            if not self._held and last - t >= STEP_LOGGED:
                self._held = True
                log.warning(
                    "the wall clock went back %.3f s: the controller's time stands still "
                    "until it catches up (stamps and deadlines keep their order)",
                    last - t,
                )
            return last

    def advance_to(self, time_: float) -> None:
        """Nothing to do: the wall clock is never moved."""
