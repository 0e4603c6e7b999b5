"""Correctness checks of a simulated run: a run that breaks one of them fails.

Each check is an :class:`~.observer.Observer` that rebuilds what it verifies from the
controller's reports (job starts, committed allocations, job ends) with its own,
simpler bookkeeping, so a bug in the controller, the scheduler, the plugin or a work
model shows up as a disagreement rather than being trusted:

- :class:`CompletionCheck`: every job of the trace is accepted and ends, as DONE.
- :class:`LedgerCheck`: no host ever holds more tasks than it has slots, and the
  cluster never more than its capacity (so utilization cannot exceed 1); counted from
  the committed allocations, independently of the controller's ledger (which refuses
  an overbooking itself). :func:`check_utilization` checks the reported figure.
- :class:`WorkCheck`: each job does exactly its work. A rigid job runs exactly its run
  time; a work-based job's committed sizes, integrated over its life under the
  speedup model with the reconfiguration cost after each size change, add up to
  exactly one whole job at its end (relative tolerance 1e-6).
- :class:`EasyCheck` (the rigid baseline): a job that starts while an earlier job
  waits must be a legal EASY backfill: the first waiting job (the head) could not
  start, and the backfilled job either is expected to end by the head's shadow time
  or leaves the head enough slots at that time. The shadow time is recomputed here
  from the running jobs' expected ends (start + estimate, or now if overdue), on slot
  counts (hosts are interchangeable for jobs without span rules, which is all a trace
  has).

Problems are kept as sentences in ``problems`` (at most :data:`MAX_PROBLEMS` each).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from operator import add, attrgetter, le, not_
from typing import cast

from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.jobs import job_id_key
from xce_resize_plugin.controllers.lazy import TaskList
from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.controllers.placement_runs import Placement
from xce_resize_plugin.core.models import JobState, Task
from xce_resize_plugin.simulation.malleable import SpeedupModel

_host_of = attrgetter("host")
_id_of = attrgetter("id")
#: From this many tasks on, a start or an end is counted per host in C (a loop below).
_BULK = 24

__all__ = [
    "MAX_PROBLEMS",
    "Check",
    "CompletionCheck",
    "EasyCheck",
    "LedgerCheck",
    "WorkCheck",
    "check_utilization",
    "work_done",
]

#: Problems kept per check (a broken run would otherwise report every job).
MAX_PROBLEMS = 20


class Check(Observer):
    """Base: a name and the problems found."""

    name = "check"

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.count = 0

    def problem(self, text: str) -> None:
        self.count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def finish(self) -> list[str]:
        """End of run: final checks; return the problems (with an overflow note)."""
        out = list(self.problems)
        if self.count > len(out):
            out.append(f"... and {self.count - len(out)} more {self.name} problem(s)")
        return out


class CompletionCheck(Check):
    """Every expected job is accepted and ends as DONE (or, with ``allow_host_failure``,
    EXIT because a host failure ended it)."""

    name = "completion"

    def __init__(self, allow_host_failure: bool = False) -> None:
        super().__init__()
        self.allow_host_failure = allow_host_failure
        self._open: set[str] = set()
        self.expected = 0
        self.ended = 0

    def add_job(self, job_id: str) -> None:
        self._open.add(job_id)
        self.expected += 1

    def job_ended(self, job: FinishedJob) -> None:
        self.ended += 1
        if job.id not in self._open:
            self.problem(f"job {job.id} ended but was never expected (or ended twice)")
            return
        self._open.discard(job.id)
        failed = self.allow_host_failure and job.exit_reason == HOST_FAILURE
        if job.state is not JobState.DONE and not failed:
            self.problem(f"job {job.id} ended {job.state.value} ({job.exit_reason}), not DONE")
        if job.start_time is None:
            self.problem(f"job {job.id} ended without ever starting")

    def rejected(self, rejections: Iterable[tuple[float, str, str]]) -> None:
        for t, job_id, reason in rejections:
            self.problem(f"job {job_id} was refused at t={t:g}: {reason}")

    def finish(self) -> list[str]:
        if self._open:
            first = sorted(self._open, key=job_id_key)[:5]
            self.problem(
                f"{len(self._open)} of {self.expected} job(s) never ended: "
                + ", ".join(first)
                + (" ..." if len(self._open) > 5 else "")
            )
        return super().finish()


class LedgerCheck(Check):
    """No host over its slots, the cluster never over its capacity (see the module
    docstring)."""

    name = "ledger"

    def __init__(self, hosts: Mapping[str, int]) -> None:
        super().__init__()
        self.slots = dict(hosts)
        self.capacity = sum(self.slots.values())
        # Tasks held per host position (host order), so that a job started as runs of
        # hosts (a placement of the scheduler) is counted a run at a time.
        self._names = tuple(self.slots)
        self._pos = {h: i for i, h in enumerate(self._names)}
        self._cap = list(self.slots.values())
        self._used = [0] * len(self._cap)
        self._alike = self._cap[0] if len(set(self._cap)) == 1 else None
        self._same_names: Sequence[str] | None = None  # a host tuple found equal to ours
        self.total = 0
        self.peak = 0
        self._alloc: dict[str, Sequence[Task]] = {}

    def used(self, host: str) -> int:
        """Tasks held on ``host`` as this check counted them."""
        return self._used[self._pos[host]]

    def _add(self, job_id: str, time: float, tasks: Iterable[Task], sign: int) -> None:
        if isinstance(tasks, TaskList) and self._add_runs(tasks.placement, sign):
            self._peak(time)
            return
        used, slots, pos = self._used, self._cap, self._pos
        tasks = tasks if isinstance(tasks, tuple) else tuple(tasks)
        per_host = Counter(map(_host_of, tasks)) if len(tasks) >= _BULK else {}
        idx = list(map(pos.get, per_host))
        if idx and None not in idx:
            # Counted per host in C; a problem is looked for task by task below.
            at = cast("list[int]", idx)  # no None in it
            counts = map(sign.__mul__, per_host.values())
            after = list(map(add, map(used.__getitem__, at), counts))
            if sign < 0 or all(map(le, after, map(slots.__getitem__, at))):
                deque(map(used.__setitem__, at, after), maxlen=0)  # used[i] = n, in C
                self.total += sign * len(tasks)
                self._peak(time)
                return
        for task in tasks:
            host = task.host
            i = pos.get(host)
            if i is None:
                self.problem(f"t={time:g}: job {job_id} task {task.id} on unknown host {host}")
                continue
            n = used[i] = used[i] + sign
            self.total += sign
            if sign > 0 and n > slots[i]:
                self.problem(
                    f"t={time:g}: host {host} holds {n} tasks, only {slots[i]} slots "
                    f"(job {job_id} task {task.id})"
                )
        self._peak(time)

    def _add_runs(self, placement: Placement, sign: int) -> bool:
        """Count a placement's runs of alike hosts (same slots, same tasks held) a run
        at a time; ``False``, counting nothing, when a run is not so or goes over its
        slots (then the tasks are counted one by one, naming the host)."""
        names, runs = placement.names, placement.runs
        if names is None or runs is None:
            return False
        if names is not self._same_names:
            if tuple(names) != self._names:
                return False
            self._same_names = names
        used, cap, alike = self._used, self._cap, self._alike
        plan = []
        for first, n, take in runs:
            u = used[first : first + n]
            if u.count(u[0]) != n:
                return False
            if alike is None:
                c = cap[first : first + n]
                if c.count(c[0]) != n:
                    return False
            after = u[0] + sign * take
            if sign > 0 and after > (cap[first] if alike is None else alike):
                return False
            plan.append((first, n, after))
        for first, n, after in plan:
            used[first : first + n] = [after] * n
        self.total += sign * placement.total
        return True

    def _peak(self, time: float) -> None:
        if self.total > self.peak:
            self.peak = self.total
            if self.total > self.capacity:
                self.problem(f"t={time:g}: {self.total} tasks held, capacity {self.capacity}")

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        if job_id in self._alloc:
            self.problem(f"t={time:g}: job {job_id} started twice")
        self._alloc[job_id] = tasks
        self._add(job_id, time, tasks, 1)

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        old = self._alloc.get(job_id)
        if old is None:
            self.problem(f"t={time:g}: job {job_id} committed an allocation without running")
            return
        self._alloc[job_id] = tasks
        if self._shrunk_as_runs(time, old, tasks):
            return
        # Task ids are never reused within a job, so ids say which tasks are which
        # (and hash much faster than the tasks themselves; in C: a shrink of a job of
        # many hosts commits tens of thousands of tasks).
        old_ids, new_ids = list(map(_id_of, old)), list(map(_id_of, tasks))
        before, after = set(old_ids), set(new_ids)
        # Released tasks first: a shrink frees its slots before anything else commits.
        self._add(job_id, time, compress(old, map(not_, map(after.__contains__, old_ids))), -1)
        self._add(job_id, time, compress(tasks, map(not_, map(before.__contains__, new_ids))), 1)

    def _shrunk_as_runs(self, time: float, old: Sequence[Task], new: Sequence[Task]) -> bool:
        """A commit that keeps the first tasks of a job held as runs (a shrink by its
        newest tasks), counted a run at a time: the runs it no longer holds are
        released. ``False``, counting nothing, for any other commit."""
        if not (isinstance(old, TaskList) and isinstance(new, TaskList)):
            return False
        before, after = old.placement, new.placement
        if old.start or new.start or before.runs is None or after.runs is None:
            return False
        if before.names is not after.names or not 0 < after.total < before.total:
            return False
        kept, gone = before.split(after.total)
        if kept.runs != after.runs:
            return False
        assert before.names is not None
        if not self._add_runs(Placement.of_runs(before.names, gone), -1):
            return False
        self._peak(time)
        return True

    def job_requeued(self, job_id: str, time: float) -> None:
        tasks = self._alloc.pop(job_id, None)
        if tasks is not None:
            self._add(job_id, time, tasks, -1)

    def job_ended(self, job: FinishedJob) -> None:
        tasks = self._alloc.pop(job.id, None)
        if tasks is not None:
            self._add(job.id, job.end_time, tasks, -1)

    def finish(self) -> list[str]:
        if self._alloc:
            self.problem(f"{len(self._alloc)} job(s) still hold slots at the end")
        return super().finish()


def check_utilization(utilization: float, peak: int, capacity: int) -> list[str]:
    """The reported utilization and the peak usage against the capacity."""
    problems = []
    if not 0.0 <= utilization <= 1.0 + 1e-12:
        problems.append(f"utilization {utilization!r} is outside [0, 1]")
    if peak > capacity:
        problems.append(f"peak usage {peak} exceeds the capacity {capacity}")
    return problems


def work_done(
    model: SpeedupModel,
    runtime: float,
    ref_procs: int,
    versions: Iterable[tuple[float, int]],
    end: float,
) -> float:
    """The fraction of a job done by ``end`` when it ran at the committed sizes
    ``versions`` (``(time, size)`` from the start on), with no progress for
    ``model.reconfig_cost`` seconds after each size change (a change during a
    reconfiguration starts it over)."""
    steps = list(versions)
    done = 0.0
    blocked = -math.inf
    prev = None
    for i, (t, size) in enumerate(steps):
        if prev is not None and size != prev:
            blocked = t + model.reconfig_cost
        prev = size
        seg_end = steps[i + 1][0] if i + 1 < len(steps) else end
        begin = max(t, blocked)
        if seg_end > begin:
            done += (seg_end - begin) / model.time_for(runtime, ref_procs, size)
    return done


class WorkCheck(Check):
    """Each job does exactly its work (see the module docstring)."""

    name = "work"

    def __init__(self, model: SpeedupModel, tolerance: float = 1e-6) -> None:
        super().__init__()
        self.model = model
        self.tolerance = tolerance
        self._jobs: dict[str, tuple[float, int, bool]] = {}

    def add_job(self, job_id: str, runtime: float, ref_procs: int, work_based: bool) -> None:
        self._jobs[job_id] = (runtime, ref_procs, work_based)

    def job_ended(self, job: FinishedJob) -> None:
        spec = self._jobs.pop(job.id, None)
        if spec is None or job.start_time is None or job.state is not JobState.DONE:
            return  # CompletionCheck reports those
        runtime, ref, work_based = spec
        if not work_based:
            ran = job.end_time - job.start_time
            if abs(ran - runtime) > self.tolerance * max(1.0, runtime):
                self.problem(f"job {job.id} ran {ran!r} s, its run time is {runtime!r} s")
            if len(job.versions) > 1:
                self.problem(f"rigid job {job.id} was resized {len(job.versions) - 1} time(s)")
            return
        steps = [(v.time, len(v.tasks)) for v in job.versions]
        done = work_done(self.model, runtime, ref, steps, job.end_time)
        if abs(done - 1.0) > self.tolerance:
            sizes = " ".join(f"{n}@{t:g}" for t, n in steps[:8])
            self.problem(
                f"job {job.id} did {done!r} of its work by its end at {job.end_time:g} "
                f"(sizes {sizes}{' ...' if len(steps) > 8 else ''})"
            )


class EasyCheck(Check):
    """FCFS order, except for legal EASY backfills (see the module docstring)."""

    name = "easy"

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.free = capacity
        self.backfilled = 0
        self._info: dict[str, tuple[int, float]] = {}  # id -> (size, estimate)
        self._queue: list[tuple[float, tuple[int, int, str], str]] = []
        self._waiting: set[str] = set()
        self._ends: list[tuple[float, str]] = []  # running jobs by expected end
        self._running: dict[str, tuple[float, int]] = {}  # id -> (expected end, size)

    def add_job(self, job_id: str, submit: float, size: int, estimate: float) -> None:
        self._info[job_id] = (size, estimate)
        heapq.heappush(self._queue, (submit, job_id_key(job_id), job_id))
        self._waiting.add(job_id)

    def _head(self) -> str | None:
        queue, waiting = self._queue, self._waiting
        while queue and queue[0][2] not in waiting:
            heapq.heappop(queue)
        return queue[0][2] if queue else None

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        size = len(tasks)
        info = self._info.pop(job_id, None)
        if info is None:
            self.problem(f"t={time:g}: job {job_id} started but was never queued")
            return
        head = self._head()
        if head is not None and head != job_id:
            self.backfilled += 1
            self._check_backfill(head, job_id, time, size, info[1])
        self._waiting.discard(job_id)
        end = time + info[1]
        bisect.insort(self._ends, (end, job_id))
        self._running[job_id] = (end, size)
        self.free -= size

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        end, size = self._running[job_id]
        self.free -= len(tasks) - size
        self._running[job_id] = (end, len(tasks))

    def job_ended(self, job: FinishedJob) -> None:
        running = self._running.pop(job.id, None)
        if running is None:
            return
        end, size = running
        i = bisect.bisect_left(self._ends, (end, job.id))
        del self._ends[i]
        self.free += size

    def _shadow(self, now: float, need: int) -> tuple[float, int]:
        """The head's shadow time and the slots free then (releases at max(now, end),
        grouped by instant, as EASY computes them)."""
        avail = self.free
        if avail >= need:
            return now, avail
        ends, running = self._ends, self._running
        i, n = 0, len(ends)
        while i < n:
            t = max(now, ends[i][0])
            while i < n and max(now, ends[i][0]) == t:
                avail += running[ends[i][1]][1]
                i += 1
            if avail >= need:
                return t, avail
        return math.inf, avail

    def _check_backfill(self, head: str, job_id: str, now: float, size: int, est: float) -> None:
        need = self._info[head][0]
        if self.free >= need:
            self.problem(
                f"t={now:g}: job {job_id} started before job {head}, which was first in "
                f"the queue and fit ({self.free} free, it needs {need})"
            )
            return
        shadow, avail = self._shadow(now, need)
        if now + est <= shadow:
            return  # ends by the head's reserved start
        if avail - size < need:
            self.problem(
                f"t={now:g}: job {job_id} ({size} tasks, expected to end at {now + est:g}) "
                f"was backfilled past the shadow time {shadow:g} of job {head} and leaves "
                f"it {avail - size} of the {need} slots it needs then"
            )
