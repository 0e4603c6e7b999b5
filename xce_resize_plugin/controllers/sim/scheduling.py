"""The embedded controller's scheduling: jobs admitted, queued, started and ended.

The second layer of :class:`~.sim_controller.EmbeddedController` (see :mod:`.state`):
the host's own submission checks, the queue (:mod:`..pending_queue`) and the running
jobs as the scheduler reads them (:mod:`..scheduler`, on counts), the FCFS + EASY pass
with its reservation, job starts and ends with their ``xce_job_start`` and
``xce_job_end``, and the blocked queue head that the plugin's reclaim sees.
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from xce_resize_plugin.controllers.jobs import JobRecord, VersionRecord, job_id_key
from xce_resize_plugin.controllers.observer import FinishedJob
from xce_resize_plugin.controllers.pending_queue import PendingQueue
from xce_resize_plugin.controllers.scheduler import (
    PendingJob,
    Reservation,
    RunningJob,
    easy_pass,
    empty_capacity,
)
from xce_resize_plugin.controllers.sim.state import ControllerState, exit_all
from xce_resize_plugin.controllers.sim.work import JobWork
from xce_resize_plugin.controllers.task_records import TaskState, TaskStates
from xce_resize_plugin.controllers.violations import InvariantViolation, SubmissionRejected
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import MAX_JOB_ID, JobState
from xce_resize_plugin.core.reclaim import QueueHead

log = logging.getLogger(__name__)

_third = operator.itemgetter(2)

#: What a blocked head is told of the cluster: free slots per host, the hosts out of
#: service, the resizable running jobs above their minimum and the slots they hold
#: above it (``QueueHead``'s fields).
_HeadSlots = tuple[Mapping[str, int], frozenset[str], tuple[str, ...], int]
#: The blocked head's description kept with what it was made of: the ledger's part, the
#: job's queue view, the reservation's job and shadow time with the free total.
_KeptHead = tuple[_HeadSlots, PendingJob, tuple[str, float, int], QueueHead]


class Scheduling(ControllerState):
    """Admission, the queue, the pass, starts and ends (see the module docstring)."""

    # The scheduler's views of the queue and the running jobs, and what the last pass
    # left (set by _init_schedule).
    _pending_views: dict[str, PendingJob]
    #: Queued jobs per user (``pending_of``), kept with the queue.
    _pending_users: dict[str, int]
    #: The queue: the pending views by submit time, then job id, read by a pass as
    #: they are, and a deep queue by blocks (..pending_queue).
    _queue_views: PendingQueue[PendingJob]
    _running: dict[str, JobRecord]
    _running_views: dict[str, RunningJob]
    #: The same views ordered by planned end, kept sorted as jobs start, change and
    #: end, so that computing the head's reservation needs no sort (jobs without a
    #: planned end never release anything and are left out).
    _by_end: list[tuple[float, str, RunningJob]]
    _views_epoch: int
    _res_known: tuple[Reservation, int, int, float] | None
    _head_kept: tuple[int, _HeadSlots] | None
    _queue_head_kept: _KeptHead | None
    _queue_epoch: int
    _last_pass: tuple[int, int, float] | None
    _reservation: Reservation | None
    _taken_at_pass: int
    #: The empty cluster's capacity per ``ptile`` (see :meth:`_can_ever_fit`).
    _capacity: dict[int | None, int]

    def _init_schedule(self) -> None:
        """The scheduler's views of the queue and the running jobs, and what the last
        pass left, all empty (constructor, part three)."""
        self._pending_views = {}
        self._pending_users = {}
        self._queue_views = PendingQueue()
        self._running = {}
        self._running_views = {}
        self._by_end = []
        self._views_epoch = 0
        self._res_known = None
        self._head_kept = None
        self._queue_head_kept = None
        self._queue_epoch = 0
        self._last_pass = None
        self._reservation = None
        self._taken_at_pass = 0
        self._capacity = {}

    # -- admission ---------------------------------------------------------------------

    def _allocate_id(self) -> str:
        while (
            str(self._next_id) in self._jobs
            or str(self._next_id) in self._future
            or str(self._next_id) in self._forgotten
        ):
            self._next_id += 1
        job_id = str(self._next_id)
        self._next_id += 1
        self._meta_dirty = True
        return job_id

    def _claim_id(self, job_id: str | None) -> str:
        """The new job's id: the one asked for if it is free, else the next number."""
        if job_id is None:
            return self._allocate_id()
        if (
            not isinstance(job_id, str)
            or not 0 < len(job_id) <= MAX_JOB_ID
            or job_id in (".", "..")
            or "/" in job_id
            or not job_id.isprintable()
        ):
            # A job's directories are named by its id (its logs, a notification's
            # working directory): "../x" made them outside the state directory.
            raise SubmissionRejected(
                f"job id {job_id!r} is not one: printable, 1 to {MAX_JOB_ID} characters, "
                "no '/', not '.' or '..'"
            )
        if job_id in self._jobs or job_id in self._future or job_id in self._forgotten:
            raise SubmissionRejected(f"job id {job_id} is already in use")
        return str(job_id)

    def _admit(self, record: JobRecord, work: JobWork | None, now: float) -> None:
        """Accept a submitted job now, or schedule its arrival at its submit time."""
        if work is not None:
            self._work[record.id] = work
        if record.submit_time > now:
            self._future[record.id] = record
            self._timeline.at(record.submit_time, partial(self._arrive, record.id))
        else:
            self._accept(record)

    def _arrive(self, job_id: str) -> None:
        record = self._future.pop(job_id, None)
        if record is None:
            return  # killed before it arrived
        try:
            self._accept(record)
        except Exception as exc:  # any validation error rejects, as for submit()
            self._rejections.append((self.now(), job_id, f"{type(exc).__name__}: {exc}"))
            log.info("job %s rejected at arrival: %s", job_id, exc)

    def _accept(self, record: JobRecord) -> None:
        """Validate and admit an arriving job (queue it, or start it on its ``alloc``)."""
        try:
            self._hook(self._hooks.job_validate, self._host, record.info())
            placement = self._host_checks(record)
        except BaseException:
            self._work.pop(record.id, None)  # rejected: it will never run
            raise
        self._jobs[record.id] = record
        self._cluster.register_job(record.id, record.user)
        self._changed(record.id)
        for fn in self._on_submit:
            fn(record.id, self.now())
        if placement is not None:
            self._start_job(record, placement)
        else:
            self._enqueue(record)
        self._flush()
        if placement is not None:
            self._report_start(record)

    def _host_checks(self, job: JobRecord) -> tuple[tuple[str, int], ...] | None:
        """The host's own submission checks; return the explicit placement if any."""
        if not job.user:
            raise SubmissionRejected("a job needs a user")
        if job.min_tasks < 1 or job.min_tasks > job.max_tasks:
            raise SubmissionRejected(f"bad task range {job.min_tasks},{job.max_tasks}")
        if job.ptile is not None and job.ptile < 1:
            raise SubmissionRejected(f"bad ptile {job.ptile}")
        for name, value in (("runtime", job.runtime), ("estimate", job.estimate)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise SubmissionRejected(f"bad {name} {value}")
        for name, size in (("start_tasks", job.start_tasks), ("initial", job.initial_tasks)):
            if size is not None and not job.min_tasks <= size <= job.max_tasks:
                raise SubmissionRejected(
                    f"{name} {size} outside the job's {job.min_tasks},{job.max_tasks}"
                )
        limit = self._cluster.user_limits.get(job.user)
        if not self._can_ever_fit(job.min_tasks, job.ptile, limit):
            raise SubmissionRejected(
                f"job {job.id} can never start: {job.min_tasks} task(s)"
                + (f" with ptile {job.ptile}" if job.ptile else "")
                + f" on {self._cluster.capacity} slot(s)"
                + (f" under user {job.user}'s limit of {limit}" if limit is not None else "")
            )
        if job.alloc is None:
            return None
        total = 0
        for host, count in job.alloc:
            if not self._cluster.has_host(host):
                raise SubmissionRejected(f"alloc: unknown host {host!r}")
            if not self._cluster.takes_tasks(host):
                state = self._cluster.host_state(host).value
                raise SubmissionRejected(f"alloc: host {host} is {state}: no new tasks")
            if count < 1:
                raise SubmissionRejected(f"alloc: bad task count {count} on {host}")
            if job.ptile is not None and count > job.ptile:
                raise SubmissionRejected(f"alloc: {count} tasks on {host} exceed ptile {job.ptile}")
            free = self._cluster.free_on(host)
            if count > free:
                raise SubmissionRejected(
                    f"alloc does not fit: {count} tasks on {host}, {free} free"
                )
            total += count
        if len({h for h, _ in job.alloc}) != len(job.alloc):
            raise SubmissionRejected("alloc: a host is listed twice")
        if not job.min_tasks <= total <= job.max_tasks:
            raise SubmissionRejected(
                f"alloc has {total} tasks, outside {job.min_tasks}..{job.max_tasks}"
            )
        headroom = self._cluster.headroom(job.user)
        if headroom is not None and total > headroom:
            raise SubmissionRejected(
                f"alloc does not fit: user {job.user} may take {headroom} more slot(s)"
            )
        return job.alloc

    def _can_ever_fit(self, min_tasks: int, ptile: int | None, limit: int | None) -> bool:
        """Whether the job could start on the empty cluster (else it would pend
        forever). The empty cluster's capacity is kept per ``ptile``: hosts never change
        while the controller runs, and a workload of jobs of thousands of sizes must
        not walk every host at each submission."""
        if limit is not None and limit < min_tasks:
            return False
        cap = self._capacity.get(ptile)
        if cap is None:
            cap = self._capacity[ptile] = empty_capacity(self._cluster.hosts, ptile)
        return cap >= min_tasks

    @staticmethod
    def _queue_key(job: JobRecord) -> tuple[float, tuple[int, int, str]]:
        return (job.submit_time, job_id_key(job.id))

    def _enqueue(self, job: JobRecord) -> None:
        view = self._pending_views[job.id] = self._pending_view(job)
        self._queue_views.add(self._queue_key(job), view)
        self._queue_epoch += 1
        users = self._pending_users
        users[job.user] = users.get(job.user, 0) + 1

    def _dequeue(self, job: JobRecord) -> None:
        if self._queue_views.remove(self._queue_key(job), job.id):
            del self._pending_views[job.id]
            self._queue_epoch += 1
            users = self._pending_users
            left = users[job.user] - 1
            if left:
                users[job.user] = left
            else:
                del users[job.user]

    # -- starts and ends ---------------------------------------------------------------

    def _start_job(self, job: JobRecord, placement: Sequence[tuple[str, int]]) -> None:
        """Start ``job``: tasks 0..n-1 in allocation order, charged and running now."""
        now = self.now()
        tasks = self._cluster.allocate(job.id, placement)
        self._dequeue(job)
        job.state = JobState.RUN
        job.start_time = now
        job.tasks = tasks
        job.version = 0
        job.versions = [VersionRecord(0, now, tasks)]
        job.task_states = TaskStates(tasks, TaskState.RUNNING, now)  # records on first use
        self._running[job.id] = job
        work = self._work.get(job.id)
        self._schedule_end(job, work.start(now, len(tasks)) if work is not None else None)
        self._update_running_view(job)
        self._changed(job.id)
        for fn in self._on_start:
            fn(job.id, now, tasks)

    def _schedule_end(self, job: JobRecord, end: float | None = None) -> None:
        """(Re)schedule the job's end: at ``end`` when its work model gave one, else
        at start + runtime. An earlier scheduled end of the job becomes a no-op."""
        if end is None and job.id not in self._work:
            end = job.planned_end()
        gen = self._end_gen.get(job.id, 0) + 1
        self._end_gen[job.id] = gen
        if end is not None:
            self._timeline.at(max(end, self.now()), partial(self._end_due, job.id, gen))

    def _end_due(self, job_id: str, gen: int = 0) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.state is not JobState.RUN:
            return
        if gen and gen != self._end_gen.get(job_id):
            return  # the end moved (the job was resized since)
        self._end_job(job, JobState.DONE, "done")

    def _expected_end(self, job: JobRecord) -> float | None:
        """The end the scheduler plans a running job with."""
        work = self._work.get(job.id)
        return work.expected_end() if work is not None else job.expected_end()

    def _end_job(self, job: JobRecord, state: JobState, reason: str) -> None:
        """Free the committed allocation, stop the tasks, set the state, then tell the
        plugin (``xce_job_end``) and check that the job holds nothing any more."""
        now = self.now()
        for fn in self._on_ending:
            fn(job.id, now, state, reason)
        was_pending = job.state is JobState.PEND
        job.state = state
        job.end_time = now
        job.exit_reason = reason
        exit_all(job.task_states, now, "job ended")
        if was_pending:
            self._dequeue(job)
        cluster = self._cluster
        if cluster.held_count(job.id) == len(job.tasks):
            # Nothing in flight (a grow would hold more, a shrink fewer, and only one
            # change is in flight at a time): exactly the committed tasks are held.
            cluster.release_all(job.id)
        else:
            cluster.free(job.id, [t.id for t in job.tasks])
        self._running.pop(job.id, None)
        self._drop_running_view(job.id)
        self._changed(job.id)
        self._flush()
        self._report_end(job)

    def _report_start(self, job: JobRecord) -> None:
        """``xce_job_start``, once the start is saved (a crash in between is made good
        by :meth:`_report_running_starts` at the next start)."""
        if job.state is JobState.RUN:
            self._hook(self._hooks.job_start, self._host, job.info())

    def _report_running_starts(self) -> None:
        """After ``xce_controller_start``: every running job's start again, for the
        plugin to pick up one whose report a crash lost (it ignores the others)."""
        for job in list(self._running.values()):
            self._report_start(job)

    def _report_end(self, job: JobRecord) -> None:
        self._hook(self._hooks.job_end, self._host, job.id)
        leftover = self._cluster.held(job.id)
        job.end_reported = True
        self._changed(job.id)
        if leftover:
            problem = (
                f"job {job.id} still held {len(leftover)} slot(s) after xce_job_end: "
                + ", ".join(f"{tid}@{host}" for tid, host in leftover.items())
            )
            self._problems.append(problem)
            # Reclaim them so the simulation goes on with a correct ledger; the leak is
            # on record for check_invariants().
            self._cluster.free_job(job.id)
            self._flush()
            if self.strict:
                raise InvariantViolation(problem)
            log.warning("%s", problem)
        self._flush()
        self._end_gen.pop(job.id, None)
        self._work.pop(job.id, None)
        if self._on_end and job.end_time is not None:
            finished = FinishedJob(
                job.id,
                job.user,
                job.state,
                job.min_tasks,
                job.max_tasks,
                job.submit_time,
                job.start_time,
                job.end_time,
                tuple(job.versions),
                job.exit_reason,
            )
            for fn in self._on_end:
                fn(finished)
        if not self.keep_finished:
            del self._jobs[job.id]
            self._cluster.forget_job(job.id)
            self._forgotten.add(job.id)
        elif job.end_time is not None:
            self._finished.add(job.end_time, job.id, job.user)

    # -- finished jobs dropped after a while -------------------------------------------

    def _drop_due(
        self, before: float, limit: int | None, keep: Callable[[str], bool] | None
    ) -> list[JobRecord]:
        """Drop (at most ``limit``) finished jobs whose end, reported, is at ``before``
        or earlier, earliest first, except those ``keep`` names (left for a later
        call); their records are deleted from the store at the next flush."""
        return self._drop_from(
            lambda _user, _held: self._finished.pop_due(before), [""], limit, keep
        )

    def _drop_over(
        self, most: int, limit: int | None, keep: Callable[[str], bool] | None
    ) -> list[JobRecord]:
        """Drop (at most ``limit``) finished jobs of each user who has more than
        ``most`` kept, the user's earliest ended first, until ``most`` are left (those
        ``keep`` names stay, and do not count as dropped)."""
        finished = self._finished

        def oldest(user: str, held: int) -> tuple[float, str] | None:
            # The jobs put aside for `keep` still count (they are put back).
            return finished.pop_oldest(user) if finished.count(user) + held > most else None

        return self._drop_from(oldest, finished.users_over(most), limit, keep)

    def _drop_from(
        self,
        take: Callable[[str, int], tuple[float, str] | None],
        users: list[str],
        limit: int | None,
        keep: Callable[[str], bool] | None,
    ) -> list[JobRecord]:
        """Drop the jobs ``take(user, held)`` gives for each of ``users`` in turn
        (``held``: how many of the user's it gave that ``keep`` names), until it gives
        none or ``limit`` are dropped; put back those ``keep`` names."""
        dropped: list[JobRecord] = []
        kept: list[tuple[float, JobRecord]] = []
        for user in users:
            held = 0
            while limit is None or len(dropped) < limit:
                entry = take(user, held)
                if entry is None:
                    break
                job = self._jobs.get(entry[1])
                if job is None or not job.finished or not job.end_reported:
                    continue  # gone already; a job is queued only once its end is reported
                if keep is not None and keep(job.id):
                    kept.append((entry[0], job))
                    held += 1
                    continue
                del self._jobs[job.id]
                self._cluster.forget_job(job.id)
                self._dirty.discard(job.id)
                if self._persist:
                    self._deleted.add(job.id)
                self._retire_id(job.id)
                dropped.append(job)
        for end, job in kept:
            self._finished.add(end, job.id, job.user)
        return dropped

    def _retire_id(self, job_id: str) -> None:
        """A dropped job's id is never given again, also after a restart: the next id
        (saved in the meta record) moves past a number. Any other id (only a driver's
        explicit ``job_id`` is not a number; the live controller's never are) is
        remembered in memory only, for the life of this controller object."""
        number = read_decimal(job_id)
        if number is None:
            self._forgotten.add(job_id)
        elif number >= self._next_id:
            self._next_id = number + 1
            self._meta_dirty = True

    # -- the pass ----------------------------------------------------------------------

    def _host_pass(self) -> None:
        """The host's FCFS + EASY pass, skipped when neither the queue nor the free
        slots nor the clock changed since the last one (it would decide the same)."""
        if not self._queue_views:
            self._reservation = None
            return
        sig = (self._cluster.free_epoch, self._queue_epoch, self.now())
        if sig == self._last_pass:
            return
        now = self.now()
        cluster = self._cluster
        # On counts (see .scheduler): the pass costs in proportion to the queue it reads
        # and the hosts of the jobs it starts, not to the number of hosts.
        result = easy_pass(
            now,
            self._queue_views,
            map(_third, self._by_end),
            cluster.free_counts(),
            cluster.headroom,
            known=self._known_reservation(now),
        )
        for start in result.starts:
            self._start_job(self._jobs[start.job_id], start.placement)
        self._reservation = res = result.reservation
        # Slots taken from now on come out of the reservation's extra slots.
        self._taken_at_pass = cluster.taken_count
        self._last_pass = (cluster.free_epoch, self._queue_epoch, now)
        # A pass that started nothing leaves a reservation the next pass may reuse.
        self._res_known = (
            (res, cluster.change_epoch, self._views_epoch, now)
            if res is not None and not result.starts
            else None
        )
        self._flush()
        for start in result.starts:
            self._report_start(self._jobs[start.job_id])

    # -- reclaim: the blocked queue head as the plugin sees it ------------------------

    def queue_head(self) -> QueueHead | None:
        """The head the last pass could not start, in the terms of
        :meth:`~xce_resize_plugin.host.ClusterView.blocked_head`: every host counts for
        it, and the resizable jobs listed are the running ones above their minimum."""
        with self._lock:
            return self._queue_head()

    def _queue_head(self) -> QueueHead | None:
        res = self._reservation
        view = self._pending_views.get(res.job_id) if res is not None else None
        if res is None or view is None:
            return None
        parts = self._head_slots()
        total = self._cluster.free_total
        kept = self._queue_head_kept
        # The parts and the view are the same objects while unchanged: compared by
        # identity, as equal free-slot views of every host would cost a step per host.
        if (
            kept is not None
            and kept[0] is parts
            and kept[1] is view
            and kept[2] == (res.job_id, res.shadow, total)
        ):
            # The same object as at the last cycle: the plugin, which keeps its answer
            # while the head stays the same, compares it by identity first.
            return kept[3]
        free, unusable, resizable, excess = parts
        head = QueueHead(
            res.job_id,
            view.min_tasks,
            view.ptile,
            res.shadow,
            free,
            unusable,
            resizable,
            total,
            excess,
        )
        self._queue_head_kept = (parts, view, (res.job_id, res.shadow, total), head)
        return head

    def _head_slots(self) -> _HeadSlots:
        """The free slots, the hosts out of service, the resizable running jobs above
        their minimum and the slots they hold above it, as a head sees them. Each
        changes only with the ledger (a job starts, ends or is resized; a host closes,
        opens, fails or comes back: each bumps ``change_epoch``), and the plugin asks at
        every cycle while the head is blocked: they are kept until the ledger changes
        (the same objects, read-only)."""
        cluster = self._cluster
        kept = self._head_kept
        if kept is not None and kept[0] == cluster.change_epoch:
            return kept[1]
        held = cluster.held_count
        above = {
            j: n
            for j, job in self._running.items()
            if job.resizable and (n := held(j) - job.min_tasks) > 0
        }
        # Slots a reclaim frees on a closed or failed host do not count for the head.
        parts = (
            cluster.free_counts().snapshot(),
            cluster.out_of_service(),
            tuple(above),
            sum(above.values()),
        )
        self._head_kept = (cluster.change_epoch, parts)
        return parts

    def _known_reservation(self, now: float) -> Reservation | None:
        """The last pass's reservation if it is still exact: no slot taken or freed,
        no running job's planned end changed, and none reached since (an overdue job
        releases "now", which would move the shadow time)."""
        known = self._res_known
        if known is None:
            return None
        res, epoch, views, at = known
        if epoch != self._cluster.change_epoch or views != self._views_epoch:
            return None
        if not res.shadow > now:
            return None
        i = bisect.bisect_right(self._by_end, (at, "\U0010ffff"))
        if i < len(self._by_end) and self._by_end[i][0] <= now:
            return None
        return res

    def _update_running_view(self, job: JobRecord) -> None:
        """The scheduler's view of a running job: its planned end and (live) slots."""
        self._drop_running_view(job.id)
        self._views_epoch += 1
        cluster = self._cluster
        view = RunningJob(
            job.id,
            self._expected_end(job),
            cluster.job_hosts(job.id),
            partial(cluster.schedulable_count, job.id),
        )
        self._running_views[job.id] = view
        if view.end is not None:
            # Ends and ids never tie together (ids are unique): views are not compared.
            bisect.insort(self._by_end, (view.end, job.id, view))

    def _drop_running_view(self, job_id: str) -> None:
        old = self._running_views.pop(job_id, None)
        if old is not None and old.end is not None:
            i = bisect.bisect_left(self._by_end, (old.end, job_id))
            del self._by_end[i]

    def _pending_view(self, job: JobRecord) -> PendingJob:
        work = self._work.get(job.id)
        if job.initial_tasks is not None:
            # A cap the owner asked for: never filled up to max with idle slots.
            most, fill_to = job.initial_tasks, None
        elif job.start_tasks is not None:
            most, fill_to = job.start_tasks, job.max_tasks
        else:
            most, fill_to = job.max_tasks, None
        return PendingJob(
            job.id,
            job.user,
            job.min_tasks,
            most,
            job.ptile,
            job.duration,
            work.planned_duration if work is not None else None,
            fill_to,
        )
