"""What task events decide: a change's tasks started, stopped or failed, and when the
change is complete.

Part of the engine (:mod:`.engine`, which re-exports these names): pure, no I/O, no
clock reads. A host may report many alike events as one run (:mod:`.task_events`);
they are decided here at once where the facts allow it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from xce_resize_plugin.core import readiness
from xce_resize_plugin.core.allocations import id_range, task_ids
from xce_resize_plugin.core.config import Settings
from xce_resize_plugin.core.demand import with_demand
from xce_resize_plugin.core.facts import (
    Committed,
    Fact,
    GrowReverted,
    TaskExited,
    TasksStarted,
    TasksStopped,
    TaskStarted,
    TaskStartFailed,
    TaskStopped,
)
from xce_resize_plugin.core.fold import evolve
from xce_resize_plugin.core.models import Change, ChangeKind, Phase, ResizeState, TaskEvent
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents


def decide_task_event(
    state: ResizeState, task_id: int, kind: str, reason: str, at: float, settings: Settings
) -> list[Fact]:
    """A task of the change in flight started, failed to start or exited."""
    return decide_task_events(
        state, [TaskEvent(state.job_id, task_id, kind, None, reason)], at, settings
    )


def decide_task_events(
    state: ResizeState, events: Iterable[TaskEvent], at: float, settings: Settings
) -> list[Fact]:
    """Tasks of the change in flight started, failed to start or exited: the facts of
    a batch of the job's events, in order, exactly as if each had been decided alone
    on the state the previous ones led to. Events of other tasks (or other jobs) and
    repeated reports are ignored. A committed task outside the change that exited on
    its own is a :class:`TaskExited` fact (a job event; the task stays allocated).

    Consecutive starts, and consecutive stops with the same exit status, are one fact
    (:class:`TasksStarted`, :class:`TasksStopped`; a single one stays a
    :class:`TaskStarted` or :class:`TaskStopped`): they fold into the same state as
    one fact per task (tested), and a release of thousands of tasks writes one record.
    """
    change = state.change
    # Runs of alike events (core/task_events.py) are decided a run at a time where that
    # is what deciding their events one by one gives; any other part event by event.
    flat = events if isinstance(events, TaskEvents) else TaskEvents(events)
    if change is None:
        return committed_exits(state, flat, set(), at)
    ids = set(task_ids(change.tasks))
    started, failed, stopped = set(change.started), set(change.failed), set(change.stopped)
    starting = state.phase is Phase.GROW_STARTING
    # A task being drained that exits on its own is stopped: its slot is freed now.
    stopping = state.phase in (Phase.SHRINK_STOPPING, Phase.SHRINK_DRAINING)
    job_id = state.job_id
    facts: list[Fact] = []
    run = _Run(job_id, at, facts)
    done = started | failed | stopped  # grows with the three sets: not rebuilt per event
    i = -1  # the index of the last event decided
    for part in flat.parts:
        if isinstance(part, TaskEventRun):
            if _decided_at_once(part, job_id, ids, done, starting, stopping):
                # Each event adds its task to ``done`` (the run's ids are distinct and
                # none is there yet): the change completes, if at all, at the run's end.
                new = part.task_ids
                (started if starting else stopped).update(new)
                done.update(new)
                run.add_many(starting, part.status, new)
                i += len(new)
                if len(done) < len(ids) or not _can_complete(state, change, started, failed):
                    continue
                rest = flat[i + 1 :]
                return _completed(state, change, facts, run, started, failed, rest, at, settings)
            singles: Iterable[TaskEvent] = part
        else:
            singles = (part,)
        for event in singles:
            i += 1
            task_id, kind = event.task_id, event.kind
            if task_id not in ids or event.job_id != job_id:
                exits = committed_exits(state, (event,), ids, at)
                if exits:  # (mostly none: another job's event, a repeated report)
                    run.flush()
                    facts.extend(exits)
                continue
            if starting:
                if task_id in failed:
                    continue
                if not _grow_task_event(state, change, event, started, failed, done, run, at):
                    continue
            elif stopping and kind == "exited" and task_id not in stopped:
                stopped.add(task_id)
                done.add(task_id)
                run.add(False, event.status, task_id)
            if len(done) == len(ids) and _can_complete(state, change, started, failed):
                rest = flat[i + 1 :]
                return _completed(state, change, facts, run, started, failed, rest, at, settings)
    run.flush()
    return facts


def _grow_task_event(
    state: ResizeState,
    change: Change,
    event: TaskEvent,
    started: set[int],
    failed: set[int],
    done: set[int],
    run: _Run,
    at: float,
) -> bool:
    """:func:`decide_task_events` of an event of a starting grow's task not failed yet:
    ``False`` when it changes nothing (a repeated start, an exit of a started task
    that was ready or needs not be)."""
    task_id, kind, job_id = event.task_id, event.kind, state.job_id
    if task_id in started:
        if kind != "exited" or not readiness.waits(change) or task_id in state.ready:
            return False
        # Gone before it was ready: it will never be; its slot is freed now.
        failed.add(task_id)
        reason = f"exited before it was ready: {event.reason}"
        run.flush()
        run.facts.append(TaskStartFailed(job_id, at, task_id, reason))
    elif kind == "started":
        started.add(task_id)
        done.add(task_id)
        run.add(True, None, task_id)
    elif kind in ("start_failed", "exited"):
        failed.add(task_id)
        done.add(task_id)
        run.flush()
        run.facts.append(
            TaskStartFailed(job_id=job_id, at=at, task_id=task_id, reason=event.reason)
        )
    return True


def _decided_at_once(
    part: TaskEventRun,
    job_id: str,
    ids: set[int],
    done: set[int],
    starting: bool,
    stopping: bool,
) -> bool:
    """Whether deciding the run's events one by one would only add each task to the
    change's started (a grow's starts) or stopped (a release's exits) tasks: events of
    this job's change, none of their tasks resolved yet, each task once."""
    if part.job_id != job_id:
        return False
    if starting:
        if part.kind != "started":
            return False
    elif not (stopping and part.kind == "exited"):
        return False
    new = part.task_ids
    return (
        len(done) + len(new) <= len(ids)  # (so the change cannot complete before its end)
        and ids.issuperset(new)
        and done.isdisjoint(new)
        and len(set(new)) == len(new)
    )


def _can_complete(state: ResizeState, change: Change, started: set[int], failed: set[int]) -> bool:
    """Whether a change every task of which is resolved is complete now (a grow that
    waits for readiness only once its tasks are ready: decide_ready)."""
    return not readiness.awaiting(change, started - failed, state.ready)


def _completed(
    state: ResizeState,
    change: Change,
    facts: list[Fact],
    run: _Run,
    started: set[int],
    failed: set[int],
    rest: Sequence[TaskEvent],
    at: float,
    settings: Settings,
) -> list[Fact]:
    """The facts of a batch of task events whose change completed: later events find
    no change in flight."""
    run.flush()
    facts.append(completion(state, change, bool(started - failed), at, settings))
    facts = with_demand(state, facts, at, settings)
    if not rest:
        # Nothing left to decide on the state the facts lead to: the runtime folds them
        # once, not here first (a grow's k tasks were k folds).
        return facts
    after = state
    for fact in facts:
        after = evolve(after, fact)
    return facts + committed_exits(after, rest, set(), at)


class _Run:
    """The starts, or the stops of one exit status, of :func:`decide_task_events` not
    yet written as a fact: one fact when the run ends (another kind of event, another
    status, another fact, or the end of the batch)."""

    __slots__ = ("_at", "_facts", "_ids", "_job_id", "_started", "_status")

    def __init__(self, job_id: str, at: float, facts: list[Fact]) -> None:
        self._job_id, self._at, self._facts = job_id, at, facts
        self._ids: list[int] = []
        self._started = False
        self._status: int | None = None

    @property
    def facts(self) -> list[Fact]:
        """The facts written so far (the list given, appended to)."""
        return self._facts

    def add(self, started: bool, status: int | None, task_id: int) -> None:
        """One more start (``started``) or stop (with ``status``)."""
        if self._ids and (started is not self._started or status != self._status):
            self.flush()
        self._started, self._status = started, status
        self._ids.append(task_id)

    def add_many(self, started: bool, status: int | None, task_ids: Sequence[int]) -> None:
        """:meth:`add` of each of ``task_ids`` (a start has no status)."""
        status = None if started else status
        if self._ids and (started is not self._started or status != self._status):
            self.flush()
        self._started, self._status = started, status
        self._ids.extend(task_ids)

    def flush(self) -> None:
        ids = self._ids
        if not ids:
            return
        job_id, at = self._job_id, self._at
        fact: Fact
        if self._started:
            fact = (
                TaskStarted(job_id, at, ids[0])
                if len(ids) == 1
                else TasksStarted(job_id, at, tuple(ids))
            )
        elif len(ids) == 1:
            fact = TaskStopped(job_id, at, ids[0], self._status)
        else:
            fact = TasksStopped(job_id, at, tuple(ids), self._status)
        self._facts.append(fact)
        self._ids = []


def committed_exits(
    state: ResizeState, events: Iterable[TaskEvent], in_change: set[int], at: float
) -> list[Fact]:
    """Exits of committed tasks that no change is about (reported once per exit)."""
    committed: Collection[int] = id_range(state.tasks) or {t.id for t in state.tasks}
    return [
        TaskExited(state.job_id, at, e.task_id, e.status, e.reason)
        for e in events
        if e.kind == "exited"
        and e.job_id == state.job_id
        and e.task_id in committed
        and e.task_id not in in_change
    ]


def completion(
    state: ResizeState, change: Change, any_started: bool, at: float, settings: Settings
) -> Fact:
    """Every task of the change is resolved: commit it, or revert a grow none of whose
    tasks started."""
    if change.kind is ChangeKind.GROW and not any_started:
        failures = (change.pending.failures if change.pending else 0) + 1
        return GrowReverted(
            job_id=state.job_id, at=at, gave_up=failures >= settings.notify_max_failures
        )
    return Committed(job_id=state.job_id, at=at, version=state.version + 1)
