"""The resize state machine: commands -> checks -> facts -> new state.

Pure: no I/O, no clock reads, no globals. Every ``decide_*`` function takes the job's
current :class:`ResizeState` (``None`` when the plugin does not track the job yet), the
inputs of the event and the time, and returns the facts to append — or raises a
:class:`~xce_resize_plugin.errors.ResizeError`, in which case nothing changes.
:func:`~.fold.evolve` (:mod:`.fold`) folds one fact into the state;
:func:`~.effects.effects` (:mod:`.effects`) says what the host must do once a fact is
durable, and :func:`~.effects.transition` does both for a transition's facts. Replaying
a job's facts through :func:`~.fold.evolve` gives its materialised state exactly (the
journal stores both; ``journal verify`` compares them). The names callers used as
``engine.evolve``, ``engine.transition``, ``engine.Reserve`` and so on before fold and
effects had modules of their own are re-exported here, so those callers did not change.
The demand an autoresizable job keeps pending (:mod:`.demand`) and the decisions on
task events (:mod:`.task_event_decisions`) are parts of the engine in modules of their
own, below this one; their names are re-exported here too, and the engine's
:class:`Settings` are defined with the configuration they come from (:mod:`.config`).
Two kinds of decisions live above the engine and are called from their own modules:
a job's target size (:mod:`.target`) and involuntary shrinks (:mod:`.losses`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from xce_resize_plugin import errors
from xce_resize_plugin.core import readiness
from xce_resize_plugin.core.allocations import as_kept, with_ids

# The engine's settings live with the configuration they come from (config.py); the
# demand (demand.py) and the task events' decisions (task_event_decisions.py) have
# modules of their own. Their names are re-exported for callers of engine.<name>.
from xce_resize_plugin.core.config import Settings as Settings
from xce_resize_plugin.core.demand import autoresize_off as autoresize_off
from xce_resize_plugin.core.demand import decide_demand as decide_demand
from xce_resize_plugin.core.demand import demand_name
from xce_resize_plugin.core.demand import target_off as target_off
from xce_resize_plugin.core.demand import with_demand as with_demand

# Folding facts into states (fold.py) and the effects they call for (effects.py) have
# homes of their own; the names callers know as engine.<name> are re-exported here.
from xce_resize_plugin.core.effects import DEFERRABLE as DEFERRABLE
from xce_resize_plugin.core.effects import CommitAllocation as CommitAllocation
from xce_resize_plugin.core.effects import DrainUntil as DrainUntil
from xce_resize_plugin.core.effects import Effect as Effect
from xce_resize_plugin.core.effects import Free as Free
from xce_resize_plugin.core.effects import Launch as Launch
from xce_resize_plugin.core.effects import Notify as Notify
from xce_resize_plugin.core.effects import Reserve as Reserve
from xce_resize_plugin.core.effects import Stop as Stop
from xce_resize_plugin.core.effects import effects as effects
from xce_resize_plugin.core.effects import resume_effects as resume_effects
from xce_resize_plugin.core.effects import transition as transition
from xce_resize_plugin.core.facts import (
    AutoresizeSet,
    DrainEnded,
    Fact,
    GrowCancelled,
    GrowPlaced,
    GrowRequested,
    JobEnded,
    JobTracked,
    NotifyDone,
    NotifyStarted,
    ReleaseAccepted,
    TasksDrained,
    TasksLaunched,
)
from xce_resize_plugin.core.fold import demand_size as demand_size
from xce_resize_plugin.core.fold import evolve as evolve
from xce_resize_plugin.core.fold import replay as replay
from xce_resize_plugin.core.fold import unresolved
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    ChangeKind,
    DrainedRequest,
    GrowRequest,
    JobInfo,
    JobState,
    Phase,
    Principal,
    ReadyRequest,
    ReleaseRequest,
    ResizeRequest,
    ResizeState,
    TargetRequest,
    Task,
)
from xce_resize_plugin.core.placement import GrowHostView, place
from xce_resize_plugin.core.releasespec import MAX_COUNT, named_release_ids
from xce_resize_plugin.core.task_codec import HOSTS_MAX
from xce_resize_plugin.core.task_event_decisions import committed_exits as committed_exits
from xce_resize_plugin.core.task_event_decisions import completion as completion
from xce_resize_plugin.core.task_event_decisions import decide_task_event as decide_task_event
from xce_resize_plugin.core.task_event_decisions import decide_task_events as decide_task_events

#: LSF limits notification commands to "less than 4096" (bytes).
NOTIFY_CMD_MAX = 4096


class Policy(Protocol):
    """Site policy as the engine consults it (the runtime forwards to the policy hooks)."""

    def authorize(self, principal: Principal, job: JobInfo, action: str) -> bool: ...

    def validate(self, job: JobInfo, request: ResizeRequest) -> None: ...

    def select_release(
        self, job: JobInfo, candidates: Sequence[Task], count: int
    ) -> Sequence[int]: ...

    def order_grow_hosts(self, job: JobInfo, hosts: GrowHostView) -> Iterable[str]: ...


# --- requests ------------------------------------------------------------------------


def check_notify_cmd(cmd: str | None) -> None:
    """Reject a notification command LSF would reject (4096 bytes or more), and one no
    shell can be given: a NUL byte, or a string that is not text (a lone surrogate).
    Accepted, either would fail only when the change runs it, the job waiting."""
    if cmd is None:
        return
    try:
        size = len(cmd.encode())
    except UnicodeEncodeError:
        raise errors.InvalidRequest(
            "notify_cmd is not valid text (it has a lone surrogate) @ $.notify_cmd"
        ) from None
    if size >= NOTIFY_CMD_MAX:
        raise errors.NotifyCmdTooLong(f"{size} bytes")
    if "\0" in cmd:
        raise errors.InvalidRequest("notify_cmd must not contain a NUL byte @ $.notify_cmd")


def check_job_options(job: JobInfo) -> None:
    """Submission-time checks of a job's resize options (``xce_job_validate``)."""
    if job.min_tasks < 1:
        raise errors.BadSlots(f"min_tasks {job.min_tasks} must be at least 1")
    if job.min_tasks > job.max_tasks:
        raise errors.BadSlots(
            f"min_tasks {job.min_tasks} is greater than max_tasks {job.max_tasks}"
        )
    # A bound every count of the job stays under, as bresize's (the journal's records
    # hold them: a max_tasks of 2**64 could not be written at all), and what the
    # journal reads back of one allocation (a larger one was written, then unreadable).
    if job.max_tasks > MAX_COUNT:
        raise errors.BadSlots(f"max_tasks {job.max_tasks} is above {MAX_COUNT}")
    if job.max_tasks > HOSTS_MAX:
        raise errors.BadSlots(
            f"max_tasks {job.max_tasks} is above {HOSTS_MAX}, the most tasks the journal "
            "reads back of one allocation"
        )
    if job.ptile is not None and not 1 <= job.ptile <= MAX_COUNT:
        raise errors.InvalidRequest(f"ptile {job.ptile} must be from 1 to {MAX_COUNT}")
    check_notify_cmd(job.notify_cmd)
    if job.release_exited and not job.resizable:
        raise errors.InvalidRequest("release_exited needs a resizable job")
    if job.autoresize:
        if not job.resizable:
            raise errors.InvalidRequest("autoresize needs a resizable job (it implies resizable)")
        _check_autoresize_range(job)


