"""Job starts: FCFS with EASY backfilling, the usual baseline of scheduling papers.

One pass (:func:`easy_pass`) looks at the pending jobs in queue order (submit time, then
job id) against the free slots of this instant:

- While no job has been blocked, each job starts as soon as its ``min_tasks`` fit. A
  moldable job (``-n min,max``) takes as many tasks as fit, up to ``max_tasks``. Hosts
  are filled in host order, at most ``ptile`` tasks of the job per host, and never
  beyond the user's slot headroom.
- The first job that cannot start becomes the *head* and gets a reservation: running
  jobs are released in order of their expected end (start + the user's estimate, else
  the runtime) until the head's ``min_tasks`` fit; that instant is the *shadow time*,
  and the slots left over on each host at the shadow time, after placing the head,
  are the *extra* slots.
- Every later job that fits now is backfilled if it is expected to end by the shadow
  time, or if it fits in the extra slots (then the extra slots shrink). Either way the
  head does not start later than its shadow time.

Simplifications, stated here because comparisons depend on them:

- The reservation is per host (the head's placement at the shadow time is computed on
  the per-host free slots then), which is stricter than the textbook reservation on
  total counts, but the shadow time ignores per-user limits and grows that have not
  been placed yet.
- The head's reservation is for its ``min_tasks`` (a moldable head may start larger).
- A job blocked only by its user's slot limit does not hold the queue (as in LSF): it
  is skipped without a reservation.
- Running jobs without a known end (no runtime and no estimate) never free slots for
  the shadow computation; if the head cannot fit until one of them ends, the shadow
  time is infinite, nothing gets extra slots and only jobs with a finite duration are
  backfilled.
- Backfilled jobs are expected to end when the estimate says; if the estimate is short
  of the real runtime the head can be delayed, as with real EASY.

Pure functions over plain values: the controller turns its records into
:class:`PendingJob` / :class:`RunningJob` and applies the :class:`Start` results.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from attrs import frozen

Placement = tuple[tuple[str, int], ...]


@frozen
class PendingJob:
    """A job waiting to start. ``duration`` is what the scheduler plans with (the
    estimate, else the runtime); ``None`` means unbounded."""

    id: str
    user: str
    min_tasks: int
    max_tasks: int
    ptile: int | None
    duration: float | None


@frozen
class RunningJob:
    """A job holding slots: its expected end (``None``: unknown) and slots per host."""

    id: str
    end: float | None
    hosts: Mapping[str, int]


@frozen
class Start:
    """Start ``job_id`` with ``placement`` (host, tasks) pairs in allocation order."""

    job_id: str
    placement: Placement
    backfilled: bool = False


@frozen
class Reservation:
    """The head's reservation: start no later than ``shadow``; ``extra`` slots per host
    are not needed by the head at the shadow time."""

    job_id: str
    shadow: float
    extra: Mapping[str, int]


@frozen
class PassResult:
    starts: tuple[Start, ...]
    reservation: Reservation | None


def place(
    free: Mapping[str, int],
    min_tasks: int,
    max_tasks: int,
    ptile: int | None,
    headroom: int | None = None,
) -> Placement | None:
    """Greedy placement in host order: as many tasks as fit up to ``max_tasks``, at
    most ``ptile`` per host and ``headroom`` in all; ``None`` if fewer than
    ``min_tasks`` fit."""
    cap = max_tasks if headroom is None else min(max_tasks, headroom)
    if cap < min_tasks or cap <= 0:
        return None
    out: list[tuple[str, int]] = []
    total = 0
    for host, n in free.items():
        take = min(n, cap - total)
        if ptile is not None:
            take = min(take, ptile)
        if take > 0:
            out.append((host, take))
            total += take
            if total >= cap:
                break
    return tuple(out) if total >= min_tasks else None


def can_ever_fit(
    hosts: Mapping[str, int], min_tasks: int, ptile: int | None, limit: int | None
) -> bool:
    """Whether the job could start on the empty cluster (else it would pend forever)."""
    if limit is not None and limit < min_tasks:
        return False
    return place(hosts, min_tasks, min_tasks, ptile) is not None


def _add(target: dict[str, int], hosts: Mapping[str, int], sign: int = 1) -> None:
    for host, n in hosts.items():
        if host in target:
            target[host] += sign * n


def reservation_for(
    now: float, job: PendingJob, free: Mapping[str, int], running: Iterable[RunningJob]
) -> Reservation:
    """The head's shadow time and extra slots (see the module docstring)."""
    avail = dict(free)
    total = sum(avail.values())
    by_end: dict[float, list[RunningJob]] = {}
    for r in running:
        if r.end is not None:
            by_end.setdefault(max(now, r.end), []).append(r)
    for end in sorted(by_end):
        for r in by_end[end]:
            _add(avail, r.hosts)
            total += sum(n for h, n in r.hosts.items() if h in avail)
        if total < job.min_tasks:
            continue
        placed = place(avail, job.min_tasks, job.min_tasks, job.ptile)
        if placed is not None:
            extra = dict(avail)
            _add(extra, dict(placed), -1)
            return Reservation(job.id, end, extra)
    return Reservation(job.id, math.inf, dict.fromkeys(free, 0))


