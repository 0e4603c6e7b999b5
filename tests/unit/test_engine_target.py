"""A job's target size, decision by decision, without a host (docs/in-job-api.md,
"A target size"): the demand below it, the release above it, what replaces it, and
``if_version`` on grow and release."""

from __future__ import annotations

import orjson
import pytest

from tests.unit.test_engine import OWNER, POLICY, SETTINGS, job, place, request, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import converters, engine, losses, target
from xce_resize_plugin.core.facts import (
    AutoresizeSet,
    GrowCancelled,
    GrowRequested,
    ReleaseAccepted,
    TargetSet,
)
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    GrowRequest,
    JobInfo,
    JobState,
    Phase,
    ReleaseRequest,
    ResizeState,
    Target,
    TargetRequest,
    TaskEvent,
)
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import StoredState


def aim(
    state: ResizeState | None, j: JobInfo, tasks: int | None, prefer: tuple[int, ...] = ()
) -> tuple[ResizeState, list[object]]:
    facts = target.decide_target(
        state, j, OWNER, TargetRequest(tasks, prefer), 1.0, POLICY, SETTINGS
    )
    return run(state, list(facts)), list(facts)


def settle(state: ResizeState, j: JobInfo, at: float = 3.0) -> ResizeState:
    """Run the change in flight to its commit (no notification command), then what the
    runtime does after it: the release that converges on the target."""
    state = run(state, engine.decide_dispatch(state, at))
    change = state.change
    assert change is not None
    kind = "started" if change.kind.value == "grow" else "exited"
    events = [TaskEvent(j.id, t.id, kind) for t in change.tasks]
    state = run(state, engine.decide_task_events(state, events, at, SETTINGS))
    return run(state, target.decide_converge(state, j, at, POLICY))


def test_a_target_above_the_size_keeps_one_grow_of_the_missing_tasks() -> None:
    j = job({"hA": 2}, autoresize=True)
    state = run(None, engine.decide_job_start(None, j, 0.5, SETTINGS))
    state, facts = aim(state, j, 5)
    # Autoresize goes off, its demand is restated to the target's size.
    assert [type(f) for f in facts] == [AutoresizeSet, TargetSet, GrowRequested]
    assert not state.autoresize and state.target == Target(5)
    assert state.pending is not None and state.pending.auto
    assert (state.pending.min_add, state.pending.max_add) == (1, 3)
    # Only 1 slot free: one task now; the commit restates the demand for the other 2.
    state = run(state, place(state, j, {"hB": 1}))
    state = settle(state, j)
    assert len(state.tasks) == 3 and state.pending is not None
    assert (state.pending.min_add, state.pending.max_add) == (1, 2)
    state = run(state, place(state, j, {"hB": 4}, at=4.0))
    state = settle(state, j, 5.0)
    assert len(state.tasks) == 5 and state.pending is None and state.phase is Phase.IDLE


def test_a_target_below_the_size_releases_the_preferred_tasks_first() -> None:
    j = job({"hA": 2, "hB": 3})  # tasks 0..4
    state, facts = aim(None, j, 2, (4, 2))
    released = [f for f in facts if isinstance(f, ReleaseAccepted)]
    assert len(released) == 1 and released[0].principal == "target"
    ids = {t.id for t in released[0].tasks}
    assert len(ids) == 3 and {2, 4} <= ids and 0 not in ids
    state = settle(state, j)
    assert len(state.tasks) == 2 and state.tasks[0].id == 0
    assert state.target == Target(2, (4, 2)) and state.phase is Phase.IDLE


def test_without_preference_the_release_policy_chooses_and_never_task_0() -> None:
    j = job({"hA": 4})
    _, facts = aim(None, j, 1)
    (release,) = [f for f in facts if isinstance(f, ReleaseAccepted)]
    assert 0 not in {t.id for t in release.tasks} and len(release.tasks) == 3


def test_at_the_target_nothing_pends_and_setting_it_again_writes_nothing() -> None:
    j = job({"hA": 2})
    state, facts = aim(None, j, 2)
    assert state.pending is None and state.change is None and state.target == Target(2)
    assert [type(f).__name__ for f in facts] == ["JobTracked", "TargetSet"]
    assert aim(state, j, 2)[1] == []


