"""Drain before stop and job events in the engine, without a host
(docs/in-job-api.md, "Drain before stop" and "Job events")."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_engine import OWNER, POLICY, SETTINGS, job, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import engine, events, losses
from xce_resize_plugin.core.facts import (
    DrainEnded,
    Fact,
    JobEnded,
    TaskExited,
    TasksDrained,
    TasksLaunched,
    TaskStopped,
)
from xce_resize_plugin.core.models import (
    DrainedRequest,
    JobInfo,
    Phase,
    ReleaseRequest,
    ResizeState,
)
from xce_resize_plugin.host import Principal, TaskEvent

TOKEN = Principal("alice", job_id="101")


def _decide(state: ResizeState | None, j: JobInfo, req: object, at: float) -> list[Fact]:
    return engine.decide_request(state, j, OWNER, req, at, POLICY, SETTINGS)  # type: ignore[arg-type]


def _draining(
    grace: float = 30.0, notify: str | None = None, at: float = 1.0
) -> tuple[JobInfo, ResizeState, list[Fact]]:
    """Job 101 (4 tasks on hA, hB) releasing hB's tasks 2 and 3 with ``grace``."""
    j = job(notify_cmd=notify)
    facts = _decide(None, j, ReleaseRequest(hosts={"hB": None}, grace=grace), at)
    state = run(None, facts)
    if notify is not None:
        more = engine.decide_dispatch(state, at)
        state = run(state, more)
        done = engine.decide_notify_done(state, state.notify_attempts, 0, "", at + 1, SETTINGS)
        facts += more + done
        state = run(state, done)
    return j, state, facts


def test_a_release_with_grace_drains_after_its_notification() -> None:
    _, state, _ = _draining(grace=30.0, notify="true")
    assert state.phase is Phase.SHRINK_DRAINING
    assert state.change is not None and state.change.deadline == 2.0 + 30.0
    # Until the deadline the dispatch decides nothing: the tasks run on, still charged.
    assert engine.decide_dispatch(state, 31.9) == []
    assert state.held_count == 4
    ended = engine.decide_dispatch(state, 32.0)
    assert ended == [DrainEnded("101", 32.0, "deadline"), TasksLaunched("101", 32.0)]
    after, effects = engine.transition(state, ended)
    assert after is not None and after.phase is Phase.SHRINK_STOPPING
    assert [e for e in effects if isinstance(e, engine.Stop)] == [engine.Stop("101", (2, 3))]


def test_without_a_notification_the_drain_starts_at_the_release() -> None:
    _, state, facts = _draining(grace=5.0, at=10.0)
    assert state.phase is Phase.SHRINK_DRAINING
    assert state.change is not None and state.change.deadline == 15.0
    _, effects = engine.transition(None, facts)
    assert engine.DrainUntil("101", 15.0) in effects


def test_no_grace_stops_at_once_as_before() -> None:
    _, state, facts = _draining(grace=0.0)
    assert state.phase is Phase.SHRINK_STOPPING
    assert "grace" not in engine_fact_json(facts[-1])


def engine_fact_json(fact: Fact) -> str:
    from xce_resize_plugin.core import converters

    return converters.encode_fact(fact).decode()


def test_the_job_default_grace_applies_and_the_request_overrides_it() -> None:
    j = job(grace=20.0)
    state = run(None, _decide(None, j, ReleaseRequest(task_ids=(3,)), 1.0))
    assert state.change is not None and state.change.deadline == 21.0
    state = run(None, _decide(None, j, ReleaseRequest(task_ids=(3,), grace=0.0), 1.0))
    assert state.phase is Phase.SHRINK_STOPPING


