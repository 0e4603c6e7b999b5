"""Readiness (a grow with ``wait_ready``) and ``release_exited``, decision by decision.

The rules are those of docs/in-job-api.md, "Readiness and exits"; the engine's own
helpers (the default policy, ``job``, ``request``, ``place``, ``run``) are those of
tests/unit/test_engine.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_engine import OWNER, POLICY, SETTINGS, job, place, request, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import audit, converters, engine, losses
from xce_resize_plugin.core.facts import (
    Committed,
    Fact,
    GrowReverted,
    ReadyTimedOut,
    TaskReady,
    TasksLost,
    TaskStartFailed,
)
from xce_resize_plugin.core.models import (
    ChangeKind,
    GrowRequest,
    JobState,
    Phase,
    ReadyRequest,
    ResizeState,
    TaskEvent,
)

SLOW = engine.Settings(notify_max_failures=2, max_ready_timeout=100.0)


def _launched(wait: float | None = 30.0, add: int = 2, min_add: int = 1) -> ResizeState:
    """A job of 4 tasks whose grow of ``add`` (wait_ready) was placed and launched at 3."""
    j = job()
    grow = GrowRequest(min_add, add, no_notify=True, wait_ready=True, ready_timeout=wait)
    state, _ = request(None, j, grow)
    state = run(state, place(state, j, {"hC": add}))
    return run(state, engine.decide_dispatch(state, 3.0))


def _ready(state: ResizeState, task_id: int, at: float = 5.0) -> list[Fact]:
    return engine.decide_request(state, job(), OWNER, ReadyRequest(task_id), at, POLICY, SETTINGS)


def _started(state: ResizeState, *ids: int, at: float = 4.0) -> ResizeState:
    events = [TaskEvent("101", i, "started") for i in ids]
    return run(state, engine.decide_task_events(state, events, at, SETTINGS))


def test_a_waiting_grow_commits_only_once_its_tasks_are_ready() -> None:
    state = _launched()
    assert state.change is not None and state.change.ready_by == 33.0  # launch + timeout
    state = _started(state, 4, 5)
    # Every task started: without wait_ready this would have committed.
    assert state.phase is Phase.GROW_STARTING and state.version == 0
    assert len(state.held) == 6  # charged from placement, as always
    facts = _ready(state, 4)
    assert [type(f) for f in facts] == [TaskReady]
    state = run(state, facts)
    assert state.phase is Phase.GROW_STARTING
    facts = _ready(state, 5, at=6.0)
    assert [type(f) for f in facts] == [TaskReady, Committed]
    state = run(state, facts)
    assert state.phase is Phase.IDLE and state.version == 1
    assert [t.id for t in state.tasks] == [0, 1, 2, 3, 4, 5]
    assert state.records[-1].time == 6.0  # the accounting record at readiness


def test_ready_is_recorded_once_and_before_the_host_reports_the_start() -> None:
    state = _launched()
    state = run(state, _ready(state, 4))
    assert _ready(state, 4) == []  # said again: nothing
    assert state.change is not None and 4 in state.change.started
    # Task 5 is ready before its start is reported; then the start completes nothing more.
    facts = _ready(state, 5)
    assert [type(f) for f in facts] == [TaskReady, Committed]
    state = run(state, facts)
    assert engine.decide_task_events(state, [TaskEvent("101", 5, "started")], 7.0, SETTINGS) == []


def test_ready_outside_a_waiting_grow_is_recorded_and_changes_nothing_else() -> None:
    j = job()
    # An untracked job: accepted, no fact (nothing waits for it).
    assert engine.decide_request(None, j, OWNER, ReadyRequest(2), 1.0, POLICY, SETTINGS) == []
    state, _ = request(None, j, GrowRequest(1, 1))
    facts = _ready(state, 2)
    assert [type(f) for f in facts] == [TaskReady]
    after = run(state, facts)
    assert after.ready == {2} and after.phase is state.phase and after.pending == state.pending


@pytest.mark.parametrize(
    ("task_id", "jstate", "code"),
    [
        (9, JobState.RUN, "XCE_RESIZE_INVALID_REQUEST"),
        (0, JobState.PEND, "LSBE_NOT_STARTED"),
        (0, JobState.DONE, "LSBE_JOB_FINISH"),
    ],
)
def test_ready_refused_for_a_task_the_job_does_not_hold(
    task_id: int, jstate: JobState, code: str
) -> None:
    with pytest.raises(errors.ResizeError) as info:
        engine.decide_request(
            None, job(state=jstate), OWNER, ReadyRequest(task_id), 1.0, POLICY, SETTINGS
        )
    assert info.value.code == code
    if task_id == 9:
        assert "task 9 is not a task of job 101" in info.value.text


def test_another_jobs_token_may_not_say_ready() -> None:
    stranger = OWNER.__class__("job-102", job_id="102")
    with pytest.raises(errors.PermissionDenied):
        engine.decide_request(None, job(), stranger, ReadyRequest(1), 1.0, POLICY, SETTINGS)


def test_the_deadline_fails_the_late_tasks_and_commits_the_ready_ones() -> None:
    state = _started(_launched(), 4, 5)
    state = run(state, _ready(state, 5))
    assert engine.decide_ready_deadline(state, 32.9, SETTINGS) == []  # not yet
    facts = engine.decide_ready_deadline(state, 33.0, SETTINGS)
    assert [type(f) for f in facts] == [ReadyTimedOut, Committed]
    assert facts[0] == ReadyTimedOut("101", 33.0, (4,))
    before = state
    state = engine.evolve(state, facts[0])
    assert engine.effects(before, facts[0], state) == [
        engine.Stop("101", (4,)),
        engine.Free("101", (4,)),
    ]
    state = run(state, facts[1:])
    assert [t.id for t in state.tasks] == [0, 1, 2, 3, 5] and state.version == 1


def test_the_deadline_with_no_task_ready_sends_the_grow_back_to_pending() -> None:
    state = _started(_launched(), 4)  # task 5 never even started
    facts = engine.decide_ready_deadline(state, 40.0, SETTINGS)
    assert [type(f) for f in facts] == [ReadyTimedOut, GrowReverted]
    assert facts[0] == ReadyTimedOut("101", 40.0, (4, 5))
    state = run(state, facts)
    assert state.phase is Phase.GROW_PENDING and state.pending is not None
    assert state.pending.failures == 1 and len(state.held) == 4
    # The grow keeps its wait when it is placed again.
    assert state.pending.ready_timeout == 30.0


def test_a_task_that_exits_before_it_is_ready_is_failed_at_once() -> None:
    state = _started(_launched(), 4, 5)
    state = run(state, _ready(state, 5))
    facts = engine.decide_task_events(
        state, [TaskEvent("101", 4, "exited", 1, "crashed")], 6.0, SETTINGS
    )
    assert [type(f) for f in facts] == [TaskStartFailed, Committed]
    state = run(state, facts)
    assert [t.id for t in state.tasks] == [0, 1, 2, 3, 5]


def test_wait_ready_bounds() -> None:
    j = job()
    with pytest.raises(errors.InvalidRequest, match="at most the site's maximum 100"):
        engine.decide_request(
            None, j, OWNER, GrowRequest(1, 1, wait_ready=True, ready_timeout=101), 1, POLICY, SLOW
        )
    with pytest.raises(errors.InvalidRequest, match="ready_timeout needs wait_ready"):
        engine.decide_request(None, j, OWNER, GrowRequest(1, 1, ready_timeout=5), 1, POLICY, SLOW)
    with pytest.raises(errors.InvalidRequest, match="more than 0"):
        engine.decide_request(
            None, j, OWNER, GrowRequest(1, 1, wait_ready=True, ready_timeout=0), 1, POLICY, SLOW
        )
    facts = engine.decide_request(
        None, j, OWNER, GrowRequest(1, 1, wait_ready=True), 1, POLICY, SLOW
    )
    state = run(None, facts)
    assert state.pending is not None and state.pending.ready_timeout == 100.0  # the maximum


def test_the_new_facts_and_fields_round_trip_and_old_bytes_stay() -> None:
    state = _started(_launched(), 4, 5)
    state = run(state, _ready(state, 5))
    for fact in (TaskReady("101", 1.0, (5,)), ReadyTimedOut("101", 2.0, (4,))):
        assert converters.decode_fact(converters.encode_fact(fact)) == fact
    lost = TasksLost("101", 1.0, "hA", (), 1)
    assert b"reason" not in converters.encode_fact(lost)  # the host-failure default
    assert b"ready" not in converters.encode_state(
        run(None, request(None, job(), GrowRequest(1, 1))[1])
    )


# --- release_exited ------------------------------------------------------------------


def _exit(*ids: int, stopped: bool = False) -> list[TaskEvent]:
    return [TaskEvent("101", i, "exited", 3, "gone", stopped) for i in ids]


def test_release_exited_drops_an_exited_task_as_a_shrink() -> None:
    j = job(release_exited=True)
    facts = losses.decide_task_exit(None, j, _exit(3), 5.0, SETTINGS)
    state = run(None, facts)
    assert [t.id for t in state.tasks] == [0, 1, 2] and state.version == 1
    record = state.records[-1]
    assert record.kind is ChangeKind.SHRINK and record.reason == "task_exit"
    assert [t.id for t in record.delta] == [3]
    assert state.charges[-1] == (5.0, 3)  # no longer charged


def test_release_exited_spares_task_0_stops_and_jobs_without_the_option() -> None:
    assert losses.decide_task_exit(None, job(release_exited=True), _exit(0), 5.0, SETTINGS) == []
    stopped = _exit(2, stopped=True)
    assert losses.decide_task_exit(None, job(release_exited=True), stopped, 5.0, SETTINGS) == []
    assert losses.decide_task_exit(None, job(), _exit(2), 5.0, SETTINGS) == []


def test_release_exited_goes_below_min_tasks_and_groups_hosts() -> None:
    j = job(release_exited=True, min_tasks=4)
    facts = losses.decide_task_exit(None, j, _exit(1, 2, 3), 5.0, SETTINGS)
    assert [f.host for f in facts if isinstance(f, TasksLost)] == ["hA", "hB"]
    state = run(None, facts)
    assert [t.id for t in state.tasks] == [0] and state.version == 2
    # journal verify's invariants allow it: the tasks exited, nobody released them.
    assert audit.state_problems(state) == []


def test_release_exited_needs_a_resizable_job() -> None:
    with pytest.raises(errors.InvalidRequest, match="release_exited needs a resizable job"):
        engine.check_job_options(job(release_exited=True, resizable=False))


# --- the readiness phase as a property ------------------------------------------------

_STEPS = st.lists(
    st.tuples(st.sampled_from(["start", "fail", "exit", "ready", "tick"]), st.integers(4, 7)),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(add=st.integers(1, 4), steps=_STEPS)
def test_commit_only_after_readiness_or_deadline_and_no_slot_leaks(
    add: int, steps: list[tuple[str, int]]
) -> None:
    """Whatever the order of starts, failures, exits, readiness and time: the grow is
    committed only when every task it adds said it is ready (or at the deadline), it
    adds only ready tasks, and the slots the job holds are always exactly those the
    host was told to reserve and not yet told to free."""
    state = _launched(wait=10.0, add=add)
    reserved = {t.id for t in state.held}
    at = 3.0
    for kind, tid in steps:
        at += 1.0
        before = state
        if kind == "ready":
            try:
                facts = _ready(state, tid, at)
            except errors.ResizeError:
                continue
        elif kind == "tick":
            facts = engine.decide_ready_deadline(state, at + 5.0, SETTINGS)
        else:
            event = {"start": "started", "fail": "start_failed", "exit": "exited"}[kind]
            facts = engine.decide_task_events(state, [TaskEvent("101", tid, event)], at, SETTINGS)
        after, effects = engine.transition(state, facts)
        assert after is not None
        for effect in effects:
            if isinstance(effect, engine.Free):
                reserved -= set(effect.task_ids)
            if isinstance(effect, engine.Reserve):
                reserved |= {t.id for t in effect.tasks}
        state = after
        assert {t.id for t in state.held} == reserved
        if any(isinstance(f, Committed) for f in facts):
            assert before.change is not None
            failed = {f.task_id for f in facts if isinstance(f, TaskStartFailed)}
            survivors = {t.id for t in before.change.tasks} - before.change.failed - failed
            added = {t.id for t in state.tasks} - {0, 1, 2, 3}
            assert added and added <= state.ready  # only ready tasks join
            if not any(isinstance(f, ReadyTimedOut) for f in facts):
                assert added == survivors  # before the deadline: all of them ready
        if state.phase is not Phase.GROW_STARTING:
            break