def _check_autoresize_range(job: JobInfo) -> None:
    # LSF's bsub -ar takes -n min,max: without room above the start there is nothing
    # to grow into, and a demand that can never be placed is a mistake worth saying.
    if job.min_tasks >= job.max_tasks:
        raise errors.InvalidRequest(
            f"autoresize needs a task range -n MIN,MAX with MIN < MAX, "
            f"got {job.min_tasks},{job.max_tasks}"
        )


def check_if_version(state: ResizeState | None, job: JobInfo, if_version: int | None) -> None:
    """Refuse a change conditioned on an allocation version the job is no longer at."""
    version = state.version if state is not None else 0
    if if_version is not None and if_version < 0:
        raise errors.InvalidRequest(f"if_version must be at least 0, got {if_version}")
    if if_version is not None and if_version != version:
        raise errors.VersionChanged(
            f"job {job.id} is at allocation version {version}, not {if_version}"
        )


def check_resizable(job: JobInfo) -> None:
    """A resize needs the job running and resizable (LSF's codes otherwise)."""
    if job.state is JobState.PEND:
        raise errors.NotStarted(f"job {job.id}")
    if job.state in (JobState.DONE, JobState.EXIT):
        raise errors.JobFinished(f"job {job.id}")
    if not job.resizable:
        raise errors.JobNotResizable(f"job {job.id}")


