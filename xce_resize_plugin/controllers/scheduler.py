"""Job starts: FCFS with EASY backfilling, the usual baseline of scheduling papers.

For rigid jobs without span rules this is textbook EASY (Lifka 1995; Mu'alem and
Feitelson 2001) on processor counts, whatever the hosts look like; docs/simulation.md
states the rules and tests/easy_reference.py is the reference the tests compare with.
One pass (:func:`easy_pass`) looks at the pending jobs in queue order (submit time,
then job id) against the free slots of this instant:

- While no job has been blocked, each job starts as soon as its ``min_tasks`` fit. A
  moldable job (``-n min,max``) takes as many tasks as fit, up to ``max_tasks``, never
  beyond the user's slot headroom.
- The first job that cannot start becomes the *head* and gets a reservation: running
  jobs are released in order of their expected end (start + the user's estimate, else
  the runtime; a job past it releases now; all jobs ending at one instant together)
  until the head's ``min_tasks`` fit; that instant is the *shadow time*, and the free
  slots then minus the head's are the *extra* slots.
- Every later job that fits now is backfilled if it is expected to end by the shadow
  time, or if it fits in the extra slots (which then shrink). Either way the head does
  not start later than its shadow time.

Everything is decided on counts (:class:`~.slots.FreeSlots`: free slots in all, and
per class of hosts with the same free slots); concrete hosts are chosen only for a job
that starts: the first hosts with free slots in host order, at most ``ptile`` tasks of
the job per host. A pass therefore costs in proportion to the queue it reads and the
hosts of the jobs it starts, not to the number of hosts.

Span rules (``ptile``) need more than a count: a job with ``ptile`` p fits when
the hosts' free slots, each counted up to p, add up to its ``min_tasks`` (a sum over
the classes). For a head with ``ptile`` the reservation keeps the free slots per host
at the shadow time: a job running past the shadow time is backfilled only if, placed
as it would be now, the head still fits then; extra slots are the slots beyond what the
head can use, so hosts matter there and only there. What that costs: the shadow time is
still found on the classes; the pass copies the per-host counts once (a block copy,
when the first running job's slots are given back to the head's draft),
a backfill tried against the head reads only the job's hosts
(:meth:`~.slots.FreeSlots.capacity_after`), and the slots beyond the head's ``ptile``
per host (``Reservation.excess``, for grows) are listed host by host only when some
host has more than ``ptile`` free slots then (the classes tell).

Simplifications, stated here because comparisons depend on them:

- The shadow time ignores per-user limits and grows that have not been placed yet.
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial

import attrs
from attrs import frozen

from xce_resize_plugin.controllers.lazy import Unfolded
from xce_resize_plugin.controllers.pending_queue import BLOCK, PendingQueue
from xce_resize_plugin.controllers.placement_runs import Placement, Run
from xce_resize_plugin.controllers.slots import FreeSlots

__all__ = [
    "PassResult",
    "PendingJob",
    "Placement",
    "Reservation",
    "RunningJob",
    "Start",
    "easy_pass",
    "empty_capacity",
    "reservation_for",
]


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
    """A job holding slots: its expected end (``None``: unknown) and slots per host
    (read when the job is released in a shadow computation, so it may be live).
    ``count``, when given, answers the job's slots in all (live, in O(1)), so that a
    head without ``ptile`` is reserved for without reading the job's hosts."""

    id: str
    end: float | None
    hosts: Mapping[str, int]
    count: Callable[[], int] | None = None

    def slots(self) -> int:
        """Slots the job holds in all."""
        return self.count() if self.count is not None else sum(self.hosts.values())


@frozen
class Start:
    """Start ``job_id`` with ``placement`` (host, tasks) pairs in allocation order."""

    job_id: str
    placement: Placement
    backfilled: bool = False


