"""The runtime as the hook phases see it: one per controller; the hooks delegate here.

The top of the runtime's layers (:mod:`xce_resize_plugin.runtime`): the controller's
start and stop (recovery of the live jobs), resize requests, status and events, the
scheduler and dispatch cycles, task events, job starts and ends, host failures,
accounting, and the release that converges on a job's target size. Each decides
through the engine and changes state through the transition path (:mod:`.transitions`).
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence

from xce_resize_plugin.core import converters, engine, losses, target
from xce_resize_plugin.core import events as events_mod
from xce_resize_plugin.core.accounting import Usage, job_of_record, usage_of_job, usage_of_state
from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.core.models import (
    JobInfo,
    JobState,
    LossOutcome,
    Phase,
    ResizeRequest,
    ResizeState,
    TargetRequest,
    Task,
    host_counts,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView, has_free
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
from xce_resize_plugin.errors import InvalidRequest, NoJob, PolicyRejected, ResizeError
from xce_resize_plugin.host import ClusterView, Controller, Principal, TaskEvent, durable_wait
from xce_resize_plugin.journal import StoredState, collector_paused
from xce_resize_plugin.runtime.reclaiming import Reclaiming

log = logging.getLogger(__name__)

#: Jobs whose projection is kept for the next poll (the least recently polled goes).
_EVENT_CACHE = 1024
#: Events in one answer at most: a reader far behind gets pages, each from the last
#: ``seq`` it has (docs/in-job-api.md, "Job events").
EVENT_PAGE = 1000
#: The newest events kept per job (a reader less than this behind is answered from
#: memory), and the events kept across the cache at most (beyond, the least recently
#: polled jobs keep their projection but no events).
_EVENT_TAIL = 1000
_EVENT_BUDGET = 100_000
#: Where pages answered from older facts ended, kept per job (the next page goes on
#: from there rather than from the job's first fact).
_EVENT_MARKS = 8


class _Projected:
    """One job's events as projected so far (docs/in-job-api.md, "Job events"): the
    journal sequence number of its last fact projected, where the projection stands
    then, its newest events, and marks ``{count: (fact seq, projection)}`` where pages
    of older events ended."""

    __slots__ = ("at", "marks", "seq", "tail")

    def __init__(self) -> None:
        self.seq = 0
        self.at = events_mod.Projection()
        self.tail: deque[events_mod.JobEvent] = deque(maxlen=_EVENT_TAIL)
        self.marks: dict[int, tuple[int, events_mod.Projection]] = {}

    def resume(self, after: int) -> tuple[int, events_mod.Projection]:
        """The nearest place at or before event ``after`` to project from (a mark, else
        the job's first fact)."""
        best: tuple[int, events_mod.Projection] = (0, events_mod.Projection())
        for count, place in self.marks.items():
            if best[1].count < count <= after:
                best = place
        return best

    def mark(self, seq: int, at: events_mod.Projection) -> None:
        self.marks.pop(at.count, None)
        self.marks[at.count] = (seq, at)
        while len(self.marks) > _EVENT_MARKS:
            del self.marks[next(iter(self.marks))]


def _requested_at(state: ResizeState) -> float:
    return state.pending.requested_at if state.pending is not None else 0.0


def _placed_tasks(facts: Sequence[Fact]) -> tuple[Task, ...]:
    out: tuple[Task, ...] = ()
    for fact in facts:
        tasks = getattr(fact, "tasks", None)
        if tasks is not None:
            out += tasks
    return out


def _exits_on_their_own(batch: TaskEvents) -> bool:
    """Whether a task other than task 0 exited on its own (not stopped by the host),
    read a run at a time."""
    return any(
        r.kind == "exited" and not r.stopped and any(i != 0 for i in r.task_ids)
        for r in batch.runs()
    )


class Runtime(Reclaiming):
    """Resize state of one controller. The hooks in :mod:`xce_resize_plugin.plugin`
    delegate here."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller)
        # events(): each job's projection, least recently polled first, and the
        # events their tails hold. Its own lock, taken with no other of the runtime's
        # held (the journal's is taken inside it): projecting does not hold up decisions.
        self._events: dict[str, _Projected] = {}
        self._events_held = 0
        self._events_lock = threading.Lock()

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Fence older controllers, load live jobs, resume their in-flight changes."""
        self.journal.start()
        with collector_paused():
            self._resume_live_jobs()

    def _resume_live_jobs(self) -> None:
        for _job_id, data in self.journal.live_states():
            loaded = converters.decode_state(data)
            self._store(loaded)
            if self._observer is not None:
                self._observer.resize_transition(None, loaded, ())
        now = self.controller.now()
        for state in list(self.states.values()):
            job = self.controller.get_job(state.job_id)
            if job is None or job.state in (JobState.DONE, JobState.EXIT):
                # The job ended while no controller ran the plugin (or its end was never
                # written): end the resize state rather than re-reserve slots for a job
                # that holds none, at the end the host knows (its accounting stops
                # there, not at this restart). A later xce_job_end is then a no-op.
                ended = job.end_time if job is not None and job.end_time is not None else now
                self._transition(state.job_id, engine.decide_job_end(state, min(ended, now)))
                continue
            self._execute(engine.resume_effects(state))
            self._transition(state.job_id, engine.decide_recover(state, now))
            if engine.demand_size(state) is not None:
                current = self.states.get(state.job_id, state)
                self._transition(state.job_id, engine.decide_demand(current, now, self.settings))
                self._converge(state.job_id)

    def stop(self) -> None:
        try:
            if self._committer is not None:
                self._committer.close()
            elif self._deferred and self._failed is None:
                self._commit([])  # journal_defer: the last transitions go now
        finally:
            self.journal.close()

    # --- requests -------------------------------------------------------------

    def request(self, principal: Principal, job_id: str, request: ResizeRequest) -> ResizeStatus:
        with self._lock:
            self._check_failed()
            job = self._job(job_id)
            state = self.states.get(job_id)
            now, policy, settings = self.controller.now(), self.policy, self.settings
            if isinstance(request, TargetRequest):
                facts = target.decide_target(state, job, principal, request, now, policy, settings)
            else:
                facts = engine.decide_request(state, job, principal, request, now, policy, settings)
            # A request's facts have no effects on the host (placement,
            # notification and tasks come from the cycles), so the lock is released
            # before the fsync and concurrent requests share one (group commit).
            ticket = self._transition(job_id, facts, wait=False)
            status = self.status(job_id)
            assert status is not None
        if ticket is not None:
            # The host's lock too, if it offers to (host.durable_wait): the decision
            # is made and queued in journal order; only the answer waits.
            with durable_wait(self.controller):
                self._wait(ticket)
        return status

    def status(self, job_id: str) -> ResizeStatus | None:
        state = self.states.get(job_id)
        if state is None:
            job = self.controller.get_job(job_id)
            if job is None:
                return None
            stored = self._stored(job_id)
            if stored is None:
                # Not tracked: its submission's autoresize flag (a job not yet started).
                return ResizeStatus(
                    job.id,
                    Phase.IDLE,
                    tuple(job.tasks),
                    job.min_tasks,
                    job.max_tasks,
                    0,
                    autoresize=job.autoresize and not job.tasks,
                )
            state = converters.decode_state(stored)
        change = state.change
        # Positional, in ResizeStatus's field order (mypy checks each type).
        committed = (state.tasks, state.min_tasks, state.max_tasks, state.version)
        auto = state.autoresize and state.live
        aim = state.target if state.live else None
        if change is None:
            return ResizeStatus(
                state.job_id, state.phase, *committed, state.pending, autoresize=auto, target=aim
            )
        return ResizeStatus(
            state.job_id,
            state.phase,
            *committed,
            state.pending,
            change.kind,
            change.tasks,
            autoresize=auto,
            target=aim,
        )

    def events(self, job_id: str, after: int | None) -> list[events_mod.JobEvent] | None:
        """The job's events after ``after``, at most :data:`EVENT_PAGE` of them
        (docs/in-job-api.md, "Job events"): its durable facts, read from the journal and
        projected; ``None`` for a job the host does not know."""
        if self.controller.get_job(job_id) is None:
            return None
        with self._lock:
            if self._deferred and self._failed is None:
                self._commit([])  # journal_defer: what happened so far is written first
        with self._events_lock:
            entry = self._projected(job_id)
            cursor = 0 if after is None else after
            events_mod.check_cursor(cursor, entry.at.count)
            first = entry.at.count - len(entry.tail)  # the seq before the tail's first
            if cursor >= first:
                skip = cursor - first
                return list(itertools.islice(entry.tail, skip, skip + EVENT_PAGE))
            return self._older_events(job_id, entry, cursor)

    def _projected(self, job_id: str) -> _Projected:
        """The job's projection brought up to its last durable fact. Long polls ask again
        and again: each reads only the job's facts after the last one projected (one
        index lookup when there is none), so a poll costs what is new for this job, and
        another job's facts cost it nothing. After a restart the cache starts empty and
        the first poll of a job projects its whole history once."""
        entry = self._events.pop(job_id, None) or _Projected()
        self._events_held -= len(entry.tail)
        try:
            for seq, data in self.journal.job_facts(job_id, entry.seq):
                entry.at, found = events_mod.step(entry.at, converters.decode_fact(data))
                entry.tail.extend(found)
                entry.seq = seq
        finally:
            # Kept even if a read failed part way: what was projected is consistent.
            self._events[job_id] = entry
            self._events_held += len(entry.tail)
        self._bound_events()
        return entry

    def _bound_events(self) -> None:
        """Keep the cache within its bounds: the least recently polled jobs go first,
        and over the budget of events their tails go before their projections (what a
        poll from the last event needs, and what a job's history would cost again)."""
        while len(self._events) > _EVENT_CACHE:
            evicted = self._events.pop(next(iter(self._events)))
            self._events_held -= len(evicted.tail)
        for entry in self._events.values():
            if self._events_held <= _EVENT_BUDGET:
                return
            self._events_held -= len(entry.tail)
            entry.tail.clear()

    def _older_events(
        self, job_id: str, entry: _Projected, after: int
    ) -> list[events_mod.JobEvent]:
        """A page of events older than the job's tail: projected again from the nearest
        mark at or before ``after`` up to the projection's last fact, and a mark kept
        after the page's last fact projected whole, for the reader's next page."""
        seq, at = entry.resume(after)
        out: list[events_mod.JobEvent] = []
        for fact_seq, data in self.journal.job_facts(job_id, seq):
            if fact_seq > entry.seq:
                break
            nxt, found = events_mod.step(at, converters.decode_fact(data))
            out += [e for e in found if e.seq > after][: EVENT_PAGE - len(out)]
            if out and out[-1].seq < nxt.count:
                break  # the page ends inside this fact's events: the mark stays before it
            seq, at = fact_seq, nxt
            if len(out) == EVENT_PAGE:
                break
        if at.count:
            entry.mark(seq, at)
        return out

    def _job(self, job_id: str) -> JobInfo:
        if not job_id or len(job_id) > 64:
            raise InvalidRequest(f"bad job id {job_id!r}")
        job = self.controller.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        return job

    # --- scheduler and dispatch -----------------------------------------------

    def sched_cycle(self, cluster: ClusterView) -> None:
        if self._reclaim_on and self._reclaim(cluster):
            return  # slots are being reclaimed for the queue head: no grow takes them
        if not self._busy:
            return  # the common case, checked without the lock: no cost to the cycle
        with self._lock:
            pending = [s for j in self._busy if (s := self.states[j]).phase is Phase.GROW_PENDING]
            if not pending:
                return
            free = cluster.free_slots()
            if not has_free(free):
                # Every grow needs a slot: with none offered, placing would only call
                # the hosts-order policy per pending grow to place nothing. On a full
                # cluster with grows pending this was a third of a durable REST
                # request's cost (docs/performance.md).
                return
            index = FreeSlotIndex(free)
            now = self.controller.now()
            # Grows are placed first come, first served, like the host's own queue.
            for state in sorted(pending, key=lambda s: (_requested_at(s), s.job_id)):
                job = self.controller.get_job(state.job_id)
                if job is None:
                    continue
                view = GrowHostView(index, host_counts(state.tasks))
                headroom = self.controller.slot_headroom(state.user)
                try:
                    facts = engine.decide_placement(state, job, view, headroom, self.policy, now)
                except PolicyRejected as exc:
                    # A site's order hook failed (policy.py): this grow stays pending,
                    # placed on no host the hook did not choose; the others go on.
                    log.warning("job %s: grow not placed this cycle: %s", state.job_id, exc.text)
                    continue
                if facts:
                    index.take_many(host_counts(_placed_tasks(facts)).items())
                    self._transition(state.job_id, facts)

    def dispatch_cycle(self) -> None:
        if not self._busy:
            return  # a stale read only delays work to the next cycle, never loses it
        with self._lock:
            now = self.controller.now()
            for job_id in sorted(self._busy):
                state = self.states.get(job_id)
                if state is not None and state.change is not None:
                    self._transition(job_id, engine.decide_dispatch(state, now))
                    self._ready_deadline(job_id, now)

    def _ready_deadline(self, job_id: str, now: float) -> None:
        """A grow waiting for its tasks' readiness past its deadline is settled
        (core/readiness.py): the host feeds the time in at every dispatch cycle."""
        state = self.states.get(job_id)
        if state is not None and state.change is not None and state.change.ready_by is not None:
            self._transition(job_id, engine.decide_ready_deadline(state, now, self.settings))

    # --- events ---------------------------------------------------------------

    def task_events(self, events: Sequence[TaskEvent]) -> None:
        """Each job's events of the batch in one transition (one journal write); runs of
        alike events (core/task_events.py) stay runs."""
        by_job: dict[str, list[TaskEvent | TaskEventRun]] = {}
        parts = events.parts if isinstance(events, TaskEvents) else events
        for part in parts:
            by_job.setdefault(part.job_id, []).append(part)
        with self._lock:
            now = self.controller.now()
            for job_id, parts_of_job in by_job.items():
                batch = TaskEvents(parts_of_job)
                state = self.states.get(job_id)
                if state is not None:
                    facts = engine.decide_task_events(state, batch, now, self.settings)
                    self._transition(job_id, facts)
                else:
                    self._untracked_exits(job_id, batch, now)
                self._release_exited(job_id, batch, now)
                self._converge(job_id)

    def _untracked_exits(self, job_id: str, batch: TaskEvents, now: float) -> None:
        """A task of a resizable job that exits on its own is told to the job even
        before its first resize: the plugin starts tracking the job then (a crashed
        worker is news to an elastic framework; docs/in-job-api.md, "Job events")."""
        if not _exits_on_their_own(batch):
            return  # the common case: no job lookup
        job = self.controller.get_job(job_id)
        if job is None or self._stored(job_id) is not None:
            return  # an ended run: never tracked twice
        # A release_exited job too: its exits are told with their status (tasks_exited)
        # before _release_exited drops the tasks (tasks_lost), as for a tracked job; the
        # first exit of a job never resized was a tasks_lost alone, its status lost.
        self._transition(job_id, losses.decide_untracked_exits(job, batch, now))

    def _release_exited(self, job_id: str, batch: TaskEvents, now: float) -> None:
        """A ``release_exited`` job drops the tasks that exited on their own (an
        involuntary shrink, reason ``task_exit``; docs/in-job-api.md)."""
        if not _exits_on_their_own(batch):
            return  # the common case: no job lookup
        job = self.controller.get_job(job_id)
        if job is None or not job.release_exited:
            return
        state = self.states.get(job_id)
        if state is None and not job.requeued and self._stored(job_id) is not None:
            return  # an ended run the journal holds: never tracked twice
        facts = losses.decide_task_exit(state, job, batch, now, self.settings)
        self._transition(job_id, facts)

    def job_start(self, job: JobInfo) -> None:
        """A job started: an autoresizable one is tracked with its demand (a job the
        plugin knows already, reported again after a failover, changes nothing), and
        a requeued one whose earlier run the journal holds goes on from it."""
        if not job.autoresize:
            if job.requeued:
                self._requeued_start(job)
            return  # the common case, without the lock
        with self._lock:
            self._check_failed()
            facts = engine.decide_job_start(
                self.states.get(job.id), job, self.controller.now(), self.settings
            )
            if facts and not job.requeued and self._stored(job.id) is not None:
                # An ended job the journal still holds: never tracked twice. A requeued
                # job's ended state is its earlier run's: this run is tracked on top.
                return
            self._transition(job.id, facts)

    def _requeued_start(self, job: JobInfo) -> None:
        """A requeued job's new run, tracked on top of its earlier one (held for it in
        the journal: docs/failover.md, "A requeued job"), so that its history goes on
        and compaction may later drop it with the rest."""
        with self._lock:
            self._check_failed()
            if job.id in self.states:
                return  # tracked already (a start reported again after a failover)
            facts = engine.decide_requeued_start(
                self._ended_state(job.id), job, self.controller.now()
            )
            self._transition(job.id, facts)

    def notify_done(self, job_id: str, attempt: int, status: int | None, reason: str) -> None:
        with self._lock:
            state = self.states.get(job_id)
            if state is None:
                return
            facts = engine.decide_notify_done(
                state, attempt, status, reason, self.controller.now(), self.settings
            )
            self._transition(job_id, facts)
            self._converge(job_id)

    def job_end(self, job_id: str) -> None:
        with self._lock:
            state = self.states.get(job_id)
            if state is None:
                if job_id in self._held:
                    # Ended while it waited to start again: its earlier run is no
                    # longer held for a next one.
                    prior = self._ended_state(job_id)
                    self._transition(
                        job_id, engine.decide_requeued_end(prior, self.controller.now())
                    )
                return
            self._transition(job_id, engine.decide_job_end(state, self.controller.now()))

    def host_failed(self, host: str, lost: Mapping[str, Sequence[int]]) -> dict[str, LossOutcome]:
        """Settle every job that had tasks on the failed ``host`` (``xce_host_failed``)."""
        out: dict[str, LossOutcome] = {}
        with self._lock:
            self._check_failed()
            now = self.controller.now()
            for job_id in sorted(lost):
                job = self.controller.get_job(job_id)
                if job is not None:
                    out[job_id] = self._lose(job, host, tuple(lost[job_id]), now)
        return out

    def _lose(self, job: JobInfo, host: str, ids: tuple[int, ...], now: float) -> LossOutcome:
        """One job's share of a host failure: an involuntary shrink, or the site's
        choice between exit and requeue (docs/failover.md)."""
        state = self.states.get(job.id)
        if losses.survives_loss(state, job, ids):
            tasks = state.tasks if state is not None else job.tasks
            shrunk = any(t.id in ids for t in tasks)
            prior = self._ended_state(job.id) if state is None and job.requeued else None
            facts = losses.decide_host_loss(state, job, host, ids, now, self.settings, prior)
            self._transition(job.id, facts)
            self._converge(job.id)
            return LossOutcome.SHRUNK if shrunk else LossOutcome.KEPT
        try:
            answer = self.policy.host_lost(job, ids)
        except ResizeError as exc:
            # The host must settle the failure whatever a site hook does: the job ends.
            log.warning("job %s: %s; the job ends", job.id, exc.text)
            answer = "exit"
        if answer != "requeue":
            return LossOutcome.EXIT
        limit = self.values["max_requeue"]
        if job.requeues >= limit:
            # LSF's MAX_JOB_REQUEUE: a job that each run's host failure ends would
            # otherwise keep its place in the queue for ever (docs/failover.md). Said
            # only when the site's policy asked for the requeue that is refused.
            log.warning(
                "job %s: not requeued: requeued %d time(s), the most max_requeue allows "
                "(%d); the job ends",
                job.id,
                job.requeues,
                limit,
            )
            return LossOutcome.EXIT
        if state is not None:
            # The host requeues without xce_job_end: the run's resize state ends here,
            # held in the journal for the job's next run (docs/failover.md).
            self._transition(job.id, engine.decide_job_end(state, now, requeued=True))
        return LossOutcome.REQUEUE

    def usage(self, job_id: str, now: float) -> Usage | None:
        state = self.states.get(job_id)
        if state is None:
            stored = self._stored(job_id)
            if stored is not None:
                state = converters.decode_state(stored)
        if state is not None:
            return usage_of_state(state, now)
        job = self.controller.get_job(job_id)
        return usage_of_job(job, now) if job is not None else None

    def job_record(self, job_id: str) -> JobInfo | None:
        """The ended job as the journal has it, for a host that has forgotten it. Read
        for any caller before a policy says who may see the job: its final state only,
        not its history, and nothing is written (a deferred end is read from memory)."""
        with self._lock:
            deferred = self._deferred_of(job_id)
            if deferred is not None:
                return job_of_record(deferred.after)
        payload = self.journal.final_state(job_id)
        if payload is None:
            return None
        return job_of_record(converters.decode_state(StoredState(payload)))

    # --- a target size: the release that converges on it ----------------------

    def _converge(self, job_id: str) -> None:
        """After a transition that may leave a job above its target (a commit, a failed
        change, a host failure, a restart): release down to it (core/target.py). The
        demand below a target is the engine's, decided in the transition itself."""
        state = self.states.get(job_id)
        if state is None or state.target is None:
            return  # the common case
        job = self.controller.get_job(job_id)
        if job is None:
            return
        try:
            facts = target.decide_converge(state, job, self.controller.now(), self.policy)
        except ResizeError as exc:
            # A site's release policy refused: the job stays above its target until the
            # next change settles (or the target is set again).
            log.warning("job %s: target %d not reached: %s", job_id, state.target.tasks, exc.text)
            return
        self._transition(job_id, facts)