def track_job(
    state: ResizeState | None, job: JobInfo, at: float, prior: ResizeState | None = None
) -> tuple[ResizeState, list[Fact]]:
    """The job's state, starting to track it (a JobTracked fact) on its first resize;
    ``prior``: the ended state of an earlier run of the job (requeued), continued."""
    if state is not None:
        return state, []
    fact = JobTracked(
        job_id=job.id,
        at=at,
        user=job.user,
        min_tasks=job.min_tasks,
        max_tasks=job.max_tasks,
        tasks=as_kept(job.tasks),
        started_at=job.start_time if job.start_time is not None else at,
    )
    return evolve(prior if prior is not None and not prior.live else None, fact), [fact]


def _notify_cmd(job: JobInfo, notify_cmd: str | None, no_notify: bool) -> str | None:
    if no_notify:
        return None
    return notify_cmd if notify_cmd is not None else job.notify_cmd


def decide_request(
    state: ResizeState | None,
    job: JobInfo,
    principal: Principal,
    request: ResizeRequest,
    at: float,
    policy: Policy,
    settings: Settings,
) -> list[Fact]:
    """Check a grow, release or cancel and return the facts that accept it."""
    action = _ACTIONS[type(request)]
    if not policy.authorize(principal, job, action):
        raise errors.PermissionDenied(f"{principal.name} may not {action} job {job.id}")
    principal_name = principal.name
    if isinstance(request, ReadyRequest):
        return decide_ready(state, job, request.task_id, at, settings)
    check_resizable(job)
    if state is not None and not state.live:
        raise errors.JobFinished(f"job {job.id}")
    if isinstance(request, TargetRequest):
        raise TypeError("a target is decided by core.target.decide_target")
    if isinstance(request, AutoresizeRequest):
        return _decide_autoresize(state, job, principal_name, request, at, policy, settings)
    if isinstance(request, DrainedRequest):
        policy.validate(job, request)
        return decide_drained(state, job.id, principal_name, request.task_ids, at)
    if isinstance(request, CancelRequest):
        if state is None or state.pending is None:
            raise errors.NoActiveRequest(f"job {job.id}")
        policy.validate(job, request)
        return [
            GrowCancelled(job_id=job.id, at=at, reason="cancel"),
            *autoresize_off(state, at, principal_name, "cancel"),
            *target_off(state, at, principal_name, "cancel"),
        ]
    if request.notify_cmd is not None and request.no_notify:
        raise errors.InvalidRequest("notify_cmd and no_notify are mutually exclusive")
    check_notify_cmd(request.notify_cmd)
    if state is not None and state.change is not None:
        raise errors.ResizeInProgress(f"job {job.id} has a {state.change.kind.value} in flight")
    check_if_version(state, job, request.if_version)
    if (
        state is not None
        and state.pending is not None
        and not request.cancel_pending
        # The autoresize demand is the plugin's, not a request: a release goes ahead
        # and the demand is made again once the release is settled.
        and not (state.pending.auto and isinstance(request, ReleaseRequest))
    ):
        what = demand_name(state) if state.pending.auto else "it"
        raise errors.PendingRequest(f"job {job.id}; use -c to cancel {what} first")
    if isinstance(request, GrowRequest):
        return _decide_grow(state, job, principal_name, request, at, policy, settings)
    return _decide_release(state, job, principal_name, request, at, policy, settings)