@pytest.mark.parametrize(
    ("grace", "shown"),
    [
        (301.0, "301"),
        (1e20, "1e+20"),
        (1e300, ">= 1e300"),
        (1e308, ">= 1e300"),
        (math.inf, ">= 1e300"),
        (10**400, ">= 1e300"),
    ],
)
def test_a_grace_above_the_maximum_is_too_long_however_large(grace: float, shown: str) -> None:
    with pytest.raises(errors.GraceTooLong) as info:
        _decide(None, job(), ReleaseRequest(task_ids=(3,), grace=grace), 1.0)
    assert info.value.code == "XCE_RESIZE_GRACE_TOO_LONG"
    assert info.value.text.endswith(
        f": grace {shown} s is above the site maximum max_stop_grace 300 s"
    )


@pytest.mark.parametrize("grace", [-1.0, -(10**400), math.nan, "5", True])
def test_a_grace_that_is_no_duration_is_refused(grace: object) -> None:
    with pytest.raises(errors.InvalidRequest, match="grace must be a number of seconds >= 0"):
        _decide(None, job(), ReleaseRequest(task_ids=(3,), grace=grace), 1.0)  # type: ignore[arg-type]


def test_early_acknowledgement_of_every_task_stops_at_once() -> None:
    j, state, _ = _draining()
    first = engine.decide_request(state, j, TOKEN, DrainedRequest((2,)), 3.0, POLICY, SETTINGS)
    assert first == [TasksDrained("101", 3.0, (2,), "alice")]
    state = run(state, first)
    assert state.phase is Phase.SHRINK_DRAINING and state.held_count == 4
    # Acknowledging task 2 again changes nothing.
    assert engine.decide_request(state, j, TOKEN, DrainedRequest((2,)), 3.5, POLICY, SETTINGS) == []
    last = engine.decide_request(state, j, TOKEN, DrainedRequest((3,)), 4.0, POLICY, SETTINGS)
    assert last == [TasksDrained("101", 4.0, (3,), "alice"), DrainEnded("101", 4.0, "drained")]
    assert run(state, last).phase is Phase.SHRINK_STOPPING


@pytest.mark.parametrize("ids", [(1,), (0,), (2, 7)])
def test_acknowledging_tasks_not_being_drained_is_refused(ids: tuple[int, ...]) -> None:
    j, state, _ = _draining()
    with pytest.raises(errors.NotDraining) as info:
        _decide(state, j, DrainedRequest(ids), 3.0)
    assert info.value.http_status == 409


def test_acknowledging_without_a_drain_is_refused() -> None:
    j = job()
    with pytest.raises(errors.NotDraining):
        _decide(None, j, DrainedRequest((2,)), 3.0)
    _, stopping, _ = _draining(grace=0.0)
    with pytest.raises(errors.NotDraining):
        _decide(stopping, j, DrainedRequest((2,)), 3.0)


def test_another_job_token_may_not_acknowledge() -> None:
    j, state, _ = _draining()
    with pytest.raises(errors.PermissionDenied):
        engine.decide_request(
            state, j, Principal("alice", job_id="102"), DrainedRequest((2,)), 3.0, POLICY, SETTINGS
        )


def test_a_task_exiting_during_the_drain_is_stopped_and_freed() -> None:
    _, state, _ = _draining()
    facts = engine.decide_task_events(state, [TaskEvent("101", 2, "exited", 0)], 5.0, SETTINGS)
    assert facts == [TaskStopped("101", 5.0, 2, 0)]
    state = run(state, facts)
    assert state.held_count == 3 and state.phase is Phase.SHRINK_DRAINING
    more = engine.decide_task_events(state, [TaskEvent("101", 3, "exited", 1)], 6.0, SETTINGS)
    done = run(state, more)
    assert done.change is None and [t.id for t in done.tasks] == [0, 1]


def test_the_job_ending_during_the_drain_ends_it_cleanly() -> None:
    _, state, _ = _draining()
    facts = engine.decide_job_end(state, 7.0)
    assert facts == [JobEnded("101", 7.0)]
    ended = run(state, facts)
    assert ended.change is None and ended.held_count == 0
    assert engine.decide_dispatch(ended, 100.0) == []