@frozen
class Reservation:
    """The head's reservation: start no later than ``shadow``.

    ``extra``: slots a job running past the shadow time may still take without
    delaying the head (after this pass's backfills). For a head with ``ptile``
    (``ptile`` set) it is the slack of the head's fit at the shadow time, and
    ``excess`` lists per host the slots the head could not use there (beyond its
    ``ptile``) with the host's free slots at the pass: taking only those never delays
    the head.
    """

    job_id: str
    shadow: float
    extra: int
    ptile: int | None = None
    excess: Mapping[str, tuple[int, int]] = attrs.field(factory=dict)


@frozen
class PassResult:
    """The pass's starts and the head's reservation."""

    starts: tuple[Start, ...]
    reservation: Reservation | None


def empty_capacity(hosts: Mapping[str, int], ptile: int | None) -> int:
    """How many tasks of a job with at most ``ptile`` per host fit on the empty cluster."""
    if ptile is None:
        return sum(hosts.values())
    return sum(min(n, ptile) for n in hosts.values())


def _groups(now: float, running: Iterable[RunningJob]) -> Iterator[tuple[float, list[RunningJob]]]:
    """Running jobs (ordered by end, unbounded ones left out) grouped by the instant
    they release (an overdue job releases now)."""
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


def reservation_for(
    now: float,
    job: PendingJob,
    free: FreeSlots,
    running: Iterable[RunningJob],
) -> tuple[Reservation, FreeSlots | None]:
    """The head's shadow time and extra slots (see the module docstring), and for a
    head with ``ptile`` the free slots per host at the shadow time.

    ``running`` comes ordered by ``end`` (unbounded jobs may be left out); it is read
    only as far as needed. ``free`` is not changed; for a head with ``ptile`` the
    returned slots are a draft of it with counts of its own (later changes to ``free``
    do not reach them).
    """
    need = job.min_tasks
    if job.ptile is None:
        avail = free.total
        for end, group in _groups(now, running):
            for r in group:
                avail += r.slots()
            if avail >= need:
                return Reservation(job.id, end, avail - need), None
        return Reservation(job.id, math.inf, 0), None
    at_shadow = free.draft()
    for end, group in _groups(now, running):
        for r in group:
            # The first give makes the draft's counts its own (FreeSlots._apply), so
            # what is returned no longer depends on ``free``.
            at_shadow.give(r.hosts.items())
        fit = at_shadow.capacity(job.ptile)
        if fit >= need:
            return Reservation(job.id, end, fit - need, job.ptile), at_shadow
    return Reservation(job.id, math.inf, 0, job.ptile), None


def easy_pass(
    now: float,
    pending: Iterable[PendingJob],
    running: Iterable[RunningJob],
    free: FreeSlots,
    headroom: Callable[[str], int | None],
    *,
    known: Reservation | None = None,
) -> PassResult:
    """One FCFS + EASY pass; ``pending`` must be in queue order, ``running`` ordered
    by end (unbounded jobs may be left out; it is read only as far as the head needs).

    ``free`` is not changed (the pass works on a scratch of it, restored before this
    returns; nothing else may read it meanwhile). ``headroom(user)`` is
    the user's slot headroom before this pass; slots taken by jobs started in this
    pass are subtracted here. ``known``: the head's reservation from an earlier pass
    that the caller knows is still exact (nothing started, ended or changed since, and
    no running job reached its planned end); used instead of computing it again when
    the same job turns out to be the head before anything started in this pass (not
    for a head with ``ptile``, whose reservation needs the hosts).
    """
    state = _Pass(now, free, headroom)
    try:
        return _easy_pass(state, pending, running, known)
    finally:
        state.avail.restore()


