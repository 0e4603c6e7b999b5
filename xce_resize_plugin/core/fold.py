"""Folding facts into a job's resize state: the one way state changes.

:func:`evolve` folds one fact into a :class:`~.models.ResizeState`; :func:`replay` folds
a job's facts from the start (the journal stores both the facts and the state they
lead to; ``journal verify`` compares them). The decisions that produce the facts are
in :mod:`.engine`, the effects a fact calls for on the host in :mod:`.effects`. Pure,
like the engine: no I/O, no clock reads, no globals.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from attrs import fields

from xce_resize_plugin.core import readiness
from xce_resize_plugin.core.allocations import joined, next_task_id, task_ids, with_ids, without_ids
from xce_resize_plugin.core.facts import (
    AutoresizeSet,
    Committed,
    DrainEnded,
    Fact,
    GrowCancelled,
    GrowPlaced,
    GrowRequested,
    GrowReverted,
    JobEnded,
    JobTracked,
    NotifyDone,
    NotifyStarted,
    ReadyTimedOut,
    ReleaseAccepted,
    TargetSet,
    TaskExited,
    TaskReady,
    TasksDrained,
    TasksLaunched,
    TasksLost,
    TasksStarted,
    TasksStopped,
    TaskStarted,
    TaskStartFailed,
    TaskStopped,
)
from xce_resize_plugin.core.models import (
    Change,
    ChangeKind,
    PendingGrow,
    Phase,
    ResizeRecord,
    ResizeState,
    Task,
)

_S = TypeVar("_S", ResizeState, Change, PendingGrow)


# The attributes of the classes evolve() rebuilds, looked up once: attrs.evolve
# introspects the class at every call, and a state is rebuilt at every fact.
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(a.name for a in fields(cls)) for cls in (ResizeState, Change, PendingGrow)
}


def rebuilt(inst: _S, **changes: Any) -> _S:
    """``attrs.evolve`` for the engine's own state classes (public attributes only)."""
    for name in _FIELDS[type(inst)]:
        if name not in changes:
            changes[name] = getattr(inst, name)
    return type(inst)(**changes)


def release_phase(change: Change, at: float) -> tuple[Phase, Change]:
    """Where a release goes once its notification succeeded (or at once without one)."""
    if change.grace > 0:
        return Phase.SHRINK_DRAINING, rebuilt(change, deadline=at + change.grace)
    return Phase.SHRINK_STOPPING, change


def demand_size(state: ResizeState) -> int | None:
    """The size the plugin's demand grows the job to: its target if it has one, else
    ``max_tasks`` under autoresize; ``None``: the job has no demand."""
    if state.target is not None:
        return state.target.tasks
    return state.max_tasks if state.autoresize else None


def _with_charge(state: ResizeState, at: float) -> ResizeState:
    """Record a step of the charged-slots timeline when the held slot count changed."""
    charges = charge_steps(state.charges, at, state.held_count)
    return state if charges is state.charges else rebuilt(state, charges=charges)


def charge_steps(
    charges: tuple[tuple[float, int], ...], at: float, slots: int
) -> tuple[tuple[float, int], ...]:
    """The timeline with ``slots`` held from ``at`` on: a step at the same instant as
    the last one replaces it, and a step that changes nothing is not added.

    A step stamped before the last one (the host's wall clock was stepped back) is
    taken at the last one's instant: the timeline stays in order, and no stretch of it
    is counted twice or negatively (docs/live-controller.md, "The clock")."""
    if charges and charges[-1][1] == slots:
        return charges
    if charges and at < charges[-1][0]:
        at = charges[-1][0]
    if charges and charges[-1][0] == at:
        charges = charges[:-1]
        if charges and charges[-1][1] == slots:
            return charges
    return (*charges, (at, slots))


def evolve(state: ResizeState | None, fact: Fact) -> ResizeState:
    """Fold one fact into the job's state (the only way state changes)."""
    if isinstance(fact, JobTracked):
        if state is not None and state.live:
            raise ValueError(f"job {fact.job_id} is tracked already")
        return _tracked(state, fact)
    if state is None:
        raise ValueError(f"{type(fact).__name__} for untracked job {fact.job_id}")
    return _with_charge(_apply(state, fact), fact.at)


def _tracked(prior: ResizeState | None, fact: JobTracked) -> ResizeState:
    """A job's state from its first tracked fact. A job tracked before and requeued
    since (its state ended) keeps its history: resize records, charges, versions."""
    records: tuple[ResizeRecord, ...] = ()
    charges: tuple[tuple[float, int], ...] = ((fact.started_at, len(fact.tasks)),)
    version = attempts = 0
    if prior is not None:
        records, version, attempts = prior.records, prior.version, prior.notify_attempts
        charges = charge_steps(prior.charges, fact.started_at, len(fact.tasks))
    return ResizeState(
        job_id=fact.job_id,
        user=fact.user,
        min_tasks=fact.min_tasks,
        max_tasks=fact.max_tasks,
        tasks=fact.tasks,
        started_at=fact.started_at,
        next_task_id=next_task_id(fact.tasks),
        version=version,
        records=records,
        charges=charges,
        notify_attempts=attempts,
    )


