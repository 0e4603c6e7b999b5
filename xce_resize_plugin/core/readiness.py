"""Readiness: a grow with ``wait_ready`` is committed only once its new tasks are ready.

A task says it is ready with ``ResizeClient.ready()`` (a :class:`ReadyRequest`); the
fact :class:`TaskReady` keeps the ids in the job's state (``ResizeState.ready``). A grow
asked with ``wait_ready`` (``PendingGrow.ready_timeout``) gets a deadline when its tasks
are launched (``Change.ready_by``); it is committed when every task that started is
ready, and at the deadline its tasks that are not ready are failed
(:class:`ReadyTimedOut`: stopped, slots freed) and the ready ones are committed — or,
when none is, the grow goes back to pending like a grow none of whose tasks started.
docs/in-job-api.md, "Readiness and exits", says so to users.

Pure, like the engine: the deadline is data and the host feeds the time in (its
dispatch cycle). The engine calls these helpers; they know only the models.
"""

from __future__ import annotations

from typing import Any, TypeVar

import attrs

from xce_resize_plugin import errors
from xce_resize_plugin.core.allocations import describe_ids
from xce_resize_plugin.core.facts import ReadyTimedOut, TaskReady
from xce_resize_plugin.core.models import Change, ChangeKind, JobInfo, JobState, Phase, ResizeState

_T = TypeVar("_T", ResizeState, Change)


def waits(change: Change | None) -> bool:
    """Whether ``change`` is a grow asked with ``wait_ready``."""
    return (
        change is not None
        and change.kind is ChangeKind.GROW
        and change.pending is not None
        and change.pending.ready_timeout is not None
    )


def awaiting(change: Change, started: frozenset[int] | set[int], ready: frozenset[int]) -> bool:
    """Whether ``change``, every task of which is resolved, must still wait before it
    is committed: it waits for readiness and a started task is not ready yet."""
    return waits(change) and not started <= (ready | change.failed)


def launched_by(change: Change, at: float) -> Change:
    """``change`` as its launch at ``at`` leaves it: with its readiness deadline."""
    pending = change.pending
    if not waits(change) or pending is None or pending.ready_timeout is None:
        return change
    return _with(change, ready_by=at + pending.ready_timeout)


def check_ready(state: ResizeState | None, job: JobInfo, task_id: int) -> None:
    """Refuse a readiness report the job cannot have made: the job is not running, or
    ``task_id`` is not one of the tasks it holds."""
    if job.state is JobState.PEND:
        raise errors.NotStarted(f"job {job.id}")
    if job.state is not JobState.RUN or (state is not None and not state.live):
        raise errors.JobFinished(f"job {job.id}")
    held = state.held if state is not None else job.tasks
    if task_id not in {t.id for t in held}:
        raise errors.InvalidRequest(
            f"task {task_id} is not a task of job {job.id} "
            f"(its tasks: {describe_ids(t.id for t in held)})"
        )


def ready_fact(state: ResizeState, task_id: int, at: float) -> list[TaskReady]:
    """The fact recording that ``task_id`` is ready; none when it said so already."""
    if task_id in state.ready:
        return []
    return [TaskReady(job_id=state.job_id, at=at, task_ids=(task_id,))]


def timed_out(state: ResizeState, at: float) -> list[ReadyTimedOut]:
    """The deadline fact of the grow in flight, when its deadline has passed and some
    of its tasks are not ready (failed or not yet started tasks aside)."""
    change = state.change
    if (
        state.phase is not Phase.GROW_STARTING
        or change is None
        or change.ready_by is None
        or at < change.ready_by
    ):
        return []
    late = tuple(t.id for t in change.tasks if t.id not in state.ready | change.failed)
    if not late:
        return []
    return [ReadyTimedOut(job_id=state.job_id, at=at, task_ids=late)]


def fold_ready(state: ResizeState, fact: TaskReady) -> ResizeState:
    """Keep the ready ids of tasks the job holds (a task gone since is forgotten). A
    ready task of the grow in flight has started, whether or not its host said so
    yet (the report may come after the task's own call)."""
    held = {t.id for t in state.held}
    ready = frozenset(i for i in state.ready | set(fact.task_ids) if i in held)
    change = state.change
    if change is not None and change.kind is ChangeKind.GROW:
        mine = {t.id for t in change.tasks} & ready
        if not mine <= change.started:
            return _with(state, ready=ready, change=_with(change, started=change.started | mine))
    return _with(state, ready=ready)


def fold_timed_out(state: ResizeState, fact: ReadyTimedOut) -> ResizeState:
    """The late tasks count as failed to start: their slots are freed at this fact."""
    change = state.change
    assert change is not None
    return _with(state, change=_with(change, failed=change.failed | set(fact.task_ids)))


def _with(inst: _T, **changes: Any) -> _T:
    return attrs.evolve(inst, **changes)