def _easy_pass(
    state: _Pass,
    pending: Iterable[PendingJob],
    running: Iterable[RunningJob],
    known: Reservation | None,
) -> PassResult:
    now = state.now
    jobs = iter(pending)  # one queue for both phases: backfill goes on after the head
    head, read = _start_in_order(state, jobs)
    if head is None:
        if state.avail.total > 0:
            _fill_leftovers(state)  # nobody waits
        return PassResult(tuple(state.starts), None)
    at_shadow: FreeSlots | None = None
    if known is not None and known.job_id == head.id and not state.starts and head.ptile is None:
        reservation = known
    else:
        # The jobs started in this pass (few) merged into the running ones by end.
        started = sorted((r for r in state.started if r.end is not None), key=_end_of)
        both = _merge(running, started)
        if head.ptile is None:
            reservation, _ = reservation_for(now, head, state.avail, both)
        else:
            # Its slots at the shadow time are a draft of state.avail (the cluster's
            # counts with this pass's starts taken), whose counts become its own at the
            # first running job's slots given back, before it is returned: the
            # backfills, which change state.avail, do not reach it.
            reservation, at_shadow = reservation_for(now, head, state.avail, both)
    behind: Iterator[PendingJob] | tuple[PendingQueue[PendingJob], int] = jobs
    if isinstance(pending, PendingQueue) and len(pending) - read > BLOCK:
        # Deep: read by blocks, skipping those where no job can start.
        behind = (pending, pending.position_after(read))
    reservation = _backfill(state, behind, reservation, at_shadow)
    return PassResult(tuple(state.starts), reservation)


def _end_of(r: RunningJob) -> float:
    return r.end if r.end is not None else math.inf


def _merge(a: Iterable[RunningJob], b: list[RunningJob]) -> Iterator[RunningJob]:
    """``a`` and ``b`` (both ordered by end) merged by end, ``a`` first on ties."""
    if not b:
        yield from a
        return
    i = 0
    for r in a:
        end = _end_of(r)
        while i < len(b) and _end_of(b[i]) < end:
            yield b[i]
            i += 1
        yield r
    yield from b[i:]


class _Pass:
    """What one pass has done so far: the free slots left (``avail``, a draft of the
    cluster's), the slots each user took, the starts (and the moldable ones that may
    take more)."""

    __slots__ = ("avail", "fillable", "headroom", "now", "started", "starts", "taken")

    def __init__(self, now: float, free: FreeSlots, headroom: Callable[[str], int | None]) -> None:
        self.now = now
        self.headroom = headroom
        # Written in place and restored at the pass's end (FreeSlots.scratch): no
        # copy of every host's count per pass.
        self.avail = free.scratch()
        self.taken: dict[str, int] = {}
        self.starts: list[Start] = []
        self.started: list[RunningJob] = []
        self.fillable: list[tuple[int, PendingJob]] = []

    def room(self, user: str) -> int | None:
        """The user's headroom left, ``None`` for no limit."""
        h = self.headroom(user)
        return None if h is None else h - self.taken.get(user, 0)

    def start(self, job: PendingJob, placed: Placement, backfilled: bool) -> int:
        """Record the start; return its size."""
        if job.fill_to is not None and job.fill_to > job.max_tasks:
            self.fillable.append((len(self.starts), job))
        self.starts.append(Start(job.id, placed, backfilled))
        self.avail.take(placed)
        n = placed.total
        self.taken[job.user] = self.taken.get(job.user, 0) + n
        duration = job.duration_for(n)
        end = None if duration is None else self.now + duration
        # Its hosts are read only for a head with ptile: made then.
        hosts: Unfolded[str, int] = Unfolded(partial(dict, placed), placed.host_count())
        self.started.append(RunningJob(job.id, end, hosts, partial(int, n)))
        return n


def _start_in_order(state: _Pass, jobs: Iterator[PendingJob]) -> tuple[PendingJob | None, int]:
    """Start jobs in queue order while they fit; the first that does not is the head
    (returned, ``None`` when every job started or was skipped), with the number of
    jobs read (the head's position + 1)."""
    avail = state.avail
    read = 0
    for job in jobs:
        read += 1
        r = state.room(job.user)
        if r is not None and r < job.min_tasks:
            continue  # blocked by its user's limit only: does not hold the queue
        placed = avail.place(job.min_tasks, job.max_tasks, job.ptile, r)
        if placed is None:
            return job, read
        state.start(job, placed, False)
    return None, read