def _apply(state: ResizeState, fact: Fact) -> ResizeState:
    if isinstance(fact, TasksLost):
        return _lose(state, fact)
    if isinstance(fact, TaskReady):
        return readiness.fold_ready(state, fact)
    if isinstance(fact, ReadyTimedOut):
        return readiness.fold_timed_out(state, fact)
    if isinstance(fact, GrowRequested):
        pending = PendingGrow(
            fact.min_add,
            fact.max_add,
            fact.notify_cmd,
            fact.at,
            auto=fact.auto,
            ready_timeout=fact.ready_timeout,
        )
        return rebuilt(state, phase=Phase.GROW_PENDING, pending=pending)
    if isinstance(fact, AutoresizeSet):
        notify = fact.notify_cmd if fact.enabled else None
        return rebuilt(state, autoresize=fact.enabled, autoresize_notify=notify)
    if isinstance(fact, TargetSet):
        return rebuilt(state, target=fact.target)
    if isinstance(fact, GrowCancelled):
        phase = Phase.IDLE if state.phase is Phase.GROW_PENDING else state.phase
        return rebuilt(state, pending=None, phase=phase)
    if isinstance(fact, GrowPlaced):
        placed = state.pending
        assert placed is not None
        new = Change(ChangeKind.GROW, fact.tasks, placed.notify_cmd, fact.at, pending=placed)
        phase = Phase.GROW_NOTIFYING if new.notify_cmd is not None else Phase.GROW_STARTING
        next_id = max(state.next_task_id, max(t.id for t in fact.tasks) + 1)
        return rebuilt(state, change=new, pending=None, phase=phase, next_task_id=next_id)
    if isinstance(fact, ReleaseAccepted):
        new = Change(ChangeKind.SHRINK, fact.tasks, fact.notify_cmd, fact.at, grace=fact.grace)
        if new.notify_cmd is not None:
            return rebuilt(state, change=new, pending=None, phase=Phase.SHRINK_NOTIFYING)
        after, new = release_phase(new, fact.at)
        return rebuilt(state, change=new, pending=None, phase=after)
    return _apply_to_change(state, fact)


def _apply_to_change(state: ResizeState, fact: Fact) -> ResizeState:
    """The facts about the change in flight (and the job's end)."""
    change = state.change
    assert change is not None or isinstance(fact, JobEnded | Committed | TaskExited), fact
    if isinstance(fact, NotifyStarted):
        assert change is not None
        return rebuilt(
            state, change=rebuilt(change, attempt=fact.attempt), notify_attempts=fact.attempt
        )
    if isinstance(fact, NotifyDone):
        assert change is not None
        if fact.ok:
            if change.kind is ChangeKind.GROW:
                return rebuilt(state, phase=Phase.GROW_STARTING)
            after_notify, change = release_phase(change, fact.at)
            return rebuilt(state, phase=after_notify, change=change)
        return _abandon(state, change, fact.gave_up)
    if isinstance(fact, TasksLaunched):
        assert change is not None
        launched = readiness.launched_by(change, fact.at)
        return rebuilt(state, change=rebuilt(launched, launched=True))
    if isinstance(fact, TaskStarted | TasksStarted):
        assert change is not None
        started = change.started | set(task_fact_ids(fact))
        return rebuilt(state, change=rebuilt(change, started=started))
    if isinstance(fact, TaskStartFailed):
        assert change is not None
        return rebuilt(state, change=rebuilt(change, failed=change.failed | {fact.task_id}))
    if isinstance(fact, TaskStopped | TasksStopped):
        assert change is not None
        stopped = change.stopped | set(task_fact_ids(fact))
        return rebuilt(state, change=rebuilt(change, stopped=stopped))
    if isinstance(fact, GrowReverted):
        assert change is not None
        return _abandon(state, change, fact.gave_up)
    if isinstance(fact, Committed):
        assert change is not None
        return _commit(state, change, fact)
    if isinstance(fact, JobEnded):
        return rebuilt(
            state,
            phase=Phase.ENDED,
            change=None,
            pending=None,
            ended_at=fact.at,
            requeued=fact.requeued,
        )
    if isinstance(fact, TasksDrained):
        assert change is not None
        drained = change.drained | set(fact.task_ids)
        return rebuilt(state, change=rebuilt(change, drained=drained))
    if isinstance(fact, DrainEnded):
        return rebuilt(state, phase=Phase.SHRINK_STOPPING)
    if isinstance(fact, TaskExited):
        return state
    raise TypeError(f"unknown fact {fact!r}")


