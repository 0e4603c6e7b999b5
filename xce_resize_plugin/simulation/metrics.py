"""Scheduling metrics of a simulated run, and the observer that gathers them.

Definitions (the usual ones of the scheduling literature; times in seconds):

- *wait* = start - submit; *run* = end - start (the time the job really ran in this
  simulation, which for a malleable job depends on its sizes); *turnaround* =
  end - submit = wait + run.
- *bounded slowdown* = ``max(1, turnaround / max(run, 10))``: the slowdown with very
  short jobs counted as if they ran 10 s (Feitelson's bound), so a 1-second job that
  waited a minute does not dominate the mean.
- *utilization* = slot-seconds held / (slots x makespan), where *makespan* runs from
  the first submission (time 0: trace times are relative to the first job) to the last
  job end. Slots are counted from the committed allocations, which is what the jobs
  were charged for (a grow's slots between its reservation and its commit, or a
  shrink's between its release and its commit, belong to the same instant here:
  requests are made without notification and tasks start and stop at once).
- *resizes*: committed allocation changes (grows and shrinks).

Means are plain arithmetic means over all jobs; the median of an even count is the mean
of the two middle values.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence

from attrs import asdict, define, field, frozen

from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.core.models import Task

__all__ = [
    "BSLD_BOUND",
    "RunMetrics",
    "RunStats",
    "UsageTrack",
    "bounded_slowdown",
    "median",
    "summarize",
]

#: The bound of the bounded slowdown, in seconds.
BSLD_BOUND = 10.0


def bounded_slowdown(wait: float, run: float, bound: float = BSLD_BOUND) -> float:
    """``max(1, (wait + run) / max(run, bound))``."""
    return max(1.0, (wait + run) / max(run, bound))


def median(values: Sequence[float]) -> float:
    """The median (``nan`` for no values)."""
    n = len(values)
    if n == 0:
        return math.nan
    s = sorted(values)
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


@define(eq=False)
class UsageTrack:
    """Slots in use over time as a step function, with its integral.

    ``step(t, used)`` says that from ``t`` on ``used`` slots are in use; times must not
    decrease. Several steps at one instant keep the last value for the step function
    but every value for :attr:`peak` (an overbooking within an instant still counts).
    """

    capacity: int
    times: array[float] = field(init=False, factory=lambda: array("d"))
    used: array[int] = field(init=False, factory=lambda: array("q"))
    area: float = field(init=False, default=0.0)
    peak: int = field(init=False, default=0)
    _t: float = field(init=False, default=0.0)
    _u: int = field(init=False, default=0)

    def step(self, t: float, used: int) -> None:
        if t < self._t:
            raise ValueError(f"usage step at {t} before {self._t}")
        self.area += self._u * (t - self._t)
        self._t, self._u = t, used
        if used > self.peak:
            self.peak = used
        times = self.times
        if times and times[-1] == t:
            self.used[-1] = used
        else:
            times.append(t)
            self.used.append(used)

    def utilization(self, end: float) -> float:
        """Mean utilization over [0, end] (0 for an empty span)."""
        if end <= 0 or self.capacity <= 0:
            return 0.0
        area = self.area + self._u * max(0.0, end - self._t)
        return area / (self.capacity * end)

    def bins(self, n: int, end: float) -> list[float]:
        """Mean utilization in each of ``n`` equal bins over [0, end]."""
        if n <= 0 or end <= 0 or self.capacity <= 0:
            return []
        width = end / n
        out = [0.0] * n
        times, used = self.times, self.used
        for i in range(len(times)):
            a = times[i]
            b = times[i + 1] if i + 1 < len(times) else end
            u = used[i]
            if u == 0 or b <= a:
                continue
            # Spread the segment [a, b) over the bins it covers.
            first, last = int(a / width), min(n - 1, int(b / width))
            for k in range(first, last + 1):
                lo, hi = max(a, k * width), min(b, (k + 1) * width)
                if hi > lo:
                    out[k] += u * (hi - lo)
        return [v / (self.capacity * width) for v in out]


@frozen
class RunMetrics:
    """The table of one run (see the module docstring for the definitions)."""

    jobs: int
    mean_wait: float
    median_wait: float
    mean_turnaround: float
    mean_bounded_slowdown: float
    utilization: float
    makespan: float
    resizes: int
    grows: int
    shrinks: int

    def to_json(self) -> dict[str, float | int]:
        """The table as JSON, in field order (``--json``, the sweep's cells)."""
        return asdict(self)


def summarize(
    waits: Sequence[float],
    runs: Sequence[float],
    usage: UsageTrack,
    makespan: float,
    grows: int = 0,
    shrinks: int = 0,
) -> RunMetrics:
    """The metrics of a run from its per-job waits and run times and its usage."""
    n = len(waits)
    if n != len(runs):
        raise ValueError("one wait and one run time per job")
    if n == 0:
        nan = math.nan
        return RunMetrics(0, nan, nan, nan, nan, 0.0, makespan, grows + shrinks, grows, shrinks)
    total_wait = math.fsum(waits)
    total_turn = math.fsum(w + r for w, r in zip(waits, runs, strict=True))
    total_bsld = math.fsum(bounded_slowdown(w, r) for w, r in zip(waits, runs, strict=True))
    return RunMetrics(
        jobs=n,
        mean_wait=total_wait / n,
        median_wait=median(waits),
        mean_turnaround=total_turn / n,
        mean_bounded_slowdown=total_bsld / n,
        utilization=usage.utilization(makespan),
        makespan=makespan,
        resizes=grows + shrinks,
        grows=grows,
        shrinks=shrinks,
    )


Progress = Callable[[int, int], None]


class RunStats(Observer):
    """Gathers a run's metrics as it goes: per-job waits and run times, the usage step
    function (total slots in use, from starts, commits and ends) and resize counts.

    :param capacity: slots of the cluster.
    :param total: jobs expected (for progress).
    :param progress: called as ``progress(done, total)`` about every 0.5 % of the jobs.
    """

    def __init__(self, capacity: int, total: int = 0, progress: Progress | None = None) -> None:
        self.usage = UsageTrack(capacity)
        self.waits = array("d")
        self.runs = array("d")
        self.ended = 0
        self.started = 0
        #: Runs a host failure's requeue ended (each job so requeued starts again).
        self.requeued = 0
        self.grows = 0
        self.shrinks = 0
        self.makespan = 0.0
        self.total = total
        self._progress = progress
        self._every = max(1, total // 200)
        self._used = 0
        self._sizes: dict[str, int] = {}

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        self.started += 1
        self._sizes[job_id] = len(tasks)
        self._used += len(tasks)
        self.usage.step(time, self._used)

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        old = self._sizes.get(job_id)
        if old is None:
            return
        new = len(tasks)
        if new > old:
            self.grows += 1
        elif new < old:
            self.shrinks += 1
        self._sizes[job_id] = new
        self._used += new - old
        self.usage.step(time, self._used)

    def job_requeued(self, job_id: str, time: float) -> None:
        self.requeued += 1
        size = self._sizes.pop(job_id, 0)
        if size:
            self._used -= size
            self.usage.step(time, self._used)

    @property
    def running(self) -> int:
        """Jobs running now."""
        return self.started - self.requeued - self.ended

    def job_ended(self, job: FinishedJob) -> None:
        self.ended += 1
        size = self._sizes.pop(job.id, 0)
        if size:
            self._used -= size
            self.usage.step(job.end_time, self._used)
        start = job.start_time if job.start_time is not None else job.end_time
        self.waits.append(start - job.submit_time)
        self.runs.append(job.end_time - start)
        if job.end_time > self.makespan:
            self.makespan = job.end_time
        if self._progress is not None and self.ended % self._every == 0:
            self._progress(self.ended, self.total)

    def detach_progress(self) -> None:
        """Stop reporting progress (a finished run's stats travel between processes,
        and the callback is the run's)."""
        self._progress = None

    def metrics(self) -> RunMetrics:
        return summarize(self.waits, self.runs, self.usage, self.makespan, self.grows, self.shrinks)