def _decide_grow(
    state: ResizeState | None,
    job: JobInfo,
    principal_name: str,
    request: GrowRequest,
    at: float,
    policy: Policy,
    settings: Settings,
) -> list[Fact]:
    if not settings.allow_grow:
        raise errors.RequestNotEnabled("allow_grow is off in the [resize] configuration")
    if request.min_add < 1 or request.max_add < request.min_add:
        raise errors.BadSlots(
            f"request needs 1 <= min_tasks <= tasks, got {request.min_add},{request.max_add}"
        )
    current = len(state.tasks) if state is not None else len(job.tasks)
    if current + request.min_add > job.max_tasks:
        raise errors.BadSlots(
            f"job has {current} tasks and max_tasks {job.max_tasks}: "
            f"cannot add at least {request.min_add}"
        )
    ready_timeout = _ready_timeout(request, settings)
    policy.validate(job, request)
    state, facts = track_job(state, job, at)
    # A manual request replaces the demand and ends autoresize (as in LSF), and the
    # target: whoever resizes by hand takes over from it (docs/in-job-api.md).
    facts.extend(autoresize_off(state, at, principal_name, "request"))
    facts.extend(target_off(state, at, principal_name, "request"))
    if state.pending is not None:
        facts.append(GrowCancelled(job_id=job.id, at=at, reason="replaced"))
    facts.append(
        GrowRequested(
            job_id=job.id,
            at=at,
            min_add=request.min_add,
            max_add=min(request.max_add, job.max_tasks - current),
            notify_cmd=_notify_cmd(job, request.notify_cmd, request.no_notify),
            principal=principal_name,
            ready_timeout=ready_timeout,
        )
    )
    return facts


def release_ids(
    tasks: Sequence[Task], job: JobInfo, request: ReleaseRequest, policy: Policy
) -> tuple[int, ...]:
    named = named_release_ids(request, tasks)
    if named is not None:
        return named
    count = request.count
    assert count is not None
    candidates = tuple(t for t in tasks if t.id != 0)
    if count < 1 or count > len(candidates):
        raise errors.BadSlots(f"cannot release {count} of {len(candidates)} releasable tasks")
    chosen = tuple(policy.select_release(job, candidates, count))
    allowed = {t.id for t in candidates}
    if len(chosen) != count or len(set(chosen)) != count or not set(chosen) <= allowed:
        raise errors.PolicyRejected(
            f"xce_resize_select_release returned {list(chosen)} for {count} of {sorted(allowed)}"
        )
    return tuple(sorted(chosen))


def _decide_release(
    state: ResizeState | None,
    job: JobInfo,
    principal_name: str,
    request: ReleaseRequest,
    at: float,
    policy: Policy,
    settings: Settings,
) -> list[Fact]:
    grace = check_grace(
        request.grace if request.grace is not None else job.grace, settings, "grace"
    )
    tasks = state.tasks if state is not None else as_kept(job.tasks)
    ids = set(release_ids(tasks, job, request, policy))
    remaining = len(tasks) - len(ids)
    if remaining < job.min_tasks:
        raise errors.BadSlots(
            f"releasing {len(ids)} of {len(tasks)} tasks leaves {remaining}, "
            f"below min_tasks {job.min_tasks}"
        )
    policy.validate(job, request)
    state, facts = track_job(state, job, at)
    facts.extend(target_off(state, at, principal_name, "release"))
    cancelled = state.pending is not None
    if cancelled:
        auto = state.pending is not None and state.pending.auto
        facts.append(GrowCancelled(job_id=job.id, at=at, reason="release" if auto else "cancel"))
    facts.append(
        ReleaseAccepted(
            job_id=job.id,
            at=at,
            tasks=with_ids(tasks, ids),
            notify_cmd=_notify_cmd(job, request.notify_cmd, request.no_notify),
            principal=principal_name,
            cancelled_pending=cancelled,
            grace=grace,
        )
    )
    return facts


_ACTIONS: dict[type, str] = {
    GrowRequest: "grow",
    ReleaseRequest: "release",
    CancelRequest: "cancel",
    AutoresizeRequest: "modify",
    ReadyRequest: "ready",
    DrainedRequest: "drained",
    TargetRequest: "target",
}


# --- readiness (core/readiness.py; docs/in-job-api.md, "Readiness and exits") --------


