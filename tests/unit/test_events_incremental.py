"""A job's events projected a part at a time are its events projected at once
(docs/in-job-api.md, "Job events"): the runtime keeps a job's projection between polls
and projects only the facts that came since, so the two must never differ.

The facts come from the engine, driven by random steps as a host would drive it (grows
placed, dispatched and started, releases drained and stopped, tasks that exit, hosts
lost, the job's end); refused steps are skipped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_engine import OWNER, POLICY, SETTINGS, job, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import engine, losses
from xce_resize_plugin.core import events as job_events
from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.core.models import (
    CancelRequest,
    ChangeKind,
    DrainedRequest,
    GrowRequest,
    JobInfo,
    Phase,
    ReleaseRequest,
    ResizeRequest,
    ResizeState,
    host_counts,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView
from xce_resize_plugin.host import TaskEvent

CAPACITY = {"hA": 4, "hB": 4, "hC": 4}

#: A step: its kind, a number and a flag, read by kind in _decide. The host's cycle
#: comes more often, so that changes go through rather than wait.
KINDS = ("grow", "cancel", "release", "ack", "exit", "lose", "tick") + ("cycle",) * 4
_step = st.tuples(st.sampled_from(KINDS), st.integers(0, 9), st.booleans())


def _request(state: ResizeState | None, j: JobInfo, req: ResizeRequest, at: float) -> list[Fact]:
    return engine.decide_request(state, j, OWNER, req, at, POLICY, SETTINGS)


def _change_ids(state: ResizeState | None) -> list[int]:
    change = state.change if state is not None else None
    if change is None:
        return []
    return [t.id for t in change.tasks if t.id not in change.stopped]


def _cycle(state: ResizeState, j: JobInfo, at: float, ok: bool) -> list[Fact]:
    """The host's cycle: the pending grow placed, the change dispatched, its tasks
    started (or failed to start, unless ``ok``) or stopped."""
    facts: list[Fact] = []
    if state.phase is Phase.GROW_PENDING:
        held = host_counts(state.held)
        free = {h: cap - held.get(h, 0) for h, cap in CAPACITY.items()}
        view = GrowHostView(FreeSlotIndex(free), host_counts(state.tasks))
        facts += engine.decide_placement(state, j, view, None, POLICY, at)
        state = run(state, facts)
    if state.change is not None:
        new = engine.decide_dispatch(state, at)
        facts += new
        state = run(state, new)
    change = state.change
    if change is not None and change.kind is ChangeKind.GROW:
        what = "started" if ok else "start_failed"
        batch = [TaskEvent(j.id, t.id, what) for t in change.tasks]
        facts += engine.decide_task_events(state, batch, at, SETTINGS)
    elif change is not None and state.phase is Phase.SHRINK_STOPPING:
        batch = [TaskEvent(j.id, t.id, "exited", -15) for t in change.tasks]
        facts += engine.decide_task_events(state, batch, at, SETTINGS)
    return facts


def _decide(
    state: ResizeState | None, j: JobInfo, step: tuple[str, int, bool], at: float
) -> list[Fact]:
    """The facts of one random step (a refused one raises ResizeError)."""
    kind, n, flag = step
    if kind == "grow":
        return _request(state, j, GrowRequest(1, 1 + n % 3, cancel_pending=flag), at)
    if kind == "cancel":
        return _request(state, j, CancelRequest(), at)
    if kind == "release":
        grace = 10.0 if flag else None
        return _request(state, j, ReleaseRequest(count=1 + n % 2, grace=grace), at)
    if kind == "ack":
        return _request(state, j, DrainedRequest(tuple(_change_ids(state))), at)
    if state is None:
        return []
    if kind == "cycle":
        return _cycle(state, j, at, ok=flag or n > 2)
    if kind == "exit":
        ids = [t.id for t in state.held]
        task = ids[n % len(ids)]
        exited = [TaskEvent(j.id, task, "exited", 1)]
        if flag and task != 0:
            return losses.decide_task_exit(state, j, exited, at, SETTINGS)
        return engine.decide_task_events(state, exited, at, SETTINGS)
    host = sorted(CAPACITY)[n % len(CAPACITY)]
    lost = [t.id for t in state.tasks if t.host == host]
    if not losses.survives_loss(state, j, lost):
        return []
    return losses.decide_host_loss(state, j, host, lost, at, SETTINGS)


def facts_of(steps: list[tuple[str, int, bool]], end: bool) -> list[Fact]:
    """The facts a random run of ``steps`` writes for job 101 (4 tasks on hA and hB)."""
    j = job(release_exited=True)
    state: ResizeState | None = None
    facts: list[Fact] = []
    at = 1.0
    for step in steps:
        at += 1.0  # the host's clock moves at every step: drain deadlines pass
        if step[0] == "tick":
            at += 10 * step[1]
            continue
        try:
            new = _decide(state, j, step, at)
        except errors.ResizeError:
            continue
        state = run(state, new) if new else state
        facts += new
    if end and state is not None:
        facts += engine.decide_job_end(state, at + 1)
    return facts


@settings(max_examples=300, deadline=None)
@given(
    steps=st.lists(_step, min_size=5, max_size=80),
    end=st.booleans(),
    cuts=st.lists(st.integers(0, 400), max_size=8),
)
def test_projecting_a_part_at_a_time_is_projecting_at_once(
    steps: list[tuple[str, int, bool]], end: bool, cuts: list[int]
) -> None:
    """Whatever the facts and wherever the polls fall between them, the events projected
    from a kept projection are the whole projection's, numbered the same."""
    facts = facts_of(steps, end)
    whole = job_events.project(facts)
    at = job_events.Projection()
    got: list[job_events.JobEvent] = []
    done = 0
    for cut in sorted({min(c, len(facts)) for c in cuts} | {len(facts)}):
        at, found = job_events.project_from(at, facts[done:cut])
        got += found
        done = cut
        assert at.count == len(got)
        # What a poll at this point answers, from any cursor.
        assert job_events.after_cursor(got, at.count) == []
    assert got == whole
    assert [e.seq for e in whole] == list(range(1, len(whole) + 1))
    # One fact at a time, too, and the state reached is the journal's replay.
    one = job_events.Projection()
    for fact in facts:
        one = job_events.step(one, fact)[0]
    assert one.count == len(whole)
    if facts:
        assert one.state == engine.replay(facts)


def test_the_random_runs_make_every_kind_of_event() -> None:
    """The generator above reaches every event type (else the property proves little)."""
    steps: list[tuple[str, int, bool]] = [
        ("grow", 1, False),
        ("cycle", 9, True),
        ("release", 0, True),
        ("cycle", 9, True),
        ("ack", 0, False),
        ("cycle", 9, True),
        ("exit", 5, False),
        ("exit", 2, False),
        ("exit", 1, True),
        ("lose", 2, False),
    ]
    kinds = {e.type for e in job_events.project(facts_of(steps, end=True))}
    assert kinds == set(job_events.EVENT_TYPES)


@pytest.mark.parametrize("after", [-1, 4])
def test_a_cursor_outside_the_events_is_refused(after: int) -> None:
    with pytest.raises(errors.UnknownEventCursor, match=f"after={after}; .* from 1 to 3"):
        job_events.check_cursor(after, 3)
    job_events.check_cursor(0, 0)
    job_events.check_cursor(3, 3)