def _ends_by(state: _Pass, job: PendingJob, r: int | None, shadow: float) -> Placement | None:
    """The job's placement now if it is expected to end by ``shadow``, else ``None``."""
    now = state.now
    if job.duration_at is None:
        if job.duration is None or now + job.duration > shadow:
            return None
        return state.avail.place(job.min_tasks, job.max_tasks, job.ptile, r)
    # The largest start is the fastest: if it does not end by the shadow time, no
    # smaller one does. Its size is known from the counts: the hosts are chosen only
    # for a job that does end in time (most do not, and placing reads hosts).
    avail = state.avail
    n = avail.fit(job.min_tasks, job.max_tasks, job.ptile, r)
    if not n:
        return None
    d = job.duration_at(n)
    if d is None or now + d > shadow:
        return None
    return avail.place(job.min_tasks, job.max_tasks, job.ptile, r)


def _backfill(
    state: _Pass,
    behind: Iterator[PendingJob] | tuple[PendingQueue[PendingJob], int],
    reservation: Reservation,
    at_shadow: FreeSlots | None,
) -> Reservation:
    """Backfill the jobs behind the head (see the module docstring); returns the
    reservation with the extra slots that backfilled jobs left. ``behind``: the jobs,
    or a deep queue and the position after the head's (then read by blocks:
    :meth:`.PendingQueue.behind`)."""
    avail = state.avail
    extra = reservation.extra
    headroom, taken = state.headroom, state.taken
    ptile = reservation.ptile
    # What the head needs at the shadow time (its min_tasks; only used with ptile).
    need = 0 if at_shadow is None else at_shadow.capacity(ptile) - extra
    now, shadow = state.now, reservation.shadow
    if isinstance(behind, tuple):

        def skippable(smallest: int, shortest: float) -> bool:
            # The pre-test below for a whole block (its smallest size and shortest
            # duration; ``extra`` as it is when the block is reached).
            return at_shadow is None and extra < smallest and now + shortest > shadow

        queue, start = behind
        jobs = queue.behind(start, lambda: avail.total, skippable)
    else:
        jobs = behind
    for job in jobs:
        total = avail.total
        if total <= 0:
            break  # nothing can start or backfill any more
        if total < job.min_tasks:
            continue  # cheap test first: long queues mostly fail here
        if (
            at_shadow is None
            and extra < job.min_tasks
            and job.duration_at is None
            and (job.duration is None or now + job.duration > shadow)
        ):
            # Neither ends by the shadow time nor fits in the extra slots: the
            # branches below would place nothing. Decided here without the user's
            # headroom or a placement: in a queue thousands deep (docs/performance.md,
            # RICC) nearly every job behind the head ends here.
            continue
        h = headroom(job.user)  # state.room(), inline: this loop is the hot path
        r = None if h is None else h - taken.get(job.user, 0)
        if r is not None and r < job.min_tasks:
            continue  # blocked by its user's limit only: does not hold the queue
        placed = _ends_by(state, job, r, reservation.shadow)
        if placed is not None:
            pass
        elif at_shadow is not None:
            # Slots beyond the head's ptile on a host are extra too: try every job.
            placed = _fits_past_shadow(state, job, r, ptile, need, at_shadow)
            if placed is not None:
                extra = at_shadow.capacity(ptile) - need
        elif extra >= job.min_tasks:
            cap = extra if r is None else min(r, extra)
            placed = avail.place(job.min_tasks, job.max_tasks, job.ptile, cap)
            if placed is not None:
                extra -= placed.total
        if placed is not None:
            state.start(job, placed, True)
    # Built directly: attrs.evolve looks the class up again at every pass.
    res = reservation
    if at_shadow is None:
        return Reservation(res.job_id, res.shadow, extra, res.ptile, res.excess)
    return Reservation(res.job_id, res.shadow, extra, res.ptile, _excess(state, at_shadow, ptile))