def test_a_target_replaces_a_grow_someone_asked_for() -> None:
    j = job({"hA": 2})
    state, _ = request(None, j, GrowRequest(1, 4))
    state, facts = aim(state, j, 3)
    assert [type(f) for f in facts] == [GrowCancelled, TargetSet, GrowRequested]
    assert state.pending is not None and state.pending.max_add == 1 and state.pending.auto


def test_lowered_while_its_grow_is_in_flight_the_commit_is_followed_by_a_release() -> None:
    j = job({"hA": 2})
    state, _ = aim(None, j, 4)
    state = run(state, place(state, j, {"hB": 2}))
    state, facts = aim(state, j, 3, (3,))
    assert [type(f) for f in facts] == [TargetSet]  # the grow in flight goes on
    state = settle(state, j)
    assert state.change is not None and [t.id for t in state.change.tasks] == [3]
    state = settle(state, j, 4.0)
    assert [t.id for t in state.tasks] == [0, 1, 2]


def test_a_host_failure_restates_the_demand() -> None:
    j = job({"hA": 2, "hB": 2})
    state, _ = aim(None, j, 4)
    facts = losses.decide_host_loss(state, j, "hB", [2, 3], 2.0, SETTINGS)
    state = run(state, facts)
    assert len(state.tasks) == 2 and state.pending is not None
    assert (state.pending.min_add, state.pending.max_add) == (1, 2)


def test_clearing_cancels_the_targets_grow_and_keeps_the_size() -> None:
    j = job({"hA": 2})
    state, _ = aim(None, j, 4)
    state, facts = aim(state, j, None)
    assert [type(f) for f in facts] == [TargetSet, GrowCancelled]
    assert state.target is None and state.pending is None and len(state.tasks) == 2
    assert aim(state, j, None)[1] == []  # clearing no target changes nothing


@pytest.mark.parametrize(
    ("req", "reason"),
    [
        (GrowRequest(1, 1, cancel_pending=True), "request"),
        (ReleaseRequest(task_ids=(1,)), "release"),
        (CancelRequest(), "cancel"),
    ],
)
def test_a_manual_change_takes_over_from_the_target(
    req: GrowRequest | ReleaseRequest | CancelRequest, reason: str
) -> None:
    j = job({"hA": 2})
    state, _ = aim(None, j, 4)
    state, facts = request(state, j, req)
    cleared = [f for f in facts if isinstance(f, TargetSet)]
    assert len(cleared) == 1 and cleared[0].target is None and cleared[0].reason == reason
    assert state.target is None
    assert state.pending is None or not state.pending.auto


def test_a_manual_grow_without_c_is_refused_while_the_targets_grow_pends() -> None:
    j = job({"hA": 2})
    state, _ = aim(None, j, 4)
    with pytest.raises(errors.PendingRequest, match="target's grow"):
        request(state, j, GrowRequest(1, 1))


def test_turning_autoresize_on_replaces_the_target() -> None:
    j = job({"hA": 2})
    state, _ = aim(None, j, 4)
    state, facts = request(state, j, AutoresizeRequest(True))
    assert state.target is None and state.autoresize
    assert state.pending is not None and state.pending.max_add == 6
    assert any(isinstance(f, TargetSet) and f.reason == "autoresize" for f in facts)


def test_a_vetoed_release_clears_the_target_rather_than_insisting() -> None:
    j = job({"hA": 3}, notify_cmd="veto")
    state, _ = aim(None, j, 2)
    state = run(state, engine.decide_dispatch(state, 2.0))
    assert state.phase is Phase.SHRINK_NOTIFYING
    state = run(state, engine.decide_notify_done(state, 1, 1, "", 3.0, SETTINGS))
    assert state.target is None and len(state.tasks) == 3
    assert target.decide_converge(state, j, 3.0, POLICY) == []


