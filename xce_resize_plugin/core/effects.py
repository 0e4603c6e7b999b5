"""What the host must do once a fact is durable, and transitions that collect it.

Every effect is idempotent on the host side (per task id, per version), so recovery may
issue them again (:func:`resume_effects`). :func:`effects` says what one fact calls
for; :func:`transition` folds a transition's facts (:mod:`.fold`) and collects their
effects in order. Pure, like the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from xce_resize_plugin.core.allocations import joined, task_ids
from xce_resize_plugin.core.facts import (
    Committed,
    Fact,
    GrowPlaced,
    GrowReverted,
    JobEnded,
    NotifyDone,
    NotifyStarted,
    ReadyTimedOut,
    TasksLaunched,
    TasksLost,
    TasksStarted,
    TasksStopped,
    TaskStarted,
    TaskStartFailed,
    TaskStopped,
)
from xce_resize_plugin.core.fold import (
    TASK_FACTS,
    charge_steps,
    evolve,
    rebuilt,
    task_fact_ids,
    unresolved,
    without_tasks,
)
from xce_resize_plugin.core.models import (
    ChangeKind,
    Phase,
    ResizeRecord,
    ResizeState,
    Task,
    held_count,
)


@frozen
class Reserve:
    job_id: str
    tasks: Sequence[Task]


@frozen
class Free:
    job_id: str
    task_ids: tuple[int, ...]


@frozen
class Launch:
    job_id: str
    tasks: Sequence[Task]


@frozen
class Stop:
    job_id: str
    task_ids: tuple[int, ...]


@frozen
class Notify:
    """Run the notification command (attempt ``attempt``) for the change in flight."""

    job_id: str
    attempt: int
    command: str
    kind: ChangeKind
    delta: Sequence[Task]
    after: Sequence[Task]
    #: The allocation version of ``after`` when it is already committed (a notification
    #: for information after an involuntary shrink); ``None``: the next version.
    version: int | None = None


@frozen
class DrainUntil:
    """A release drains until ``deadline``: the host runs a dispatch cycle then (a
    controller that cycles on a clock tick anyway may ignore it)."""

    job_id: str
    deadline: float


@frozen
class CommitAllocation:
    job_id: str
    tasks: Sequence[Task]
    version: int
    record: ResizeRecord | None


Effect = Reserve | Free | Launch | Stop | Notify | CommitAllocation | DrainUntil


def effects(before: ResizeState | None, fact: Fact, after: ResizeState) -> list[Effect]:
    """What the host must do once ``fact`` (turning ``before`` into ``after``) is durable."""
    job_id = after.job_id
    if isinstance(fact, GrowPlaced):
        return [Reserve(job_id, fact.tasks)]
    if (
        after.phase is Phase.SHRINK_DRAINING
        and (before is None or before.phase is not Phase.SHRINK_DRAINING)
        and after.change is not None
        and after.change.deadline is not None
    ):
        return [DrainUntil(job_id, after.change.deadline)]
    if isinstance(fact, NotifyStarted):
        change = after.change
        assert change is not None and change.notify_cmd is not None
        after_tasks = (
            joined(after.tasks, change.tasks)
            if change.kind is ChangeKind.GROW
            else without_tasks(after.tasks, change.tasks)
        )
        return [
            Notify(job_id, fact.attempt, change.notify_cmd, change.kind, change.tasks, after_tasks)
        ]
    if isinstance(fact, NotifyDone | GrowReverted | JobEnded):
        old = before.change if before is not None else None
        if old is not None and old.kind is ChangeKind.GROW and after.change is None:
            return [Free(job_id, tuple(t.id for t in old.tasks if t.id not in old.failed))]
        return []
    if isinstance(fact, TasksLaunched):
        change = after.change
        assert change is not None
        if change.kind is ChangeKind.GROW:
            return [Launch(job_id, unresolved(change))]
        return [Stop(job_id, task_ids(unresolved(change)))]
    if isinstance(fact, TaskStartFailed | TaskStopped | TasksStopped):
        return [Free(job_id, task_fact_ids(fact))]
    if isinstance(fact, ReadyTimedOut):
        # Stopped (SIGTERM, grace, SIGKILL) and freed now, as a task failing to start.
        return [Stop(job_id, fact.task_ids), Free(job_id, fact.task_ids)]
    if isinstance(fact, Committed):
        return [CommitAllocation(job_id, after.tasks, after.version, after.records[-1])]
    if isinstance(fact, TasksLost):
        return _loss_effects(before, fact, after)
    return []


def _loss_effects(before: ResizeState | None, fact: TasksLost, after: ResizeState) -> list[Effect]:
    """Free every slot the job no longer holds (the lost tasks, a grow sent back to
    pending), commit a shrunk allocation, and run the notification for information."""
    job_id = after.job_id
    still = {t.id for t in after.held}
    gone = tuple(t.id for t in (before.held if before is not None else ()) if t.id not in still)
    out: list[Effect] = [Free(job_id, gone or tuple(t.id for t in fact.tasks))]
    if before is not None and after.tasks != before.tasks:
        out.append(CommitAllocation(job_id, after.tasks, after.version, after.records[-1]))
        if fact.notify_cmd is not None and fact.attempt:
            delta = after.records[-1].delta
            out.append(
                Notify(
                    job_id,
                    fact.attempt,
                    fact.notify_cmd,
                    ChangeKind.SHRINK,
                    delta,
                    after.tasks,
                    after.version,
                )
            )
    return out


#: Facts that need not be durable before their effects: if a crash loses one, the
#: recovered state is the one before it, from which the dispatch decides it again, and
#: its effect (a launch or a stop of the change's tasks) is idempotent on the host
#: (docs/failover.md). With ``journal_defer`` the runtime writes them with the next
#: transaction rather than in one of their own.
DEFERRABLE = (TasksLaunched,)


def transition(
    state: ResizeState | None, facts: Sequence[Fact]
) -> tuple[ResizeState | None, list[Effect]]:
    """Fold ``facts`` into ``state`` and collect the effects they call for, in order:
    exactly :func:`evolve` and :func:`effects` fact by fact (tested), except that a run
    of one change's task facts at one instant (a batch of task events) is folded at
    once and frees its slots in one :class:`Free`."""
    out: list[Effect] = []
    i, n = 0, len(facts)
    while i < n:
        fact = facts[i]
        if state is not None and isinstance(fact, TASK_FACTS):
            j = i + 1
            while j < n and isinstance(facts[j], TASK_FACTS) and facts[j].at == fact.at:
                j += 1
            if j - i > 1:
                state = _task_run(state, facts[i:j], out)
                i = j
                continue
        after = evolve(state, fact)
        out.extend(effects(state, fact, after))
        state = after
        i += 1
    return state, out


def _task_run(state: ResizeState, run: Sequence[Fact], out: list[Effect]) -> ResizeState:
    change = state.change
    assert change is not None
    started, failed, stopped = set(change.started), set(change.failed), set(change.stopped)
    freed: list[int] = []
    for fact in run:
        assert isinstance(fact, TASK_FACTS)
        ids = task_fact_ids(fact)
        if isinstance(fact, TaskStarted | TasksStarted):
            started.update(ids)
        elif isinstance(fact, TaskStartFailed):
            failed.update(ids)
            freed.extend(ids)
        else:
            stopped.update(ids)
            freed.extend(ids)
    if freed:
        out.append(Free(state.job_id, tuple(freed)))
    new = rebuilt(
        change, started=frozenset(started), failed=frozenset(failed), stopped=frozenset(stopped)
    )
    # Steps of the charge timeline at one instant collapse into the last one, so one
    # step for the whole run is the step the facts one by one would leave.
    held = held_count(len(state.tasks), new)
    return rebuilt(state, change=new, charges=charge_steps(state.charges, run[0].at, held))


def resume_effects(state: ResizeState) -> list[Effect]:
    """Effects to re-issue after a failover; all idempotent on the host (docs/failover.md).

    The committed allocation and every slot the job should hold are asserted again, and
    every task id the job ever used but does not hold is freed, so a fact whose effect
    was lost in the crash (a reservation, a free) is made good either way.
    """
    job_id = state.job_id
    held = state.held
    held_ids = {t.id for t in held}
    out: list[Effect] = [
        CommitAllocation(job_id, state.tasks, state.version, None),
        Reserve(job_id, held),
    ]
    gone = tuple(i for i in range(state.next_task_id) if i not in held_ids)
    if gone:
        out.append(Free(job_id, gone))
    change = state.change
    if change is not None and change.deadline is not None and state.phase is Phase.SHRINK_DRAINING:
        out.append(DrainUntil(job_id, change.deadline))
    if change is not None and change.launched:
        if change.kind is ChangeKind.GROW:
            out.append(Launch(job_id, unresolved(change)))
        else:
            out.append(Stop(job_id, tuple(t.id for t in unresolved(change))))
    return out