def _fits_past_shadow(
    state: _Pass,
    job: PendingJob,
    r: int | None,
    ptile: int | None,
    need: int,
    at_shadow: FreeSlots,
) -> Placement | None:
    """For a head with ``ptile``: the job's placement now, if the head still fits at
    the shadow time with it (then taken from ``at_shadow``), else ``None``."""
    placed = state.avail.place(job.min_tasks, job.max_tasks, job.ptile, r)
    if placed is None:
        return None
    # Never short: a host has at least as many free slots at the shadow time as now.
    if at_shadow.capacity_after(placed, ptile) < need:
        return None
    at_shadow.take(placed)
    return placed


def _excess(state: _Pass, at_shadow: FreeSlots, ptile: int | None) -> dict[str, tuple[int, int]]:
    """Per host, the slots at the shadow time beyond the head's ``ptile`` and the
    host's free slots after the pass (hosts without such slots left out)."""
    p = ptile or 0
    if at_shadow.most_free() <= p:
        return {}  # read from the classes: on hosts of ptile slots or fewer, none has
    avail = state.avail
    return {h: (n - p, avail.free(h)) for h, n in at_shadow.open_hosts() if n > p}


def _fill_as_runs(state: _Pass, index: int, job: PendingJob, placed: Placement, want: int) -> bool:
    """:func:`_fill_leftovers` of a job without ``ptile`` placed as runs: the slots
    left are placed as runs too (the hosts with free slots in host order, each taken
    whole up to ``want``: what the host-by-host walk takes) and joined to the start's
    runs, when none of them is a host the start has already (else ``False``, for the
    walk, which adds to that host's count). A start on many hosts is then not made
    host by host."""
    avail = state.avail
    if placed.runs is None or placed.names is not avail.names:
        return False
    more = avail.place(1, want, None)
    if more is None or more.runs is None or _overlap(placed.runs, more.runs):
        return False
    avail.take(more)
    state.taken[job.user] = state.taken.get(job.user, 0) + more.total
    placement = Placement.of_runs(placed.names, (*placed.runs, *more.runs))
    state.starts[index] = attrs.evolve(state.starts[index], placement=placement)
    return True


def _overlap(a: Sequence[Run], b: Sequence[Run]) -> bool:
    """Whether two placements' runs (each in host order) share a host."""
    i = j = 0
    while i < len(a) and j < len(b):
        a0, a1 = a[i][0], a[i][0] + a[i][1]
        b0, b1 = b[j][0], b[j][0] + b[j][1]
        if a0 < b1 and b0 < a1:
            return True
        if a1 <= b1:
            i += 1
        else:
            j += 1
    return False


def _fill_leftovers(state: _Pass) -> None:
    """Give the slots left to this pass's moldable starts, up to their ``fill_to``."""
    avail = state.avail
    for index, job in state.fillable:
        if avail.total <= 0:
            break
        placed = state.starts[index].placement
        have = placed.total
        want = job.fill_to - have if job.fill_to is not None else 0
        r = state.room(job.user)
        if r is not None:
            want = min(want, r)
        if want <= 0:
            continue
        if job.ptile is None and _fill_as_runs(state, index, job, placed, want):
            continue
        per_host = dict(placed)
        more: list[tuple[str, int]] = []
        for host, n in avail.open_hosts():
            take = min(n, want)
            if job.ptile is not None:
                take = min(take, job.ptile - per_host.get(host, 0))
            if take <= 0:
                continue
            more.append((host, take))
            want -= take
            if want <= 0:
                break
        avail.take(more)
        for host, take in more:
            per_host[host] = per_host.get(host, 0) + take
            state.taken[job.user] = state.taken.get(job.user, 0) + take
        placement = Placement(per_host.items())
        state.starts[index] = attrs.evolve(state.starts[index], placement=placement)
