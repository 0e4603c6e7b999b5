"""The autoresize rules of the engine, decision by decision, without a host
(docs/architecture.md, "Resize semantics"; docs/user-guide.md, "Autoresizable jobs")."""

from __future__ import annotations

import pytest

from tests.unit.test_engine import POLICY, SETTINGS, job, place, request, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import engine
from xce_resize_plugin.core.facts import AutoresizeSet, GrowRequested
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    GrowRequest,
    JobState,
    Phase,
    ResizeState,
)
from xce_resize_plugin.host import Principal


def started() -> ResizeState:
    """An autoresizable job (2 of 1..8 tasks) as it starts: tracked, with its demand."""
    j = job({"hA": 2}, autoresize=True)
    state = run(None, engine.decide_job_start(None, j, 1.0, SETTINGS))
    assert state.autoresize and state.pending is not None and state.pending.auto
    return state


def test_the_job_start_tracks_only_autoresizable_running_jobs() -> None:
    assert engine.decide_job_start(None, job({"hA": 2}), 1.0, SETTINGS) == []
    pending = job({"hA": 2}, autoresize=True, state=JobState.PEND)
    assert engine.decide_job_start(None, pending, 1.0, SETTINGS) == []
    state = started()
    # Reported again (after a failover): nothing more.
    assert engine.decide_job_start(state, job({"hA": 2}, autoresize=True), 2.0, SETTINGS) == []
    assert state.pending is not None
    assert (state.pending.min_add, state.pending.max_add) == (1, 6)
    assert state.autoresize_notify is None


def test_no_demand_while_grows_are_off() -> None:
    off = engine.Settings(allow_grow=False)
    facts = engine.decide_job_start(None, job({"hA": 2}, autoresize=True), 1.0, off)
    state = run(None, facts)
    assert state.autoresize and state.pending is None
    assert not any(isinstance(f, GrowRequested) for f in facts)
    assert engine.decide_demand(state, 2.0, SETTINGS)[0].max_add == 6  # on at restart


def test_turned_off_while_its_grow_is_in_flight_a_failed_grow_is_dropped() -> None:
    j = job({"hA": 2}, autoresize=True, notify_cmd="x")
    state = run(None, engine.decide_job_start(None, j, 1.0, SETTINGS))
    state = run(state, place(state, j, {"hA": 2, "hB": 4}))
    state = run(state, engine.decide_dispatch(state, 2.5))
    assert state.phase is Phase.GROW_NOTIFYING and state.change is not None
    state, facts = request(state, j, AutoresizeRequest(False))
    assert [type(f) for f in facts] == [AutoresizeSet]  # the grow in flight goes on
    # The notification vetoes it: without autoresize the demand does not come back.
    state = run(state, engine.decide_notify_done(state, 1, 1, "", 3.0, SETTINGS))
    assert state.phase is Phase.IDLE and state.pending is None and not state.autoresize


def test_turning_it_on_waits_for_a_grow_someone_asked_for() -> None:
    j = job({"hA": 2})
    state, _ = request(None, j, GrowRequest(1, 1))
    with pytest.raises(errors.PendingRequest):
        request(state, j, AutoresizeRequest(True))
    state = run(state, place(state, j, {"hA": 2}))
    assert state.change is not None
    with pytest.raises(errors.ResizeInProgress):
        request(state, j, AutoresizeRequest(True))


def test_turning_it_on_needs_a_range_and_a_running_resizable_job() -> None:
    with pytest.raises(errors.InvalidRequest, match="task range"):
        request(None, job({"hA": 2}, min_tasks=2, max_tasks=2), AutoresizeRequest(True))
    with pytest.raises(errors.JobNotResizable):
        request(None, job({"hA": 2}, resizable=False), AutoresizeRequest(True))
    with pytest.raises(errors.NotStarted):
        request(None, job({"hA": 2}, state=JobState.PEND), AutoresizeRequest(True))
    with pytest.raises(errors.PermissionDenied):
        engine.decide_request(
            None,
            job({"hA": 2}),
            Principal("mallory"),
            AutoresizeRequest(True),
            1.0,
            POLICY,
            SETTINGS,
        )


@pytest.mark.parametrize(
    ("j", "message"),
    [
        (job({"hA": 2}, autoresize=True, max_tasks=2, min_tasks=2), "task range"),
        (job({"hA": 2}, autoresize=True, resizable=False), "implies resizable"),
    ],
)
def test_submission_checks(j: object, message: str) -> None:
    with pytest.raises(errors.InvalidRequest, match=message):
        engine.check_job_options(j)  # type: ignore[arg-type]