def _abandon(state: ResizeState, change: Change, gave_up: bool) -> ResizeState:
    """A change that failed: a grow goes back to pending (or is given up), a shrink ends.
    A demand's grow whose job has no room for it any more (autoresize turned off,
    the target reached or cleared meanwhile) is dropped."""
    back = change.pending
    size = demand_size(state)
    if back is not None and back.auto and (size is None or size <= len(state.tasks)):
        back = None
    if back is not None and not back.auto and state.target is not None:
        back = None  # a target set since replaces the grow someone asked for
    if change.kind is ChangeKind.GROW and back is not None and not gave_up:
        pending = rebuilt(back, failures=back.failures + 1)
        return rebuilt(state, change=None, pending=pending, phase=Phase.GROW_PENDING)
    return rebuilt(state, change=None, phase=Phase.IDLE)


def _commit(state: ResizeState, change: Change, fact: Committed) -> ResizeState:
    before = state.tasks
    if change.kind is ChangeKind.GROW:
        # A task that started and then failed (not ready in time) is not added.
        delta = with_ids(change.tasks, change.started - change.failed)
        after: Sequence[Task] = joined(before, delta)
    else:
        delta = change.tasks
        after = without_tasks(before, delta)
    record = ResizeRecord(fact.at, change.kind, before, delta, after, fact.version)
    return rebuilt(
        state,
        tasks=after,
        change=None,
        phase=Phase.IDLE,
        version=fact.version,
        records=(*state.records, record),
    )


def replay(facts: Iterable[Fact]) -> ResizeState | None:
    """The state a sequence of one job's facts leads to."""
    state: ResizeState | None = None
    for fact in facts:
        state = evolve(state, fact)
    return state


def _lose(state: ResizeState, fact: TasksLost) -> ResizeState:
    """Fold a host failure into the state: the lost committed tasks leave the
    allocation (a resize record), and the change in flight is settled."""
    lost = {t.id for t in fact.tasks}
    tasks = without_ids(state.tasks, lost)
    records = state.records
    if len(tasks) != len(state.tasks):
        delta = with_ids(state.tasks, lost)
        record = ResizeRecord(
            fact.at, ChangeKind.SHRINK, state.tasks, delta, tasks, fact.version, fact.reason
        )
        records = (*records, record)
    change, pending, phase = _settle(state, lost)
    return rebuilt(
        state,
        tasks=tasks,
        records=records,
        version=fact.version,
        change=change,
        pending=pending,
        phase=phase,
        notify_attempts=max(state.notify_attempts, fact.attempt),
    )


def _settle(state: ResizeState, lost: set[int]) -> tuple[Change | None, PendingGrow | None, Phase]:
    """The change in flight after a host failure took the tasks ``lost`` of the job:

    - GROW_NOTIFYING: the grow goes back to pending (no failure counted), its slots freed;
    - GROW_STARTING: its lost tasks count as failed to start, the others go on;
    - SHRINK_NOTIFYING: the release is abandoned (as if vetoed), the allocation stays;
    - SHRINK_DRAINING, SHRINK_STOPPING: its lost tasks are gone with the host, the
      others go on draining (to the same deadline) or stopping.
    """
    change, phase = state.change, state.phase
    if change is None:
        return None, state.pending, phase
    if phase is Phase.GROW_NOTIFYING:
        return None, change.pending, Phase.GROW_PENDING if change.pending else Phase.IDLE
    if phase is Phase.SHRINK_NOTIFYING:
        return None, None, Phase.IDLE
    mine = set(task_ids(change.tasks)) & lost
    if not mine:
        return change, state.pending, phase
    if change.kind is ChangeKind.GROW:
        return rebuilt(change, failed=change.failed | mine), state.pending, phase
    rest = without_ids(change.tasks, lost)
    if not rest:
        return None, None, Phase.IDLE
    stopped = change.stopped - lost
    drained = change.drained - lost
    return rebuilt(change, tasks=rest, stopped=stopped, drained=drained), state.pending, phase


def unresolved(change: Change) -> Sequence[Task]:
    done = change.started | change.failed | change.stopped
    return without_ids(change.tasks, done)


def without_tasks(tasks: Sequence[Task], gone: Sequence[Task]) -> Sequence[Task]:
    return without_ids(tasks, set(task_ids(gone)))


TASK_FACTS = (TaskStarted, TaskStartFailed, TaskStopped, TasksStarted, TasksStopped)


TaskFact = TaskStarted | TaskStartFailed | TaskStopped | TasksStarted | TasksStopped


def task_fact_ids(fact: TaskFact) -> tuple[int, ...]:
    """The task ids a task fact is about: one, or several (schema 3)."""
    return fact.task_ids if isinstance(fact, TasksStarted | TasksStopped) else (fact.task_id,)
