"""Involuntary shrinks: tasks a job loses with a failed host, or that exit on their own.

A host that fails takes its tasks with it. A resizable job that keeps task 0 and at
least ``min_tasks`` loses them as an involuntary shrink (:func:`decide_host_loss`); any
other job ends or is requeued by the host. How each in-flight state is settled:
docs/failover.md. A ``release_exited`` job drops tasks that exit on their own the same
way (:func:`decide_task_exit`). Pure, like the engine, whose helpers it uses.
"""

from __future__ import annotations

from collections.abc import Iterable

from xce_resize_plugin import errors
from xce_resize_plugin.core import readiness
from xce_resize_plugin.core.allocations import task_ids
from xce_resize_plugin.core.engine import (
    Settings,
    committed_exits,
    completion,
    track_job,
    with_demand,
)
from xce_resize_plugin.core.facts import Fact, TasksLost
from xce_resize_plugin.core.fold import evolve
from xce_resize_plugin.core.models import JobInfo, JobState, Phase, ResizeState, TaskEvent


def survives_loss(state: ResizeState | None, job: JobInfo, lost_ids: Iterable[int]) -> bool:
    """Whether ``job`` can lose the tasks ``lost_ids`` and go on running: it is
    resizable, keeps task 0, and keeps at least ``min_tasks`` once a release being
    stopped is complete."""
    if not job.resizable or job.state is not JobState.RUN:
        return False
    lost = set(lost_ids)
    tasks = state.tasks if state is not None else job.tasks
    if not tasks or tasks[0].id in lost:
        return False
    kept = {t.id for t in tasks} - lost
    if (
        state is not None
        and state.phase in (Phase.SHRINK_STOPPING, Phase.SHRINK_DRAINING)
        and state.change is not None
    ):
        kept -= set(task_ids(state.change.tasks))
    return len(kept) >= job.min_tasks


def decide_host_loss(
    state: ResizeState | None,
    job: JobInfo,
    host: str,
    lost_ids: Iterable[int],
    at: float,
    settings: Settings,
    prior: ResizeState | None = None,
) -> list[Fact]:
    """The facts of a job losing the tasks ``lost_ids`` on the failed ``host``, when it
    :func:`survives_loss` (else the host ends or requeues it: no fact here). Task ids
    the job does not hold are ignored; no fact when it holds none of them. ``prior``:
    for an untracked job, the ended state of its earlier run (a requeued job), whose
    allocation versions go on."""
    if not survives_loss(state, job, lost_ids):
        raise errors.InvalidRequest(f"job {job.id} cannot lose tasks {sorted(lost_ids)}")
    facts = _loss_facts(state, job, host, set(lost_ids), at, settings, prior, "host_failure")
    # An autoresizable job's demand follows its new size (it grows back elsewhere).
    return with_demand(state, facts, at, settings) if facts else []


def _loss_facts(
    state: ResizeState | None,
    job: JobInfo,
    host: str,
    wanted: set[int],
    at: float,
    settings: Settings,
    prior: ResizeState | None,
    reason: str,
) -> list[Fact]:
    """The TasksLost fact (and the completion of the change it resolves) of the tasks
    ``wanted`` the job holds on ``host``, gone for ``reason``."""
    held = state.held if state is not None else job.tasks
    lost = tuple(t for t in held if t.id in wanted and t.host == host)
    if not lost:
        return []
    state, facts = track_job(state, job, at, prior)
    committed_lost = any(t.id in wanted for t in state.tasks)
    version = state.version + 1 if committed_lost else state.version
    notify = job.notify_cmd if committed_lost else None
    fact = TasksLost(
        job_id=job.id,
        at=at,
        host=host,
        tasks=lost,
        version=version,
        attempt=state.notify_attempts + 1 if notify is not None else 0,
        notify_cmd=notify,
        reason=reason,
    )
    facts.append(fact)
    after = evolve(state, fact)
    change = after.change
    if change is not None:
        done = change.started | change.failed | change.stopped
        started = change.started - change.failed
        if all(t.id in done for t in change.tasks) and not readiness.awaiting(
            change, started, after.ready
        ):
            # The loss resolved the change's last tasks: it completes now.
            facts.append(completion(after, change, bool(started), at, settings))
    return facts


def decide_untracked_exits(job: JobInfo, events: Iterable[TaskEvent], at: float) -> list[Fact]:
    """Tasks of a running resizable job the plugin does not track yet exited on their
    own (not task 0, not stopped by the host): the plugin starts tracking the job so
    that the job is told (``tasks_exited`` events); its allocation does not change."""
    if not (job.resizable and job.state is JobState.RUN and job.tasks):
        return []
    state, facts = track_job(None, job, at)
    head = job.tasks[0].id
    exits = committed_exits(
        state, [e for e in events if not e.stopped and e.task_id != head], set(), at
    )
    return facts + exits if exits else []


def decide_task_exit(
    state: ResizeState | None,
    job: JobInfo,
    events: Iterable[TaskEvent],
    at: float,
    settings: Settings,
) -> list[Fact]:
    """``release_exited``: committed tasks other than task 0 that exited on their own
    while the job runs leave the allocation, one involuntary shrink per host (reason
    ``task_exit``; docs/in-job-api.md, "Readiness and exits"). Unlike a host failure
    this never ends the job: a task that is gone is dropped even below ``min_tasks``.
    Tasks of the change in flight are the change's own (decide_task_events)."""
    if not (job.release_exited and job.resizable and job.state is JobState.RUN):
        return []
    if state is not None and not state.live:
        return []
    tasks = state.tasks if state is not None else job.tasks
    if not tasks:
        return []
    change = state.change if state is not None else None
    ours = set(task_ids(change.tasks)) if change is not None else set()
    gone = {
        e.task_id
        for e in events
        if e.kind == "exited" and not e.stopped and e.job_id == job.id and e.task_id not in ours
    }
    gone.discard(tasks[0].id)
    hosts = list(dict.fromkeys(t.host for t in tasks if t.id in gone))
    facts: list[Fact] = []
    current = state
    for host in hosts:
        more = _loss_facts(current, job, host, gone, at, settings, None, "task_exit")
        for fact in more:
            current = evolve(current, fact)
        facts.extend(more)
    return with_demand(state, facts, at, settings) if facts else []
