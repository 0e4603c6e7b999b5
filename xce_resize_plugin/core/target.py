"""A job's target size: set, cleared, and converged on (docs/in-job-api.md, "A target
size").

A target is a declaration: "hold N tasks". Below it, the job's demand — the same
pending grow the engine keeps for autoresize (:func:`.engine.demand_size`) — asks for
the missing tasks and is placed like any grow; above it, the plugin releases the extra
tasks, the preferred ones first, else those the ``xce_resize_select_release`` policy
picks (never task 0). The engine restates the demand in the transition that makes it
due (a commit, a failed change, a host failure); the release needs the site's policy,
so the runtime asks :func:`decide_converge` after those transitions.

Pure, like the engine: no I/O, no clock reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from xce_resize_plugin import errors
from xce_resize_plugin.core.engine import (
    Policy,
    Settings,
    autoresize_off,
    check_resizable,
    evolve,
    release_ids,
    target_off,
    track_job,
    with_demand,
)
from xce_resize_plugin.core.facts import Fact, GrowCancelled, ReleaseAccepted, TargetSet
from xce_resize_plugin.core.models import (
    JobInfo,
    Phase,
    Principal,
    ReleaseRequest,
    ResizeState,
    Target,
    TargetRequest,
    Task,
)

#: Most task ids a target's ``release_prefer`` may list.
MAX_PREFER = 4096


def _fold(state: ResizeState | None, facts: Sequence[Fact]) -> ResizeState | None:
    for fact in facts:
        state = evolve(state, fact)
    return state


def check_prefer(state: ResizeState | None, job: JobInfo, prefer: Sequence[int]) -> tuple[int, ...]:
    """``release_prefer`` checked: task ids the job holds (its allocation or a grow in
    flight), never task 0, none twice (as a release by task ids is checked)."""
    if len(prefer) > MAX_PREFER:
        raise errors.InvalidRequest(f"release_prefer lists {len(prefer)} ids, at most {MAX_PREFER}")
    held = {t.id for t in (state.held if state is not None else job.tasks)}
    seen: set[int] = set()
    for task_id in prefer:
        if task_id in seen:
            raise errors.InvalidRequest(f"release_prefer: task {task_id} is listed more than once")
        seen.add(task_id)
        if task_id == 0:
            raise errors.ReleaseFirstHost("release_prefer: task 0 is the job's head task")
        if task_id not in held:
            raise errors.InvalidRequest(
                f"release_prefer: task {task_id} is not part of the job's allocation"
            )
    return tuple(prefer)


def decide_target(
    state: ResizeState | None,
    job: JobInfo,
    principal: Principal,
    request: TargetRequest,
    at: float,
    policy: Policy,
    settings: Settings,
) -> list[Fact]:
    """Set or clear the job's target; the facts also start converging on it (the
    demand for a target above the job's size, the release for one below)."""
    if not policy.authorize(principal, job, "target"):
        raise errors.PermissionDenied(f"{principal.name} may not set the target of job {job.id}")
    check_resizable(job)
    if state is not None and not state.live:
        raise errors.JobFinished(f"job {job.id}")
    if request.tasks is None:
        policy.validate(job, request)
        return _clear(state, at, principal.name)
    tasks = request.tasks
    if not job.min_tasks <= tasks <= job.max_tasks:
        raise errors.BadSlots(
            f"target {tasks} is outside the job's task range {job.min_tasks}..{job.max_tasks}"
        )
    current = len(state.tasks) if state is not None else len(job.tasks)
    if tasks > current and not settings.allow_grow:
        raise errors.RequestNotEnabled("allow_grow is off in the [resize] configuration")
    target = Target(tasks, check_prefer(state, job, request.release_prefer), job.notify_cmd)
    policy.validate(job, request)
    if state is not None and state.target == target:
        return []  # what already holds: nothing to write
    tracked, facts = track_job(state, job, at)
    facts.extend(autoresize_off(tracked, at, principal.name, "target"))
    pending = tracked.pending
    if pending is not None and (not pending.auto or tasks <= current):
        # A grow someone asked for is replaced; the demand is kept (its place in the
        # queue too) while it still fits, and restated when its size changed.
        facts.append(GrowCancelled(job_id=job.id, at=at, reason="target"))
    facts.append(TargetSet(job.id, at, target, principal.name, "set"))
    facts = with_demand(state, facts, at, settings)
    after = _fold(state, facts)
    assert after is not None
    return [*facts, *decide_converge(after, job, at, policy)]


def _clear(state: ResizeState | None, at: float, principal: str) -> list[Fact]:
    """The target cleared, and the grow it kept pending cancelled; the job keeps its
    size. Clearing no target changes nothing."""
    facts = target_off(state, at, principal, "clear")
    if facts and state is not None and state.pending is not None and state.pending.auto:
        facts.append(GrowCancelled(job_id=state.job_id, at=at, reason="target-cleared"))
    return facts


def release_choice(
    tasks: Sequence[Task], job: JobInfo, target: Target, count: int, policy: Policy
) -> tuple[int, ...]:
    """The ``count`` task ids to release: the preferred ones the job still holds, in
    the order given, then those the release policy picks; never task 0."""
    held = {t.id for t in tasks}
    preferred = [i for i in target.release_prefer if i in held and i != 0][:count]
    rest = count - len(preferred)
    if rest == 0:
        return tuple(sorted(preferred))
    chosen = set(preferred)
    others = tuple(t for t in tasks if t.id not in chosen)
    picked = release_ids(others, job, ReleaseRequest(count=rest), policy)
    return tuple(sorted((*preferred, *picked)))


def decide_converge(state: ResizeState, job: JobInfo, at: float, policy: Policy) -> list[Fact]:
    """The release that brings an idle job above its target down to it (no fact
    otherwise: below the target the engine's demand grows it, and a change in flight
    is settled first). Never below ``min_tasks``."""
    target = state.target
    if target is None or not state.live or state.phase is not Phase.IDLE:
        return []
    count = min(len(state.tasks) - target.tasks, len(state.tasks) - job.min_tasks)
    if count < 1:
        return []
    ids = set(release_choice(state.tasks, job, target, count, policy))
    return [
        ReleaseAccepted(
            job_id=state.job_id,
            at=at,
            tasks=tuple(t for t in state.tasks if t.id in ids),
            notify_cmd=target.notify_cmd,
            principal="target",
            cancelled_pending=False,
        )
    ]


__all__ = ["MAX_PREFER", "check_prefer", "decide_converge", "decide_target", "release_choice"]
