"""The plugin's per-controller runtime: journal, live states, and the effects it orders.

Every transition follows the same path (docs/journal-format.md): the engine decides facts from the
current state; the facts and the new materialised state are written in one journal
transaction; only once that is durable does the cache change and the host get told
what to do (reserve, launch, stop, notify, commit). A crash anywhere leaves either the
old state or the new one in the journal, and recovery re-issues the effects of the new
one (all idempotent on the host), so nothing is lost or done twice.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Mapping, Sequence
from operator import attrgetter

import attrs

from xce_resize_plugin.core import config as config_mod
from xce_resize_plugin.core import converters, engine, target
from xce_resize_plugin.core import events as events_mod
from xce_resize_plugin.core.accounting import Usage, usage_of_job, usage_of_state
from xce_resize_plugin.core.allocations import joined
from xce_resize_plugin.core.models import (
    ChangeKind,
    Fact,
    JobInfo,
    JobState,
    JobTracked,
    LossOutcome,
    Phase,
    ReleaseRequest,
    ResizeRequest,
    ResizeState,
    TargetRequest,
    Task,
    TasksInIdOrder,
    allocation_env,
    format_hosts,
    host_counts,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView, has_free
from xce_resize_plugin.core.reclaim import (
    QueueHead,
    ReclaimCandidate,
    ReclaimHead,
    Selection,
    check_selection,
    short_after,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
from xce_resize_plugin.errors import InvalidRequest, JournalError, NoJob, ResizeError
from xce_resize_plugin.host import (
    ClusterView,
    Controller,
    Principal,
    TaskEvent,
    durable_wait,
    resize_observer_of,
    wake_at,
)
from xce_resize_plugin.journal import (
    Entry,
    GroupCommitter,
    Journal,
    StoredState,
    Ticket,
    collector_paused,
)
from xce_resize_plugin.policy import HookPolicy

#: Jobs whose projected events are kept for the next poll (then the cache starts over).
_EVENT_CACHE = 1024
#: Who asks when the plugin reclaims slots for the queue head (resize history shows it).
RECLAIM = Principal("reclaim", admin=True)

log = logging.getLogger(__name__)

#: LSF's notification exit values (reference: not documented by LSF; we use 0 and 1).
NOTIFY_OK, NOTIFY_FAIL = "0", "1"


class Runtime:
    """Resize state of one controller. The hooks in :mod:`.plugin` delegate here."""

    def __init__(self, controller: Controller) -> None:
        # Weak: the plugin maps controller -> runtime weakly (plugin.py), so a strong
        # reference back would keep a dropped (crashed) controller, its runtime and its
        # journal handle alive for the life of the process.
        self._controller = weakref.ref(controller)
        values = config_mod.check(controller.config)
        self.settings = config_mod.settings(controller.config)
        self.policy = HookPolicy(controller.plugin_manager)
        self.journal = Journal.open(
            controller.state_dir / "resize",
            map_size=values["journal_map_size"],
            sync=values["journal_sync"],
        )
        # The host's observer (metrics), if it offers one; None costs one test per
        # transition.
        self._observer = resize_observer_of(controller)
        # Durable mode shares fsyncs between concurrent requests (group commit); with
        # journal_sync off (throw-away simulations) a direct commit is cheaper.
        self._committer = (
            GroupCommitter(
                self.journal,
                observe=None if self._observer is None else self._observer.journal_committed,
            )
            if values["journal_sync"]
            else None
        )
        self._failed: BaseException | None = None
        # journal_defer: entries of transitions that need not be written yet; they go
        # first in the next commit, in the same transaction.
        self._defer: bool = values["journal_defer"]
        self._deferred: list[_Deferred] = []
        self.states: dict[str, ResizeState] = {}
        # Jobs with a pending grow or a change in flight: the only ones the scheduler
        # and dispatch hooks look at, so an idle cycle costs nothing per tracked job.
        self._busy: set[str] = set()
        # Why one lock: decisions read the state they change; group commit across
        # concurrent requesters is the journal's GroupCommitter's job (live controller).
        self._lock = threading.RLock()
        # reclaim = "shrink" (docs/admin-guide.md): the head the jobs in _reclaim_asked
        # were asked for; each job is asked at most once per head (a veto is final for
        # that head). Kept in memory only: after a failover a job may be asked again.
        self._reclaim_on = values["reclaim"] == "shrink"
        self._reclaim_min_delay = float(values["reclaim_min_delay"])
        self._reclaim_for: str | None = None
        self._reclaim_asked: set[str] = set()
        # Bumped whenever a job's state is stored: with the head the host describes
        # and the jobs asked, all a reclaim decision reads (see _reclaim).
        self._version = 0
        self._reclaim_seen: tuple[QueueHead, int, int] | None = None
        self._reclaim_answer = False
        self._candidates_kept: tuple[_CandidatesKey, tuple[ReclaimCandidate, ...]] | None = None
        self._releasables: dict[str, tuple[Sequence[Task], Sequence[Task]]] = {}
        # events(): each job's projected events and the journal's last fact then.
        self._events: dict[str, tuple[int, list[events_mod.JobEvent]]] = {}

    @property
    def controller(self) -> Controller:
        """The controller this runtime serves (while it exists)."""
        controller = self._controller()
        if controller is None:
            raise ReferenceError("the controller of this resize runtime is gone")
        return controller

    # --- lifecycle -----------------------------------------------------------------

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

    # --- requests --------------------------------------------------------------------

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
        """The job's events after ``after`` (docs/in-job-api.md, "Job events"): its
        durable facts, read from the journal and projected; ``None`` for a job the host
        does not know."""
        if self.controller.get_job(job_id) is None:
            return None
        with self._lock:
            if self._deferred and self._failed is None:
                self._commit([])  # journal_defer: what happened so far is written first
        # Long polls ask again and again while nothing happens: the projection is kept
        # until the journal has a newer fact (of any job).
        last = self.journal.last_seq
        cached = self._events.get(job_id)
        if cached is not None and cached[0] == last:
            return events_mod.after_cursor(cached[1], after)
        facts = [converters.decode_fact(data) for _, data in self.journal.job_facts(job_id)]
        found = events_mod.project(facts)
        if len(self._events) >= _EVENT_CACHE:
            self._events.clear()
        self._events[job_id] = (last, found)
        return events_mod.after_cursor(found, after)

    def _job(self, job_id: str) -> JobInfo:
        if not job_id or len(job_id) > 64:
            raise InvalidRequest(f"bad job id {job_id!r}")
        job = self.controller.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        return job

    # --- scheduler and dispatch ------------------------------------------------------

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
                facts = engine.decide_placement(state, job, view, headroom, self.policy, now)
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

    # --- reclaim: shrinking running jobs for the blocked queue head ------------------

    def _reclaim(self, cluster: ClusterView) -> bool:
        """Ask resizable jobs to release tasks when that starts the blocked head now
        (docs/admin-guide.md, "Reclaim"). ``True`` while slots are being freed for it:
        grows then wait, so that what is freed goes to the head."""
        queued = cluster.blocked_head()
        with self._lock:
            if queued is None:
                self._reclaim_for, self._reclaim_asked = None, set()
                self._reclaim_seen = self._candidates_kept = None
                self._releasables = {}
                return False
            if queued.job_id != self._reclaim_for:
                self._reclaim_for, self._reclaim_asked = queued.job_id, set()
                self._reclaim_seen = self._candidates_kept = None
            now = self.controller.now()
            if queued.shadow - now < self._reclaim_min_delay:
                return False
            # Most cycles find the same head, the same states and the same jobs asked
            # as the last one (a job arriving behind the head changes none of them):
            # the decision would be the same, so the last one stands. Only a decision
            # that changed nothing is kept; the time counts only in the check above.
            seen = (queued, self._version, len(self._reclaim_asked))
            if seen == self._reclaim_seen:
                return self._reclaim_answer
            answer = self._reclaim_decide(queued, now)
            unchanged = self._version == seen[1] and len(self._reclaim_asked) == seen[2]
            self._reclaim_seen = seen if unchanged else None
            self._reclaim_answer = answer
            return answer

    def _reclaim_decide(self, queued: QueueHead, now: float) -> bool:
        """:meth:`_reclaim` for a head whose start is far enough away."""
        job = self.controller.get_job(queued.job_id)
        if job is None:
            return False
        coming = self._being_freed(queued.unusable)
        free = _plus(queued.free, coming) if coming else queued.free
        total = queued.free_total
        if total is not None:
            total += sum(coming.values())  # none on unusable hosts
        head = ReclaimHead(job, queued.tasks, queued.ptile, free, queued.unusable, total)
        short = head.short()
        if short == 0:
            return bool(coming)  # what is being freed starts it: nothing to ask
        bound = queued.resizable_excess
        if bound is not None and short > bound:
            # The candidates are some of those jobs, each giving at most what it holds
            # above its minimum: not one lookup when all of it would not be enough (on
            # HPC2N, four decisions in five end here).
            return False
        candidates = self._reclaim_candidates(queued)
        if short > sum(c.excess for c in candidates):
            return False  # even every job at its minimum would not start it
        # A list of its own: the policy may reorder what it is given.
        selection = self.policy.select_reclaim(head, list(candidates))
        check_selection(selection, candidates)
        if short_after(head, selection, candidates) > 0:
            return False  # a reconfiguration that starts nobody only costs
        return self._ask_reclaim(head, selection, candidates, now)

    def _being_freed(self, unusable: frozenset[str]) -> dict[str, int]:
        """Slots per host that shrinks in flight will free (not yet stopped)."""
        out: dict[str, int] = {}
        for job_id in self._busy:
            change = self.states[job_id].change
            if change is None or change.kind is not ChangeKind.SHRINK:
                continue
            for task in change.tasks:
                if task.id not in change.stopped and task.host not in unusable:
                    out[task.host] = out.get(task.host, 0) + 1
        return out

    def _reclaim_candidates(self, queued: QueueHead) -> tuple[ReclaimCandidate, ...]:
        """The host's running resizable jobs above their minimum with nothing in
        flight, not yet asked for this head.

        Kept while the head, the host's resizable jobs, the states and the jobs asked
        stay the same: half of the decisions that are made again (see _reclaim) differ
        only in the free slots, and a job's view changes only with its state or its
        end (the host then lists other resizable jobs)."""
        key = (queued.job_id, queued.resizable, self._version, len(self._reclaim_asked))
        kept = self._candidates_kept
        if kept is not None and kept[0] == key:
            return kept[1]
        out: list[ReclaimCandidate] = []
        # The allocations of this listing's candidates (those of the last listing are
        # dropped with it: a job no longer listed has ended or changed).
        releasables: dict[str, tuple[Sequence[Task], Sequence[Task]]] = {}
        for job_id in queued.resizable:
            if job_id in self._reclaim_asked or job_id == queued.job_id:
                continue
            state = self.states.get(job_id)
            if state is not None and state.change is not None:
                continue
            job = self.controller.get_job(job_id)
            if job is None or job.state is not JobState.RUN or not job.resizable:
                continue
            tasks = state.tasks if state is not None else job.tasks
            excess = len(tasks) - job.min_tasks
            if excess > 0:
                releasable = self._releasable_of(job_id, tasks, releasables)
                pending = state is not None and state.pending is not None
                out.append(ReclaimCandidate(job, releasable, excess, pending))
        found = tuple(out)
        self._candidates_kept = (key, found)
        self._releasables = releasables
        return found

    def _releasable_of(
        self,
        job_id: str,
        tasks: Sequence[Task],
        into: dict[str, tuple[Sequence[Task], Sequence[Task]]],
    ) -> Sequence[Task]:
        """A job's tasks but task 0, in id order (:class:`ReclaimCandidate`), made once
        per allocation: the candidates are listed again after every transition of any
        job, and a job of many hosts would be copied and sorted each time."""
        kept = self._releasables.get(job_id)
        if kept is not None and kept[0] is tasks:
            into[job_id] = kept
            return kept[1]
        # Task 0 comes first in a committed allocation: then the rest is a slice.
        first = tasks[0]
        if isinstance(tasks, TasksInIdOrder) and first.id == 0:
            # The host's own list, in id order: read only from the end, if at all.
            releasable: Sequence[Task] = tasks[1:]
        else:
            # Mostly in id order already: the sort then only checks it, in C.
            rest = tasks[1:] if first.id == 0 else [t for t in tasks if t.id != 0]
            releasable = tuple(sorted(rest, key=_task_id))
        into[job_id] = (tasks, releasable)
        return releasable

    def _ask_reclaim(
        self,
        head: ReclaimHead,
        selection: Selection,
        candidates: Sequence[ReclaimCandidate],
        now: float,
    ) -> bool:
        """Release the selection through the ordinary path (the job's notification may
        veto); a job a site rule refuses is left out, and if the rest no longer starts
        the head nothing is asked. ``True`` when releases were asked."""
        jobs = {c.job.id: c.job for c in candidates}
        decided: list[tuple[str, Sequence[int], Sequence[Fact]]] = []
        for job_id, ids in selection.items():
            if not ids:
                continue
            # A pending grow is cancelled: it could not be placed before the head.
            request = ReleaseRequest(task_ids=tuple(sorted(ids)), cancel_pending=True)
            state = self.states.get(job_id)
            try:
                facts = engine.decide_request(
                    state, jobs[job_id], RECLAIM, request, now, self.policy, self.settings
                )
            except ResizeError:
                self._reclaim_asked.add(job_id)  # refused by a site rule: not for this head
                continue
            decided.append((job_id, ids, facts))
        if short_after(head, {j: ids for j, ids, _ in decided}, candidates) > 0:
            return False
        for job_id, _, chosen in decided:
            self._reclaim_asked.add(job_id)
            self._transition(job_id, chosen)
        return bool(decided)

    # --- events ----------------------------------------------------------------------

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
        if job is None or job.release_exited or self._stored(job_id) is not None:
            return  # release_exited: _release_exited tracks it; an ended run: never twice
        self._transition(job_id, engine.decide_untracked_exits(job, batch, now))

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
        facts = engine.decide_task_exit(state, job, batch, now, self.settings)
        self._transition(job_id, facts)

    def job_start(self, job: JobInfo) -> None:
        """A job started: an autoresizable one is tracked with its demand (a job the
        plugin knows already, reported again after a failover, changes nothing)."""
        if not job.autoresize:
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
        if engine.survives_loss(state, job, ids):
            tasks = state.tasks if state is not None else job.tasks
            shrunk = any(t.id in ids for t in tasks)
            prior = self._ended_state(job.id) if state is None and job.requeued else None
            facts = engine.decide_host_loss(state, job, host, ids, now, self.settings, prior)
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
        if state is not None:
            # The host requeues without xce_job_end: the run's resize state ends here.
            self._transition(job.id, engine.decide_job_end(state, now))
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

    # --- a target size: the release that converges on it -------------------------------

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

    # --- the one path every change takes ---------------------------------------------

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise JournalError(
                f"the resize journal failed earlier ({self._failed}); restart the controller"
            ) from self._failed

    def _wait(self, ticket: Ticket) -> None:
        try:
            ticket.wait()
        except BaseException as exc:
            # The in-memory state ran ahead of a commit that failed: nothing more may be
            # decided on it. The host must stop (a FencedError says why).
            self._failed = exc
            raise

    def _transition(self, job_id: str, facts: Sequence[Fact], wait: bool = True) -> Ticket | None:
        """Apply facts: new state in memory, the entry committed, then the effects.

        With ``wait=False`` (effect-free transitions only) the entry is queued for group
        commit and its ticket returned: the caller waits for it after releasing the lock.
        Transitions with effects wait here, under the lock, so effects always reach the
        host in commit order and only once durable.
        """
        if not facts:
            return None
        self._check_failed()
        before = self.states.get(job_id)
        if before is None and isinstance(facts[0], JobTracked) and self._requeued(job_id):
            # A job requeued after a host failure starts again with the history of its
            # earlier run (engine: JobTracked on an ended state). Only such a job is
            # looked up: a journal read waits for the write in progress, fsync included,
            # and every job's first fact comes here (under the host's lock).
            before = self._ended_state(job_id)
        state, effects = engine.transition(before, facts)
        assert state is not None
        if self._observer is not None:
            self._observer.resize_transition(before, state, facts)
        if self._committer is None:
            if self._defer and (
                not effects or all(isinstance(f, engine.DEFERRABLE) for f in facts)
            ):
                # journal_defer (simulations): what the host has not acted on can wait
                # for the next write, and so can a fact whose loss recovery repairs
                # (engine.DEFERRABLE). The facts and their order stay the same; a
                # process crash loses what was not yet written (docs/failover.md).
                self._defer_entry(job_id, before, facts, state)
            else:
                self._commit_with_deferred(job_id, before, facts, state)
            self._store(state)
        else:
            entry = _entry(job_id, before, facts, state)
            # Stored before it is durable so that the next decision sees it; nothing
            # is acknowledged or done on the host until the ticket says durable.
            self._store(state)
            ticket = self._committer.enqueue(entry)
            if not wait and not effects:
                return ticket
            self._wait(ticket)
        self._execute(effects)
        return None

    def _stored(self, job_id: str) -> StoredState | None:
        """A job's state as the journal has it, deferred writes included."""
        with self._lock:
            if self._deferred and self._failed is None:
                self._commit([])
        return self.journal.state(job_id)

    def _requeued(self, job_id: str) -> bool:
        job = self.controller.get_job(job_id)
        return job is not None and job.requeued

    def _ended_state(self, job_id: str) -> ResizeState | None:
        """The job's ended state, if the journal (or a deferred write) holds one."""
        for deferred in reversed(self._deferred):
            if deferred.job_id == job_id:
                return deferred.after
        stored = self.journal.state(job_id)
        return converters.decode_state(stored) if stored is not None else None

    def _defer_entry(
        self, job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
    ) -> None:
        last = self._deferred[-1] if self._deferred else None
        if last is not None and last.job_id == job_id:
            # The same job again (a release, then its launch): one entry, the facts of
            # both in order and the latest state; the intermediate one would be
            # overwritten in the same transaction anyway.
            last.facts.extend(facts)
            last.after = after
        else:
            self._deferred.append(_Deferred(job_id, before, list(facts), after))

    def _commit_with_deferred(
        self, job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
    ) -> None:
        """Write a transition now, with what was deferred; when the last deferred one is
        the same job's (a grow's launch, then its commit), as one entry, as
        :meth:`_defer_entry` joins them: its state is written once."""
        last = self._deferred[-1] if self._deferred else None
        if last is not None and last.job_id == job_id:
            self._deferred.pop()
            before, facts = last.before, [*last.facts, *facts]
        self._commit([_entry(job_id, before, facts, after)])

    def _commit(self, entries: list[Entry]) -> None:
        """Write the deferred entries, then ``entries``, in one transaction."""
        deferred, self._deferred = self._deferred, []
        batch = [_entry(d.job_id, d.before, d.facts, d.after) for d in deferred] + entries
        try:
            self.journal.commit(batch)
        except BaseException as exc:
            self._failed = exc
            raise

    def _store(self, state: ResizeState) -> None:
        job_id = state.job_id
        self._version += 1
        if not state.live:
            self.states.pop(job_id, None)
            self._busy.discard(job_id)
            return
        self.states[job_id] = state
        if state.pending is not None or state.change is not None:
            self._busy.add(job_id)
        else:
            self._busy.discard(job_id)

    def _execute(self, effects: Sequence[engine.Effect]) -> None:
        ctl = self.controller
        for effect in effects:
            if isinstance(effect, engine.Reserve):
                if effect.tasks:
                    ctl.reserve_slots(effect.job_id, effect.tasks)
            elif isinstance(effect, engine.Free):
                if effect.task_ids:
                    ctl.free_slots(effect.job_id, effect.task_ids)
            elif isinstance(effect, engine.Launch):
                if effect.tasks:
                    state = self.states[effect.job_id]
                    after = joined(state.tasks, effect.tasks)
                    # Only a resizable job changes size (hence resizable=True, here and
                    # in the notification's environment).
                    ctl.launch_tasks(
                        effect.job_id,
                        effect.tasks,
                        allocation_env(after, state.version + 1, resizable=True),
                    )
            elif isinstance(effect, engine.Stop):
                if effect.task_ids:
                    ctl.stop_tasks(effect.job_id, effect.task_ids, self.settings.stop_grace)
            elif isinstance(effect, engine.Notify):
                self._notify(effect)
            elif isinstance(effect, engine.DrainUntil):
                wake_at(ctl, effect.deadline)
            elif isinstance(effect, engine.CommitAllocation):
                ctl.commit_allocation(effect.job_id, effect.tasks, effect.version)
                if effect.record is not None:
                    job = ctl.get_job(effect.job_id)
                    if job is not None:
                        self.policy.committed(job, effect.record)

    def _notify(self, effect: engine.Notify) -> None:
        ctl = self.controller
        job = ctl.get_job(effect.job_id)
        state = self.states.get(effect.job_id)
        if job is None or state is None or not state.tasks:
            return
        env: dict[str, str] = dict(job.env)
        version = state.version + 1 if effect.version is None else effect.version
        env.update(allocation_env(effect.after, version, resizable=True))
        env.update(
            {
                "LSB_JOBID": job.id,
                "XCE_JOB_ID": job.id,
                "LSB_RESIZE_EVENT": effect.kind.value,
                "LSB_RESIZE_HOSTS": format_hosts(effect.delta),
                # Which tasks, not only how many per host: a framework retires exactly
                # these workers (docs/user-guide.md, "The notification command").
                "XCE_RESIZE_TASK_IDS": ",".join(str(t.id) for t in effect.delta),
                "LSB_RESIZE_NOTIFY_OK": NOTIFY_OK,
                "LSB_RESIZE_NOTIFY_FAIL": NOTIFY_FAIL,
            }
        )
        ctl.run_notification(
            effect.job_id,
            effect.attempt,
            state.tasks[0].host,
            effect.command,
            env,
            self.settings.notify_timeout,
        )


@attrs.define
class _Deferred:
    """Transitions of one job waiting for the next write (``journal_defer``)."""

    job_id: str
    before: ResizeState | None
    facts: list[Fact]
    after: ResizeState


def _entry(
    job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
) -> Entry:
    """The journal entry of the transition(s) from ``before`` to ``after``."""
    return Entry(
        job_id=job_id,
        facts=tuple(converters.encode_fact(f) for f in facts),
        state=converters.encode_state(after),
        ended_at=after.ended_at,
        history=converters.history_tails(before, after),
    )


_task_id = attrgetter("id")

#: What a reclaim's candidates depend on: the head, the host's resizable jobs, the
#: runtime's state counter and how many jobs were asked for this head.
_CandidatesKey = tuple[str, tuple[str, ...], int, int]


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Per-host sums of two slot counts."""
    out = dict(a)
    for host, n in b.items():
        out[host] = out.get(host, 0) + n
    return out


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