def easy_pass(
    now: float,
    pending: Sequence[PendingJob],
    running: Iterable[RunningJob],
    free: Mapping[str, int],
    headroom: Callable[[str], int | None],
) -> PassResult:
    """One FCFS + EASY pass; ``pending`` must be in queue order.

    ``headroom(user)`` is the user's slot headroom before this pass; slots taken by
    jobs started in this pass are subtracted here.
    """
    avail = dict(free)
    total = sum(avail.values())
    started: list[RunningJob] = []
    taken: dict[str, int] = {}
    starts: list[Start] = []
    reservation: Reservation | None = None
    # Slots a job running past the shadow time may use: min(free now, extra), per host,
    # kept up to date as jobs start (a full recomputation per candidate is too slow
    # for long queues).
    capped: dict[str, int] = {}
    capped_total = 0

    def room(user: str) -> int | None:
        h = headroom(user)
        return None if h is None else h - taken.get(user, 0)

    def start(job: PendingJob, placed: Placement, backfilled: bool) -> None:
        nonlocal total, capped_total
        starts.append(Start(job.id, placed, backfilled))
        n = 0
        for host, count in placed:
            avail[host] -= count
            n += count
            if reservation is not None:
                new = min(avail[host], reservation.extra.get(host, 0))
                capped_total += new - capped[host]
                capped[host] = new
        total -= n
        taken[job.user] = taken.get(job.user, 0) + n
        end = None if job.duration is None else now + job.duration
        started.append(RunningJob(job.id, end, dict(placed)))

    for job in pending:
        if total <= 0 and reservation is not None:
            break  # nothing can start or backfill any more
        if reservation is not None and total < job.min_tasks:
            continue  # cheap test first: long queues mostly fail here
        r = room(job.user)
        if r is not None and r < job.min_tasks:
            continue  # blocked by its user's limit only: does not hold the queue
        if reservation is None:
            if total >= job.min_tasks:
                placed = place(avail, job.min_tasks, job.max_tasks, job.ptile, r)
                if placed is not None:
                    start(job, placed, False)
                    continue
            reservation = reservation_for(now, job, avail, [*running, *started])
            capped = {h: min(n, reservation.extra.get(h, 0)) for h, n in avail.items()}
            capped_total = sum(capped.values())
            continue
        placed = None
        if job.duration is not None and now + job.duration <= reservation.shadow:
            placed = place(avail, job.min_tasks, job.max_tasks, job.ptile, r)
        if placed is None and capped_total >= job.min_tasks:
            placed = place(capped, job.min_tasks, job.max_tasks, job.ptile, r)
            if placed is not None:
                extra = dict(reservation.extra)
                _add(extra, dict(placed), -1)
                reservation = Reservation(reservation.job_id, reservation.shadow, extra)
        if placed is not None:
            start(job, placed, True)
    return PassResult(tuple(starts), reservation)