@pytest.mark.parametrize(
    ("j", "tasks", "prefer", "error"),
    [
        (job({"hA": 2}, min_tasks=2, max_tasks=6), 1, (), errors.BadSlots),
        (job({"hA": 2}, min_tasks=2, max_tasks=6), 7, (), errors.BadSlots),
        (job({"hA": 3}), 2, (0,), errors.ReleaseFirstHost),
        (job({"hA": 3}), 2, (9,), errors.InvalidRequest),
        (job({"hA": 3}), 2, (1, 1), errors.InvalidRequest),
        (job({"hA": 3}, resizable=False), 2, (), errors.JobNotResizable),
        (job({"hA": 3}, state=JobState.DONE), 2, (), errors.JobFinished),
        (job({"hA": 3}, state=JobState.PEND), 2, (), errors.NotStarted),
    ],
)
def test_bad_targets_are_refused_and_change_nothing(
    j: JobInfo, tasks: int, prefer: tuple[int, ...], error: type[errors.ResizeError]
) -> None:
    state, _ = aim(None, job({"hA": 3}), 5)
    with pytest.raises(error):
        target.decide_target(
            state if j.resizable and j.state is JobState.RUN else None,
            j,
            OWNER,
            TargetRequest(tasks, prefer),
            2.0,
            POLICY,
            SETTINGS,
        )


def test_another_users_target_is_refused() -> None:
    with pytest.raises(errors.PermissionDenied):
        target.decide_target(
            None, job(), Principal("mallory"), TargetRequest(3), 1.0, POLICY, SETTINGS
        )


def test_if_version_refuses_a_change_on_another_allocation_version() -> None:
    j = job({"hA": 2})
    with pytest.raises(errors.VersionChanged, match="version 0, not 1"):
        request(None, j, GrowRequest(1, 1, if_version=1))
    with pytest.raises(errors.InvalidRequest, match="at least 0"):
        request(None, j, ReleaseRequest(count=1, if_version=-1))
    state, _ = request(None, j, GrowRequest(1, 1, if_version=0))
    state = run(state, place(state, j, {"hA": 1}))
    state = settle(state, j)
    assert state.version == 1
    with pytest.raises(errors.VersionChanged):
        request(state, j, ReleaseRequest(count=1, if_version=0))
    state, _ = request(state, j, ReleaseRequest(count=1, if_version=1))
    assert state.change is not None


def test_the_target_is_kept_in_the_materialised_state_and_old_states_read() -> None:
    j = job({"hA": 2})
    state, facts = aim(None, j, 4, (1,))
    stored = StoredState(converters.encode_state(state), (), ())
    assert converters.decode_state(stored).target == Target(4, (1,))
    for fact in facts:
        assert converters.decode_fact(converters.encode_fact(fact)) == fact  # type: ignore[arg-type]
    # A state without a target is written as before: no key, so older journals read.
    plain, _ = request(None, j, GrowRequest(1, 1))
    assert "target" not in orjson.loads(converters.encode_state(plain))


def test_journal_verify_checks_a_states_target() -> None:
    import attrs

    from xce_resize_plugin.core import audit

    state, _ = aim(None, job({"hA": 2}), 4)
    assert audit.state_problems(state) == []
    bad = attrs.evolve(state, target=Target(9, (0,)), autoresize=True)
    assert audit.state_problems(bad) == [
        "job 101: target 9 outside 1..8",
        "job 101: a target and autoresize at once",
        "job 101: task 0 among the target's preferred releases",
    ]


def test_a_target_grow_given_up_clears_the_target() -> None:
    j = job({"hA": 2}, notify_cmd="veto")
    state, _ = aim(None, j, 4)
    for attempt in (1, 2):  # SETTINGS: notify_max_failures = 2
        state = run(state, place(state, j, {"hB": 2}, at=2.0 + attempt))
        state = run(state, engine.decide_dispatch(state, 2.5 + attempt))
        facts = engine.decide_notify_done(state, attempt, 1, "", 3.0 + attempt, SETTINGS)
        state = run(state, facts)
    assert state.target is None and state.pending is None and len(state.tasks) == 2
    assert isinstance(facts[-1], TargetSet) and facts[-1].reason == "given-up"


def test_a_grow_asked_for_before_the_target_giving_up_leaves_the_target() -> None:
    j = job({"hA": 2}, notify_cmd="veto")
    state, _ = request(None, j, GrowRequest(1, 1))
    state = run(state, place(state, j, {"hB": 1}))
    state = run(state, engine.decide_dispatch(state, 2.5))
    state, _ = aim(state, j, 4)  # set while the grow's notification runs
    state = run(state, engine.decide_notify_done(state, 1, 1, "", 3.0, SETTINGS))
    # Its failure does not return the manual grow to pending: the target's demand does.
    assert state.target == Target(4, (), "veto")
    assert state.pending is not None and state.pending.auto and state.pending.max_add == 2