def _ready_timeout(request: GrowRequest, settings: Settings) -> float | None:
    """A grow's readiness wait in seconds (``None``: it does not wait), checked against
    the site's ``max_ready_timeout``."""
    if not request.wait_ready:
        if request.ready_timeout is not None:
            raise errors.InvalidRequest("ready_timeout needs wait_ready")
        return None
    timeout = request.ready_timeout
    if timeout is None:
        return settings.max_ready_timeout
    if not 0 < timeout <= settings.max_ready_timeout:
        raise errors.InvalidRequest(
            f"ready_timeout must be more than 0 and at most the site's maximum "
            f"{settings.max_ready_timeout:g} seconds ([resize] max_ready_timeout), "
            f"got {timeout:g}"
        )
    return float(timeout)


def decide_ready(
    state: ResizeState | None, job: JobInfo, task_id: int, at: float, settings: Settings
) -> list[Fact]:
    """Task ``task_id`` says it is ready: recorded once (a job the plugin does not track
    yet has no grow to wait for: nothing to record); the grow waiting for it is
    committed when it was the last one."""
    readiness.check_ready(state, job, task_id)
    if state is None:
        return []
    facts: list[Fact] = list(readiness.ready_fact(state, task_id, at))
    if not facts:
        return []
    after = evolve(state, facts[0])
    change = after.change
    if (
        after.phase is Phase.GROW_STARTING
        and change is not None
        and readiness.waits(change)
        and not unresolved(change)
        and not readiness.awaiting(change, change.started, after.ready)
    ):
        facts.append(completion(after, change, bool(change.started - change.failed), at, settings))
        return with_demand(state, facts, at, settings)
    return facts


def decide_ready_deadline(state: ResizeState, at: float, settings: Settings) -> list[Fact]:
    """At the dispatch cycle: a grow whose readiness deadline has passed fails its late
    tasks and is settled (the ready ones committed; none ready: back to pending)."""
    facts: list[Fact] = list(readiness.timed_out(state, at))
    if not facts:
        return []
    after = evolve(state, facts[0])
    change = after.change
    assert change is not None
    facts.append(completion(after, change, bool(change.started - change.failed), at, settings))
    return with_demand(state, facts, at, settings)


# --- drain before stop -----------------------------------------------------------------
# A release with a drain time (grace) enters SHRINK_DRAINING once its notification
# succeeded (at once without one): the tasks run on, the job hears of the coming stop
# (a release_coming event with the deadline), and the stop begins when the deadline
# passes (the host's dispatch cycle feeds the clock in) or when the job acknowledged
# every task drained. The slots stay charged until each task is stopped.


def check_grace(grace: float, settings: Settings, what: str) -> float:
    """A drain time: a finite number of seconds from 0 to ``max_stop_grace``."""
    if isinstance(grace, bool) or not isinstance(grace, int | float) or not grace >= 0:
        raise errors.InvalidRequest(f"{what} must be a number of seconds >= 0, got {grace!r}")
    if grace > settings.max_stop_grace:
        # However large (an int beyond any float, infinity): too long, and said so.
        shown = f"{grace:g}" if grace < 1e300 else ">= 1e300"
        raise errors.GraceTooLong(
            f"{what} {shown} s is above the site maximum max_stop_grace "
            f"{settings.max_stop_grace:g} s"
        )
    return float(grace)


def decide_drained(
    state: ResizeState | None,
    job_id: str,
    principal_name: str,
    task_ids: Sequence[int],
    at: float,
) -> list[Fact]:
    """The job acknowledged ``task_ids`` drained: each must be a task of the release
    being drained; once every task is acknowledged the drain ends (the stop begins).
    Acknowledging a task again changes nothing."""
    change = state.change if state is not None else None
    if state is None or change is None or state.phase is not Phase.SHRINK_DRAINING:
        raise errors.NotDraining(f"job {job_id} has no release draining")
    ids = tuple(sorted(set(task_ids)))
    draining = {t.id for t in change.tasks} - change.stopped
    if not ids:
        raise errors.InvalidRequest("drained: task_ids must name at least one task")
    stray = [i for i in ids if i not in draining]
    if stray:
        raise errors.NotDraining(
            f"tasks {stray} of job {job_id} are not being drained (draining: {sorted(draining)})"
        )
    new = tuple(i for i in ids if i not in change.drained)
    if not new:
        return []
    facts: list[Fact] = [TasksDrained(state.job_id, at, new, principal_name)]
    if draining <= change.drained | set(new):
        facts.append(DrainEnded(state.job_id, at, "drained"))
    return facts