def test_a_failover_during_the_drain_keeps_its_deadline() -> None:
    _, state, _ = _draining()
    effects = engine.resume_effects(state)
    assert engine.DrainUntil("101", 31.0) in effects
    assert not any(isinstance(e, engine.Stop) for e in effects)


def test_a_host_loss_during_the_drain_keeps_draining_the_rest() -> None:
    j, state, _ = _draining()
    # Task 3 moves with hB's failure; the drain of the tasks left (none here) ends it.
    facts = losses.decide_host_loss(state, j, "hB", [2, 3], 8.0, SETTINGS)
    after = run(state, facts)
    assert after.change is None and [t.id for t in after.tasks] == [0, 1]


def test_exits_of_committed_tasks_are_facts_and_events() -> None:
    _, state, facts = _draining(grace=0.0)
    idle_exit = engine.decide_task_events(state, [TaskEvent("101", 1, "exited", 3)], 2.0, SETTINGS)
    assert idle_exit == [TaskExited("101", 2.0, 1, 3)]
    got = events.project([*facts, *idle_exit])
    assert [e.type for e in got] == ["release_coming", "tasks_exited"]
    assert got[0].data == {"task_ids": [2, 3], "deadline": 1.0}
    assert got[1].data == {"task_ids": [1], "status": 3, "reason": ""}


def test_event_cursors() -> None:
    _, _, facts = _draining()
    got = events.project(facts)
    assert [e.seq for e in got] == [1]
    assert events.after_cursor(got, 0) == got and events.after_cursor(got, 1) == []
    for bad in (-1, 2):
        with pytest.raises(errors.UnknownEventCursor):
            events.after_cursor(got, bad)


# --- properties ---------------------------------------------------------------------

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("tick"), st.floats(0.0, 50.0)),
        st.tuples(st.just("ack"), st.sets(st.sampled_from([2, 3]), min_size=1)),
        st.tuples(st.just("exit"), st.sampled_from([2, 3])),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(grace=st.floats(0.5, 100.0), steps=_steps)
def test_drain_properties(grace: float, steps: list[tuple[str, object]]) -> None:
    """Whatever happens during a drain: its tasks are charged until each is stopped; no
    stop begins before the deadline unless every task was acknowledged; the events'
    sequence numbers increase by one; and replaying the facts gives the same state."""
    j, state, facts = _draining(grace=grace)
    deadline = 1.0 + grace
    now = 1.0
    for kind, arg in steps:
        if state.change is None:
            break
        if kind == "tick":
            now += float(arg)  # type: ignore[arg-type]
            new = engine.decide_dispatch(state, now)
        elif kind == "ack":
            try:
                new = _decide(state, j, DrainedRequest(tuple(arg)), now)  # type: ignore[arg-type]
            except errors.NotDraining:
                assert state.phase is not Phase.SHRINK_DRAINING or bool(
                    set(arg) & state.change.stopped  # type: ignore[arg-type]
                )
                continue
        else:
            new = engine.decide_task_events(
                state,
                [TaskEvent("101", int(arg), "exited", 0)],
                now,
                SETTINGS,  # type: ignore[call-overload]
            )
        before = state.change
        for fact in new:
            if isinstance(fact, DrainEnded) and fact.reason == "deadline":
                assert fact.at >= deadline
            if isinstance(fact, DrainEnded) and fact.reason == "drained":
                assert before is not None
                acked = set(before.drained) | set(arg)  # type: ignore[call-overload]
                assert {t.id for t in before.tasks} - before.stopped <= acked
        state = run(state, new)
        facts += new
        change = state.change
        if change is not None:
            # Charged until stopped: the two released tasks count until each exits.
            assert state.held_count == 4 - len(change.stopped)
        elif state.live:
            assert [t.id for t in state.tasks] == [0, 1] and state.held_count == 2
    assert engine.replay(facts) == state
    seqs = [e.seq for e in events.project(facts)]
    assert seqs == list(range(1, len(seqs) + 1))
