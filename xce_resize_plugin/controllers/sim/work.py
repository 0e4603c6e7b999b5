"""Work-based run times: when a running job ends depends on the sizes it ran at.

A rigid job ends ``runtime`` seconds after it starts. A malleable job carries a fixed
amount of *work* instead, measured in fractions of the whole job (1.0 = all of it), and
does it at a rate that depends on its current committed size under a speedup model
(:class:`~.speedup.SpeedupModel`: ``rate = 1 / T(p)``). Every committed allocation
change therefore moves the job's end; after each change the job makes no progress for
the model's reconfiguration cost (data redistribution, process restart).

The controller consults a per-job :class:`JobWork` object (given at submission) at the
job's start and at every ``commit_allocation`` that changes its size, and reschedules
the job's end to what it returns. The scheduler asks the same object for the end it
plans with (:meth:`JobWork.expected_end`), which uses the user's estimate in place of
the true run time, exactly as EASY does for rigid jobs.

Work objects are driver inputs (like :meth:`EmbeddedController.at` callbacks): they
are not saved in the controller's store. A controller restarted on a saved state ends
such a job at ``start + runtime`` again.
"""

from __future__ import annotations

import math
from typing import Final, Protocol

from xce_resize_plugin.controllers.sim.speedup import SpeedupModel

__all__ = ["JobWork", "PlannedWork", "SpeedupWork"]


class JobWork(Protocol):
    """How one job's end follows from the sizes it runs at (see the module docstring)."""

    def start(self, now: float, size: int) -> float | None:
        """The job starts with ``size`` tasks at ``now``: return its end (``None``: never)."""

    def resize(self, now: float, size: int) -> float | None:
        """The committed size became ``size`` at ``now``: return the new end."""

    def expected_end(self) -> float | None:
        """The end the scheduler plans with while the job runs (estimate based)."""

    def planned_duration(self, size: int) -> float | None:
        """The duration the scheduler plans with for a start at ``size`` tasks."""


class SpeedupWork:
    """A malleable job's work under a :class:`SpeedupModel`.

    :param model: the speedup model (and its ``reconfig_cost``).
    :param runtime: the recorded run time at ``ref_procs`` (the model's reference).
    :param ref_procs: the recorded size.
    :param estimate: the user's estimate at ``ref_procs`` (default: ``runtime``); the
        scheduler's view of the job scales it with the same model.

    Two fractions are integrated side by side: ``remaining`` with the true run time
    (when the job really ends) and the scheduler's ``remaining`` with the estimate (when
    it plans the job to end). Both decrease by ``elapsed / T(p)`` for their own ``T``,
    and neither decreases during a reconfiguration.
    """

    __slots__ = (
        "_blocked_until",
        "_runtime",
        "_since",
        "estimate",
        "estimated_remaining",
        "model",
        "ref_procs",
        "remaining",
        "resizes",
        "size",
    )

    def __init__(
        self, model: SpeedupModel, runtime: float, ref_procs: int, estimate: float | None = None
    ) -> None:
        if not (runtime > 0 and math.isfinite(runtime)):
            raise ValueError(f"run time must be positive and finite, not {runtime!r}")
        # What the job was given (read-only: Final).
        self.model: Final = model
        self._runtime = float(runtime)
        self.ref_procs: Final = int(ref_procs)
        self.estimate: Final = (
            float(estimate) if estimate is not None and estimate > 0 else self._runtime
        )
        self.size = 0
        #: Fraction of the job still to do (true run time).
        self.remaining = 1.0
        #: The same fraction as the scheduler sees it (estimated run time).
        self.estimated_remaining = 1.0
        #: Committed size changes so far (each cost ``reconfig_cost`` seconds).
        self.resizes = 0
        self._since = 0.0
        self._blocked_until = 0.0

    def time_at(self, size: int) -> float:
        """``T(size)``: the whole job's run time at a fixed size."""
        return self.model.time_for(self._runtime, self.ref_procs, size)

    def _estimated_time_at(self, size: int) -> float:
        return self.model.time_for(self.estimate, self.ref_procs, size)

    def _progress(self, now: float) -> None:
        """Credit the work done since the last change (none while reconfiguring)."""
        begin = max(self._since, self._blocked_until)
        if now > begin:
            elapsed = now - begin
            self.remaining = max(0.0, self.remaining - elapsed / self.time_at(self.size))
            self.estimated_remaining = max(
                0.0, self.estimated_remaining - elapsed / self._estimated_time_at(self.size)
            )
        self._since = now

    def start(self, now: float, size: int) -> float:
        # A requeued job starts again from scratch: the work of its earlier run is lost.
        self.remaining = self.estimated_remaining = 1.0
        self.size = size
        self._since = self._blocked_until = now
        return now + self.remaining * self.time_at(size)

    def resize(self, now: float, size: int) -> float:
        self._progress(now)
        self.size = size
        self.resizes += 1
        # A change during a reconfiguration restarts it: the redistribution starts over.
        self._blocked_until = now + self.model.reconfig_cost
        return self._blocked_until + self.remaining * self.time_at(size)

    def expected_end(self) -> float:
        begin = max(self._since, self._blocked_until)
        return begin + self.estimated_remaining * self._estimated_time_at(self.size)

    def planned_duration(self, size: int) -> float:
        return self._estimated_time_at(size)

    def gain(self, now: float, size: int) -> float:
        """Seconds the job expects to save by running at ``size`` from ``now`` on,
        after paying the reconfiguration (negative: it would lose time). Estimated, as
        an application knows its own progress: from the estimated remaining work."""
        begin = max(now, self._since, self._blocked_until)
        time_now = self._estimated_time_at(self.size)
        done = (begin - max(self._since, self._blocked_until)) / time_now
        left = max(0.0, self.estimated_remaining - done)
        stay = (begin - now) + left * time_now
        move = self.model.reconfig_cost + left * self._estimated_time_at(size)
        return stay - move


class PlannedWork:
    """A work model for planning only: the scheduler sees the job's estimated end as
    under :class:`SpeedupWork`, but the job's end is not scheduled from it (it comes
    from outside: a recorded run being replayed, a live job's processes).
    """

    __slots__ = ("_inner",)

    def __init__(self, model: SpeedupModel, ref_procs: int, estimate: float) -> None:
        self._inner = SpeedupWork(model, estimate, ref_procs, estimate)

    def start(self, now: float, size: int) -> None:
        self._inner.start(now, size)

    def resize(self, now: float, size: int) -> None:
        self._inner.resize(now, size)

    def expected_end(self) -> float:
        return self._inner.expected_end()

    def planned_duration(self, size: int) -> float:
        return self._inner.planned_duration(size)