def _drain_due(state: ResizeState, at: float) -> list[Fact]:
    """The drain's deadline passed: the stop begins, in the same decision (a host in
    simulated time cycles again only when something of its own changed)."""
    change = state.change
    if change is not None and change.deadline is not None and at >= change.deadline:
        return [DrainEnded(state.job_id, at, "deadline"), TasksLaunched(state.job_id, at)]
    return []


# --- autoresize ------------------------------------------------------------------------
# An autoresizable job (LSF's bsub -ar) keeps a grow pending whenever it is idle below
# max_tasks: the demand (demand.py, with_demand, which says why it is added in the same
# transition as the fact that makes it due). Here: the job's start and the requests
# that turn autoresize on or off.


def decide_job_start(
    state: ResizeState | None, job: JobInfo, at: float, settings: Settings
) -> list[Fact]:
    """A job started: an autoresizable one is tracked from now with its demand. Any
    other job, or one tracked already (the host reports starts again after a failover),
    gives no fact."""
    if state is not None or not job.autoresize or job.state is not JobState.RUN:
        return []
    if not job.resizable or job.min_tasks >= job.max_tasks or not job.tasks:
        return []  # refused at submission by check_job_options; never tracked blind
    _, facts = track_job(None, job, at)
    facts.append(AutoresizeSet(job.id, at, True, job.notify_cmd, job.user, "submit"))
    return with_demand(None, facts, at, settings)


def _decide_autoresize(
    state: ResizeState | None,
    job: JobInfo,
    principal_name: str,
    request: AutoresizeRequest,
    at: float,
    policy: Policy,
    settings: Settings,
) -> list[Fact]:
    """Turn autoresize on or off; asking for what already holds changes nothing."""
    if not request.enabled:
        policy.validate(job, request)
        if state is None or not state.autoresize:
            return []
        facts = autoresize_off(state, at, principal_name, "modify")
        if state.pending is not None and state.pending.auto:
            facts.append(GrowCancelled(job_id=job.id, at=at, reason="autoresize-off"))
        return facts
    _check_autoresize_range(job)
    if state is not None and state.autoresize:
        policy.validate(job, request)
        return []
    # Turning autoresize on replaces a target (the last word wins) and its grow.
    cleared = target_off(state, at, principal_name, "autoresize")
    if state is not None and state.pending is not None and not cleared:
        raise errors.PendingRequest(f"job {job.id}; cancel the pending grow first")
    change = state.change if state is not None else None
    if change is not None and change.kind is ChangeKind.GROW:
        # A grow someone asked for is being placed: it may yet go back to pending, and
        # a job has one pending grow, the demand or that one.
        raise errors.ResizeInProgress(f"job {job.id} has a grow in flight")
    if not settings.allow_grow:
        raise errors.RequestNotEnabled("allow_grow is off in the [resize] configuration")
    policy.validate(job, request)
    _, facts = track_job(state, job, at)
    facts.extend(cleared)
    if cleared and state is not None and state.pending is not None:
        facts.append(GrowCancelled(job_id=job.id, at=at, reason="autoresize"))
    facts.append(AutoresizeSet(job.id, at, True, job.notify_cmd, principal_name, "modify"))
    return with_demand(state, facts, at, settings)


# --- scheduler, dispatch, events ----------------------------------------------------


def decide_placement(
    state: ResizeState,
    job: JobInfo,
    hosts: GrowHostView,
    headroom: int | None,
    policy: Policy,
    at: float,
) -> list[Fact]:
    """Place a pending grow on the cycle's free slots; no fact when below its minimum."""
    pending = state.pending
    if state.phase is not Phase.GROW_PENDING or pending is None:
        return []
    placement = place(
        policy.order_grow_hosts(job, hosts),
        hosts,
        min_add=pending.min_add,
        max_add=min(pending.max_add, state.max_tasks - len(state.tasks)),
        ptile=job.ptile,
        grow_hosts=job.grow_hosts,
        headroom=headroom,
    )
    if placement is None:
        return []
    tasks: list[Task] = []
    next_id = state.next_task_id
    for host, n in placement.hosts:
        for _ in range(n):
            tasks.append(Task(next_id, host))
            next_id += 1
    return [GrowPlaced(job_id=state.job_id, at=at, tasks=tuple(tasks))]


