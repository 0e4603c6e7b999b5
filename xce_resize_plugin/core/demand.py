"""The demand: the grow an autoresizable job, or one with a target, keeps pending.

Part of the engine (:mod:`.engine`, which re-exports these names): pure, no I/O, no
clock reads. :func:`with_demand` adds the demand to a transition's facts, in the same
transition as the fact that makes it due; the target (:mod:`.target`) and the task
events (:mod:`.task_event_decisions`) call it too.
"""

from __future__ import annotations

from xce_resize_plugin.core.config import Settings
from xce_resize_plugin.core.facts import (
    AutoresizeSet,
    Fact,
    GrowRequested,
    GrowReverted,
    NotifyDone,
    TargetSet,
)
from xce_resize_plugin.core.fold import demand_size, evolve
from xce_resize_plugin.core.models import Phase, ResizeState

# An autoresizable job (LSF's bsub -ar) has one grow pending of 1..max_tasks - current
# whenever it is idle below max_tasks: the demand (PendingGrow.auto). It is decided here,
# in the same transition as the fact that makes it due (the job's start, a commit, a
# failed change, autoresize turned on), so the journal never holds an autoresizable idle
# job without it (docs/user-guide.md, "Autoresizable jobs").


def autoresize_off(state: ResizeState | None, at: float, principal: str, reason: str) -> list[Fact]:
    """Autoresize turned off, if it was on (a manual change or a target takes over)."""
    if state is None or not state.autoresize:
        return []
    return [AutoresizeSet(state.job_id, at, False, None, principal, reason)]


def target_off(state: ResizeState | None, at: float, principal: str, reason: str) -> list[Fact]:
    """The job's target cleared, if it has one (a manual change takes over)."""
    if state is None or state.target is None:
        return []
    return [TargetSet(state.job_id, at, None, principal, reason)]


def demand_name(state: ResizeState) -> str:
    return "the target's grow" if state.target is not None else "the autoresize demand"


def _demand(state: ResizeState, at: float, settings: Settings) -> GrowRequested | None:
    """The demand the state calls for now, if it has none and is due one — or a new
    one when its pending demand no longer fits its size (tasks were lost meanwhile).
    The same machinery serves autoresize and a target (``demand_size``)."""
    size = demand_size(state)
    room = (size if size is not None else 0) - len(state.tasks)
    pending = state.pending
    due = state.phase is Phase.IDLE and pending is None
    stale = (
        pending is not None
        and pending.auto
        and state.phase is Phase.GROW_PENDING
        and pending.max_add != room
    )
    if size is None or not settings.allow_grow or room < 1 or not (due or stale):
        return None
    target = state.target
    return GrowRequested(
        job_id=state.job_id,
        at=at,
        min_add=1,
        max_add=room,
        notify_cmd=state.autoresize_notify if target is None else target.notify_cmd,
        principal="autoresize" if target is None else "target",
        auto=True,
    )


def with_demand(
    state: ResizeState | None, facts: list[Fact], at: float, settings: Settings
) -> list[Fact]:
    """``facts`` and, for an autoresizable job or one with a target, the demand the
    state after them calls for; or autoresize turned off (the target cleared) when they
    gave up the demand's grow (it would only fail again), or when the notification
    command vetoed a release the target asked for."""
    if not (state is not None and demand_size(state) is not None) and not any(
        isinstance(f, AutoresizeSet | TargetSet) for f in facts
    ):
        return facts  # the common case: no fold
    after = state
    for fact in facts:
        after = evolve(after, fact)
    if after is None or not after.live or demand_size(after) is None:
        return facts
    shrinking = state is not None and state.phase is Phase.SHRINK_NOTIFYING
    if (
        after.target is not None
        and shrinking
        and any(isinstance(f, NotifyDone) and not f.ok for f in facts)
    ):
        # The job's notification command refused a release the target asked for: the
        # plugin does not insist (it would only be refused again).
        return [*facts, *target_off(after, at, "target", "vetoed")]
    if any(isinstance(f, NotifyDone | GrowReverted) and f.gave_up for f in facts):
        if after.target is None:
            return [*facts, AutoresizeSet(after.job_id, at, False, None, "autoresize", "given-up")]
        change = state.change if state is not None else None
        if change is not None and change.pending is not None and change.pending.auto:
            return [*facts, *target_off(after, at, "target", "given-up")]
        # A grow someone asked for before the target was set gave up: not the target's.
    demand = _demand(after, at, settings)
    return facts if demand is None else [*facts, demand]


def decide_demand(state: ResizeState, at: float, settings: Settings) -> list[Fact]:
    """After a failover: the demand an autoresizable job is due, if it lacks one (a
    journal written with ``allow_grow`` off, say)."""
    demand = _demand(state, at, settings)
    return [] if demand is None else [demand]
