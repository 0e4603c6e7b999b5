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

import heapq
import math
from collections.abc import Callable, Iterable, Iterator, Mapping

import attrs
from attrs import frozen

Placement = tuple[tuple[str, int], ...]


@frozen
class PendingJob:
    """A job waiting to start. ``duration`` is what the scheduler plans with (the
    estimate, else the runtime); ``None`` means unbounded. ``max_tasks`` is the most
    tasks it starts with.

    ``duration_at``, when given, is the planned duration as a function of the start
    size (a malleable job with a work-based run time runs longer when it starts
    smaller); it then replaces ``duration`` for the backfill test and the planned end.

    ``fill_to``, when above ``max_tasks``: if the pass ends with no job waiting, slots
    left over are added to the job's start, up to ``fill_to`` tasks (a moldable start
    ``-n min,max`` that prefers a size while others wait, and takes more only when
    nobody else can use them).
    """

    id: str
    user: str
    min_tasks: int
    max_tasks: int
    ptile: int | None
    duration: float | None
    duration_at: Callable[[int], float | None] | None = None
    fill_to: int | None = None

    def duration_for(self, size: int) -> float | None:
        """The planned duration when started with ``size`` tasks."""
        return self.duration if self.duration_at is None else self.duration_at(size)


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
    """The pass's starts and the head's reservation; ``free`` is the pass's view of
    the free slots after its starts (the hosts it was given, in the same form)."""

    starts: tuple[Start, ...]
    reservation: Reservation | None
    free: Mapping[str, int] | None = None


def _end_key(r: RunningJob) -> float:
    return r.end if r.end is not None else math.inf


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
    now: float,
    job: PendingJob,
    free: Mapping[str, int],
    running: Iterable[RunningJob],
    order: Mapping[str, int] | None = None,
    *,
    presorted: bool = False,
) -> Reservation:
    """The head's shadow time and extra slots (see the module docstring).

    ``free`` lists every host (``order`` ``None``), or with ``order`` (host -> its
    position in host order) only some of them, typically those with free slots: hosts
    that running jobs release are then added, and the placement at the shadow time
    still fills hosts in host order. ``extra`` then lists only the hosts seen.
    ``presorted``: ``running`` comes ordered by ``end`` (unbounded jobs left out), so
    it is read in order and only as far as needed.
    """
    avail = dict(free)
    total = sum(avail.values())
    groups: Iterable[tuple[float, list[RunningJob]]]
    if presorted:
        groups = _groups(now, running)
    else:
        by_end: dict[float, list[RunningJob]] = {}
        for r in running:
            if r.end is not None:
                by_end.setdefault(max(now, r.end), []).append(r)
        groups = ((end, by_end[end]) for end in sorted(by_end))
    added = False
    for end, group in groups:
        for r in group:
            if order is None:
                _add(avail, r.hosts)
                total += sum(n for h, n in r.hosts.items() if h in avail)
                continue
            for host, n in r.hosts.items():
                if host in avail:
                    avail[host] += n
                elif host in order:
                    avail[host] = n
                    added = True
                else:
                    continue  # a host the cluster no longer has
                total += n
        if total < job.min_tasks:
            continue
        if added and order is not None:
            avail = {h: avail[h] for h in sorted(avail, key=order.__getitem__)}
            added = False
        placed = place(avail, job.min_tasks, job.min_tasks, job.ptile)
        if placed is not None:
            extra = dict(avail)
            _add(extra, dict(placed), -1)
            return Reservation(job.id, end, extra)
    return Reservation(job.id, math.inf, dict.fromkeys(free, 0))


def _groups(now: float, running: Iterable[RunningJob]) -> Iterator[tuple[float, list[RunningJob]]]:
    """Running jobs ordered by end, grouped by the instant they release (an overdue
    job releases now)."""
    group: list[RunningJob] = []
    at = -math.inf
    for r in running:
        end = r.end
        if end is None:
            continue
        t = end if end > now else now
        if t != at and group:
            yield at, group
            group = []
        at = t
        group.append(r)
    if group:
        yield at, group


def easy_pass(
    now: float,
    pending: Iterable[PendingJob],
    running: Iterable[RunningJob],
    free: Mapping[str, int],
    headroom: Callable[[str], int | None],
    order: Mapping[str, int] | None = None,
    *,
    presorted: bool = False,
    known: Reservation | None = None,
) -> PassResult:
    """One FCFS + EASY pass; ``pending`` must be in queue order.

    ``headroom(user)`` is the user's slot headroom before this pass; slots taken by
    jobs started in this pass are subtracted here. ``free`` lists every host, or with
    ``order`` (see :func:`reservation_for`) only the hosts with free slots, in host
    order: the pass then costs in proportion to the free hosts, not all hosts.
    ``presorted``: ``running`` is ordered by end, unbounded jobs left out (see
    :func:`reservation_for`); it is then only read as far as the head needs.
    ``known``: the head's reservation from an earlier pass that the caller knows is
    still exact (nothing started, ended or changed since, and no running job reached
    its planned end); used instead of computing it again when the same job turns out
    to be the head before anything started in this pass.
    """
    state = _Pass(now, free, headroom)
    jobs = iter(pending)  # one queue for both phases: backfill goes on after the head
    head = _start_in_order(state, jobs)
    if head is None:
        if state.total > 0:
            _fill_leftovers(state)  # nobody waits
        return PassResult(tuple(state.starts), None, state.avail)
    if known is not None and known.job_id == head.id and not state.starts:
        reservation = known
    else:
        if presorted:
            # Merge this pass's starts (few) into the sorted running jobs.
            ends = sorted((r for r in state.started if r.end is not None), key=_end_key)
            both: Iterable[RunningJob] = heapq.merge(running, ends, key=_end_key)
        else:
            both = [*running, *state.started]
        reservation = reservation_for(now, head, state.avail, both, order, presorted=presorted)
    reservation = _backfill(state, jobs, reservation)
    return PassResult(tuple(state.starts), reservation, state.avail)