def decide_dispatch(state: ResizeState, at: float) -> list[Fact]:
    """Start the next step of the change in flight, if it is waiting to be started."""
    change = state.change
    if change is None:
        return []
    if state.phase in (Phase.GROW_NOTIFYING, Phase.SHRINK_NOTIFYING) and change.attempt == 0:
        return [NotifyStarted(job_id=state.job_id, at=at, attempt=state.notify_attempts + 1)]
    if state.phase in (Phase.GROW_STARTING, Phase.SHRINK_STOPPING) and not change.launched:
        return [TasksLaunched(job_id=state.job_id, at=at)]
    if state.phase is Phase.SHRINK_DRAINING:
        return _drain_due(state, at)
    return []


def decide_recover(state: ResizeState, at: float) -> list[Fact]:
    """After a failover: a notification that was running is run again (docs/failover.md)."""
    change = state.change
    if (
        change is not None
        and state.phase in (Phase.GROW_NOTIFYING, Phase.SHRINK_NOTIFYING)
        and change.attempt != 0
    ):
        return [NotifyStarted(job_id=state.job_id, at=at, attempt=state.notify_attempts + 1)]
    return []


def decide_notify_done(
    state: ResizeState,
    attempt: int,
    status: int | None,
    reason: str,
    at: float,
    settings: Settings,
) -> list[Fact]:
    """The notification's verdict; a late answer of an earlier attempt is ignored."""
    change = state.change
    notifying = state.phase in (Phase.GROW_NOTIFYING, Phase.SHRINK_NOTIFYING)
    if change is None or not notifying or attempt != change.attempt:
        return []
    ok = status == 0
    gave_up = False
    if not ok and change.kind is ChangeKind.GROW and change.pending is not None:
        gave_up = change.pending.failures + 1 >= settings.notify_max_failures
    facts: list[Fact] = [
        NotifyDone(
            job_id=state.job_id,
            at=at,
            attempt=attempt,
            ok=ok,
            status=status,
            reason=reason or (f"exit {status}" if status is not None else "no status"),
            gave_up=gave_up,
        )
    ]
    return with_demand(state, facts, at, settings)


def decide_job_end(state: ResizeState, at: float, requeued: bool = False) -> list[Fact]:
    """The job finished (or, ``requeued``, its run ended and the host queued it again):
    cancel its pending grow and end tracking."""
    if not state.live:
        return []
    facts: list[Fact] = []
    if state.pending is not None:
        facts.append(GrowCancelled(job_id=state.job_id, at=at, reason="job-ended"))
    facts.append(JobEnded(job_id=state.job_id, at=at, requeued=requeued))
    return facts


def decide_requeued_start(prior: ResizeState | None, job: JobInfo, at: float) -> list[Fact]:
    """A requeued job started again whose earlier run the journal holds (``prior``,
    ended ``requeued``): tracked from now on top of it, so its history goes on and is
    no longer held for it. Nothing for any other job (an autoresizable one is tracked
    by :func:`decide_job_start`)."""
    if prior is None or prior.live or not prior.requeued or job.autoresize:
        return []
    if job.state is not JobState.RUN or not job.tasks:
        return []
    if job.start_time is None or job.start_time <= prior.started_at:
        # The run the requeue ended, still running while the host stops its processes
        # (its start reported again after a failover): not a new run.
        return []
    _, facts = track_job(None, job, at, prior)
    return facts


def decide_requeued_end(prior: ResizeState | None, at: float) -> list[Fact]:
    """A requeued job ended while it waited to start again (killed in the queue): its
    earlier run's ended state is no longer held for a next run."""
    if prior is None or prior.live or not prior.requeued:
        return []
    return [JobEnded(job_id=prior.job_id, at=at)]