class _Pass:
    """What one pass has done so far: the free slots left (``avail``, ``total``), the
    slots each user took, the starts (and the moldable ones that may take more)."""

    __slots__ = ("avail", "fillable", "headroom", "now", "started", "starts", "taken", "total")

    def __init__(
        self, now: float, free: Mapping[str, int], headroom: Callable[[str], int | None]
    ) -> None:
        self.now = now
        self.headroom = headroom
        self.avail = dict(free)
        self.total = sum(self.avail.values())
        self.taken: dict[str, int] = {}
        self.starts: list[Start] = []
        self.started: list[RunningJob] = []
        self.fillable: list[tuple[int, PendingJob]] = []

    def room(self, user: str) -> int | None:
        """The user's headroom left, ``None`` for no limit."""
        h = self.headroom(user)
        return None if h is None else h - self.taken.get(user, 0)

    def start(self, job: PendingJob, placed: Placement, backfilled: bool) -> None:
        if job.fill_to is not None and job.fill_to > job.max_tasks:
            self.fillable.append((len(self.starts), job))
        self.starts.append(Start(job.id, placed, backfilled))
        avail = self.avail
        n = 0
        for host, count in placed:
            avail[host] -= count
            n += count
        self.total -= n
        self.taken[job.user] = self.taken.get(job.user, 0) + n
        duration = job.duration_for(n)
        end = None if duration is None else self.now + duration
        self.started.append(RunningJob(job.id, end, dict(placed)))


def _start_in_order(state: _Pass, jobs: Iterator[PendingJob]) -> PendingJob | None:
    """Start jobs in queue order while they fit; the first that does not is the head
    (returned, ``None`` when every job started or was skipped)."""
    avail = state.avail
    for job in jobs:
        r = state.room(job.user)
        if r is not None and r < job.min_tasks:
            continue  # blocked by its user's limit only: does not hold the queue
        if state.total >= job.min_tasks:
            placed = place(avail, job.min_tasks, job.max_tasks, job.ptile, r)
            if placed is not None:
                state.start(job, placed, False)
                continue
        return job
    return None


def _backfill(state: _Pass, jobs: Iterator[PendingJob], reservation: Reservation) -> Reservation:
    """Backfill the jobs behind the head (see the module docstring); returns the
    reservation, its extra slots less those that backfilled jobs took."""
    now = state.now
    avail = state.avail
    total = state.total
    # Slots a job running past the shadow time may use: min(free now, extra), per host,
    # kept up to date as jobs start (a full recomputation per candidate is too slow
    # for long queues).
    extra = reservation.extra
    capped = {h: min(n, extra.get(h, 0)) for h, n in avail.items() if n}
    capped_total = sum(capped.values())
    headroom, taken = state.headroom, state.taken
    for job in jobs:
        if total <= 0:
            break  # nothing can start or backfill any more
        if total < job.min_tasks:
            continue  # cheap test first: long queues mostly fail here
        h = headroom(job.user)  # state.room(), inline: this loop is the hot path
        r = None if h is None else h - taken.get(job.user, 0)
        if r is not None and r < job.min_tasks:
            continue  # blocked by its user's limit only: does not hold the queue
        placed = None
        if job.duration_at is None:
            if job.duration is not None and now + job.duration <= reservation.shadow:
                placed = place(avail, job.min_tasks, job.max_tasks, job.ptile, r)
        else:
            # The largest start is the fastest: if it does not end by the shadow time,
            # no smaller one does.
            placed = place(avail, job.min_tasks, job.max_tasks, job.ptile, r)
            if placed is not None:
                d = job.duration_at(sum(n for _, n in placed))
                if d is None or now + d > reservation.shadow:
                    placed = None
        if placed is None and capped_total >= job.min_tasks:
            placed = place(capped, job.min_tasks, job.max_tasks, job.ptile, r)
            if placed is not None:
                extra = dict(reservation.extra)
                _add(extra, dict(placed), -1)
                reservation = Reservation(reservation.job_id, reservation.shadow, extra)
        if placed is not None:
            state.start(job, placed, True)
            total = state.total
            extra = reservation.extra
            for host, _ in placed:
                new = min(avail[host], extra.get(host, 0))
                capped_total += new - capped[host]
                capped[host] = new
    return reservation


def _fill_leftovers(state: _Pass) -> None:
    """Give the slots left to this pass's moldable starts, up to their ``fill_to``."""
    avail = state.avail
    for index, job in state.fillable:
        if state.total <= 0:
            break
        placed = state.starts[index].placement
        have = sum(n for _, n in placed)
        want = job.fill_to - have if job.fill_to is not None else 0
        r = state.room(job.user)
        if r is not None:
            want = min(want, r)
        if want <= 0:
            continue
        per_host = dict(placed)
        for host, n in avail.items():
            take = min(n, want)
            if job.ptile is not None:
                take = min(take, job.ptile - per_host.get(host, 0))
            if take <= 0:
                continue
            per_host[host] = per_host.get(host, 0) + take
            avail[host] -= take
            want -= take
            state.total -= take
            state.taken[job.user] = state.taken.get(job.user, 0) + take
            if want <= 0:
                break
        state.starts[index] = attrs.evolve(state.starts[index], placement=tuple(per_host.items()))
