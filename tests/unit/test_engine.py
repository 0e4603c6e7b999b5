"""The resize state machine, decision by decision, without a host.

The rules are those of docs/architecture.md, "Resize semantics".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin import default_policies, errors
from xce_resize_plugin.core import engine, fold, losses
from xce_resize_plugin.core import events as job_events
from xce_resize_plugin.core.facts import (
    Committed,
    Fact,
    GrowCancelled,
    GrowPlaced,
    GrowRequested,
    GrowReverted,
    JobEnded,
    NotifyDone,
    NotifyStarted,
    ReleaseAccepted,
    TasksLaunched,
    TasksStarted,
    TasksStopped,
    TaskStarted,
    TaskStartFailed,
    TaskStopped,
)
from xce_resize_plugin.core.models import (
    CancelRequest,
    ChangeKind,
    GrowRequest,
    JobInfo,
    JobState,
    Phase,
    ReleaseRequest,
    ResizeRequest,
    ResizeState,
    Task,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
from xce_resize_plugin.host import Principal, TaskEvent

SETTINGS = engine.Settings(notify_max_failures=2)
OWNER = Principal("alice")


class DefaultPolicy:
    """The built-in policies, called directly (what the hooks give with no site policy)."""

    def __init__(self, reject: str | None = None) -> None:
        self.reject = reject

    def authorize(self, principal: Principal, job: JobInfo, action: str) -> bool:
        return bool(default_policies.xce_resize_authorize(principal, job, action))

    def validate(self, job: JobInfo, request: ResizeRequest) -> None:
        if self.reject:
            raise errors.PolicyRejected(self.reject)

    def select_release(self, job: JobInfo, candidates: Sequence[Task], count: int) -> Sequence[int]:
        result = default_policies.xce_resize_select_release(job, candidates, count)
        assert result is not None
        return result

    def order_grow_hosts(self, job: JobInfo, hosts: GrowHostView) -> Iterable[str]:
        result = default_policies.xce_resize_order_grow_hosts(job, hosts)
        assert result is not None
        return result


POLICY = DefaultPolicy()


def job(
    tasks: dict[str, int] | None = None, *, state: JobState = JobState.RUN, **kw: object
) -> JobInfo:
    alloc = tasks if tasks is not None else {"hA": 2, "hB": 2}
    flat = [h for h, n in alloc.items() for _ in range(n)]
    fields: dict[str, object] = {
        "id": "101",
        "user": "alice",
        "state": state,
        "min_tasks": 1,
        "max_tasks": 8,
        "tasks": tuple(Task(i, h) for i, h in enumerate(flat)),
        "resizable": True,
        "start_time": 0.0,
    }
    fields.update(kw)
    return JobInfo(**fields)  # type: ignore[arg-type]


def run(state: ResizeState | None, facts: list[Fact]) -> ResizeState:
    for fact in facts:
        state = engine.evolve(state, fact)
    assert state is not None
    return state


def request(
    state: ResizeState | None,
    j: JobInfo,
    req: ResizeRequest,
    at: float = 1.0,
    principal: Principal = OWNER,
    policy: DefaultPolicy = POLICY,
) -> tuple[ResizeState, list[Fact]]:
    facts = engine.decide_request(state, j, principal, req, at, policy, SETTINGS)
    return run(state, facts), facts


def place(state: ResizeState, j: JobInfo, free: dict[str, int], at: float = 2.0) -> list[Fact]:
    view = GrowHostView(FreeSlotIndex(free), {h: n for h, n in _counts(state.tasks).items()})
    return engine.decide_placement(state, j, view, None, POLICY, at)


def _counts(tasks: Iterable[Task]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t.host] = out.get(t.host, 0) + 1
    return out


# --- requests ------------------------------------------------------------------------


def test_grow_request_pends_and_caps_max_at_max_tasks() -> None:
    j = job()
    state, facts = request(None, j, GrowRequest(2, 10))
    assert state.phase is Phase.GROW_PENDING
    assert isinstance(facts[-1], GrowRequested)
    assert state.pending is not None and (state.pending.min_add, state.pending.max_add) == (2, 4)


@pytest.mark.parametrize(
    ("jstate", "resizable", "code"),
    [
        (JobState.PEND, True, "LSBE_NOT_STARTED"),
        (JobState.DONE, True, "LSBE_JOB_FINISH"),
        (JobState.EXIT, True, "LSBE_JOB_FINISH"),
        (JobState.RUN, False, "LSBE_JOB_RESIZABLE"),
    ],
)
def test_grow_rejected_by_job_state(jstate: JobState, resizable: bool, code: str) -> None:
    with pytest.raises(errors.ResizeError) as exc:
        request(None, job(state=jstate, resizable=resizable), GrowRequest(1, 1))
    assert exc.value.code == code


def test_grow_beyond_max_tasks_rejected() -> None:
    with pytest.raises(errors.BadSlots, match="cannot add at least 5"):
        request(None, job(), GrowRequest(5, 6))


def test_grow_bad_counts_and_notify_options() -> None:
    with pytest.raises(errors.BadSlots):
        request(None, job(), GrowRequest(3, 2))
    with pytest.raises(errors.InvalidRequest, match="mutually exclusive"):
        request(None, job(), GrowRequest(1, 1, notify_cmd="x", no_notify=True))
    with pytest.raises(errors.NotifyCmdTooLong):
        request(None, job(), GrowRequest(1, 1, notify_cmd="x" * 4096))
    # What no shell can be given is refused when asked for, not when the change runs it.
    for cmd, named in (("echo a\0b", "NUL"), ("echo \ud800", "lone surrogate")):
        with pytest.raises(errors.InvalidRequest, match=named):
            request(None, job(), GrowRequest(1, 1, notify_cmd=cmd))
        with pytest.raises(errors.InvalidRequest, match=named):
            engine.check_job_options(job(notify_cmd=cmd))


def test_job_counts_stay_under_what_a_record_holds() -> None:
    # A max_tasks of 2**64 was accepted, and then no journal record of the job could be
    # written; every count stays at most 2**31 - 1, as bresize's.
    engine.check_job_options(job(max_tasks=2**24, ptile=2**31 - 1))
    with pytest.raises(errors.BadSlots, match="max_tasks 18446744073709551616 is above 2147483647"):
        engine.check_job_options(job(max_tasks=2**64))
    # What the journal reads back of one allocation: a larger one was written, then
    # could never be read (the job's state lost at the next start).
    with pytest.raises(errors.BadSlots, match="max_tasks 16777217 is above 16777216, the most"):
        engine.check_job_options(job(max_tasks=2**24 + 1))
    with pytest.raises(errors.InvalidRequest, match="ptile 2147483648 must be from 1 to"):
        engine.check_job_options(job(ptile=2**31))


def test_grow_not_enabled() -> None:
    with pytest.raises(errors.RequestNotEnabled):
        engine.decide_request(
            None,
            job(),
            OWNER,
            GrowRequest(1, 1),
            1.0,
            POLICY,
            engine.Settings(allow_grow=False),
        )


def test_second_request_needs_c_and_c_replaces() -> None:
    j = job()
    state, _ = request(None, j, GrowRequest(1, 1))
    with pytest.raises(errors.PendingRequest):
        request(state, j, GrowRequest(2, 2))
    with pytest.raises(errors.PendingRequest):
        request(state, j, ReleaseRequest(spec="hB"))
    state, facts = request(state, j, GrowRequest(2, 3, cancel_pending=True))
    assert [type(f) for f in facts] == [GrowCancelled, GrowRequested]
    assert state.pending is not None and state.pending.max_add == 3


def test_cancel() -> None:
    j = job()
    with pytest.raises(errors.NoActiveRequest):
        request(None, j, CancelRequest())
    state, _ = request(None, j, GrowRequest(1, 1))
    state, _ = request(state, j, CancelRequest())
    assert state.phase is Phase.IDLE and state.pending is None
    with pytest.raises(errors.NoActiveRequest):
        request(state, j, CancelRequest())


def test_permission() -> None:
    j = job()
    with pytest.raises(errors.PermissionDenied):
        request(None, j, GrowRequest(1, 1), principal=Principal("mallory"))
    with pytest.raises(errors.PermissionDenied):
        request(None, j, GrowRequest(1, 1), principal=Principal("alice", job_id="999"))
    request(None, j, GrowRequest(1, 1), principal=Principal("root", admin=True))
    request(None, j, GrowRequest(1, 1), principal=Principal("x", job_id="101"))


def test_site_validation_rejects_with_its_message() -> None:
    with pytest.raises(errors.PolicyRejected, match="powers of two"):
        request(None, job(), GrowRequest(1, 1), policy=DefaultPolicy("powers of two"))


def test_release_forms() -> None:
    j = job({"hA": 2, "hB": 2, "hC": 1})
    _, facts = request(None, j, ReleaseRequest(spec="hB"))
    assert isinstance(facts[-1], ReleaseAccepted)
    assert [t.id for t in facts[-1].tasks] == [2, 3]
    _, facts = request(None, j, ReleaseRequest(count=2))
    assert [t.id for t in facts[-1].tasks] == [3, 4]  # newest first by default
    _, facts = request(None, j, ReleaseRequest(task_ids=(1,)))
    assert [t.id for t in facts[-1].tasks] == [1]
    _, facts = request(None, j, ReleaseRequest(hosts={"hB": 1}))
    assert [t.id for t in facts[-1].tasks] == [3]


def test_release_rules() -> None:
    j = job({"hA": 2, "hB": 2}, min_tasks=2)
    with pytest.raises(errors.BadSlots, match="below min_tasks"):
        request(None, j, ReleaseRequest(spec="all"))
    with pytest.raises(errors.InvalidRequest, match="exactly one"):
        request(None, j, ReleaseRequest(spec="hB", count=1))
    with pytest.raises(errors.BadSlots):
        request(None, j, ReleaseRequest(count=4))
    with pytest.raises(errors.HostNotInAlloc):
        request(None, j, ReleaseRequest(spec="hZ"))


def test_release_with_c_cancels_pending_grow() -> None:
    j = job()
    state, _ = request(None, j, GrowRequest(1, 1))
    state, facts = request(state, j, ReleaseRequest(spec="hB", cancel_pending=True))
    assert [type(f) for f in facts] == [GrowCancelled, ReleaseAccepted]
    assert state.pending is None and state.phase is Phase.SHRINK_STOPPING


def test_anything_while_in_flight_is_refused() -> None:
    j = job(notify_cmd="true")
    state, _ = request(None, j, ReleaseRequest(spec="hB"))
    assert state.phase is Phase.SHRINK_NOTIFYING
    for req in (
        GrowRequest(1, 1),
        ReleaseRequest(spec="1*hA"),
        GrowRequest(1, 1, cancel_pending=True),
    ):
        with pytest.raises(errors.ResizeInProgress):
            request(state, j, req)


# --- grow life cycle -----------------------------------------------------------------


def test_grow_with_notification_commits_after_tasks_start() -> None:
    j = job(notify_cmd="echo hi")
    state, _ = request(None, j, GrowRequest(1, 3))
    facts = place(state, j, {"hA": 0, "hB": 1, "hC": 4})
    assert isinstance(facts[0], GrowPlaced)
    # the job's own hosts first, then most free: hB gets 1, hC 2
    assert [(t.id, t.host) for t in facts[0].tasks] == [(4, "hB"), (5, "hC"), (6, "hC")]
    state = run(state, facts)
    assert state.phase is Phase.GROW_NOTIFYING
    assert len(state.held) == 7  # charged from the reservation on
    effects = engine.effects(None, facts[0], state)
    assert effects == [engine.Reserve("101", facts[0].tasks)]
    facts = engine.decide_dispatch(state, 3.0)
    assert isinstance(facts[0], NotifyStarted) and facts[0].attempt == 1
    state = run(state, facts)
    assert engine.decide_dispatch(state, 3.0) == []  # not started twice
    facts = engine.decide_notify_done(state, 1, 0, "", 4.0, SETTINGS)
    state = run(state, facts)
    assert state.phase is Phase.GROW_STARTING
    facts = engine.decide_dispatch(state, 4.0)
    assert isinstance(facts[0], TasksLaunched)
    before = state
    state = run(state, facts)
    assert engine.effects(before, facts[0], state) == [engine.Launch("101", state.change.tasks)]  # type: ignore[union-attr]
    for tid in (4, 5):
        state = run(state, engine.decide_task_event(state, tid, "started", "", 5.0, SETTINGS))
    assert state.phase is Phase.GROW_STARTING
    facts = engine.decide_task_event(state, 6, "started", "", 6.0, SETTINGS)
    assert [type(f) for f in facts] == [TaskStarted, Committed]
    state = run(state, facts)
    assert state.phase is Phase.IDLE and len(state.tasks) == 7 and state.version == 1
    rec = state.records[-1]
    assert rec.kind is ChangeKind.GROW and len(rec.before) == 4 and len(rec.delta) == 3


def test_grow_below_min_places_nothing() -> None:
    j = job()
    state, _ = request(None, j, GrowRequest(3, 4))
    assert place(state, j, {"hA": 1, "hB": 1}) == []


def test_failed_notification_returns_grow_to_pending_then_gives_up() -> None:
    j = job(notify_cmd="false")
    state, _ = request(None, j, GrowRequest(1, 1))
    for attempt in (1, 2):
        state = run(state, place(state, j, {"hA": 2}))
        state = run(state, engine.decide_dispatch(state, 3.0))
        assert state.change is not None and state.change.attempt == attempt
        # a late answer of an earlier attempt is ignored
        assert engine.decide_notify_done(state, attempt - 1, 0, "", 4.0, SETTINGS) == []
        facts = engine.decide_notify_done(state, attempt, 1, "", 4.0, SETTINGS)
        assert isinstance(facts[0], NotifyDone) and not facts[0].ok
        before = state
        state = run(state, facts)
        assert engine.effects(before, facts[0], state) == [
            engine.Free("101", tuple(t.id for t in before.change.tasks))  # type: ignore[union-attr]
        ]
        assert len(state.held) == 4
    assert state.phase is Phase.IDLE and state.pending is None  # max failures = 2


def test_timeout_counts_as_failure() -> None:
    j = job(notify_cmd="sleep 100")
    state, _ = request(None, j, GrowRequest(1, 1))
    state = run(state, place(state, j, {"hA": 2}))
    state = run(state, engine.decide_dispatch(state, 3.0))
    state = run(state, engine.decide_notify_done(state, 1, None, "timeout", 4.0, SETTINGS))
    assert state.phase is Phase.GROW_PENDING and state.pending is not None
    assert state.pending.failures == 1


def test_task_start_failures_free_slots_and_commit_the_rest() -> None:
    j = job()
    state, _ = request(None, j, GrowRequest(1, 2, no_notify=True))
    state = run(state, place(state, j, {"hC": 2}))
    state = run(state, engine.decide_dispatch(state, 3.0))
    facts = engine.decide_task_event(state, 4, "start_failed", "no binary", 4.0, SETTINGS)
    assert [type(f) for f in facts] == [TaskStartFailed]
    state = run(state, facts)
    assert len(state.held) == 5
    state = run(state, engine.decide_task_event(state, 5, "started", "", 5.0, SETTINGS))
    assert state.phase is Phase.IDLE and [t.id for t in state.tasks] == [0, 1, 2, 3, 5]


def test_all_task_starts_failing_reverts_to_pending() -> None:
    j = job()
    state, _ = request(None, j, GrowRequest(1, 1, no_notify=True))
    state = run(state, place(state, j, {"hC": 2}))
    state = run(state, engine.decide_dispatch(state, 3.0))
    facts = engine.decide_task_event(state, 4, "start_failed", "", 4.0, SETTINGS)
    assert [type(f) for f in facts] == [TaskStartFailed, GrowReverted]
    state = run(state, facts)
    assert state.phase is Phase.GROW_PENDING and len(state.held) == 4


# --- shrink life cycle ---------------------------------------------------------------


def test_shrink_stops_tasks_before_freeing_and_commits() -> None:
    j = job(notify_cmd="true")
    state, _ = request(None, j, ReleaseRequest(spec="hB"))
    state = run(state, engine.decide_dispatch(state, 2.0))
    state = run(state, engine.decide_notify_done(state, 1, 0, "", 3.0, SETTINGS))
    assert state.phase is Phase.SHRINK_STOPPING
    assert len(state.held) == 4  # nothing freed before the processes are gone
    facts = engine.decide_dispatch(state, 3.0)
    before = state
    state = run(state, facts)
    assert engine.effects(before, facts[0], state) == [engine.Stop("101", (2, 3))]
    facts = engine.decide_task_event(state, 2, "exited", "", 4.0, SETTINGS)
    assert engine.effects(state, facts[0], run(state, facts)) == [engine.Free("101", (2,))]
    state = run(state, facts)
    assert len(state.held) == 3
    facts = engine.decide_task_event(state, 3, "exited", "", 5.0, SETTINGS)
    assert [type(f) for f in facts] == [TaskStopped, Committed]
    state = run(state, facts)
    assert [t.host for t in state.tasks] == ["hA", "hA"] and state.phase is Phase.IDLE


def test_failed_shrink_notification_leaves_allocation() -> None:
    j = job(notify_cmd="false")
    state, _ = request(None, j, ReleaseRequest(count=1))
    state = run(state, engine.decide_dispatch(state, 2.0))
    state = run(state, engine.decide_notify_done(state, 1, 1, "", 3.0, SETTINGS))
    assert state.phase is Phase.IDLE and len(state.tasks) == 4 and state.version == 0


# --- job end, recovery, timeline -------------------------------------------------------


def test_job_end_cancels_pending_and_frees_in_flight_reservation() -> None:
    j = job(notify_cmd="true")
    state, _ = request(None, j, GrowRequest(1, 2))
    facts = engine.decide_job_end(state, 5.0)
    assert [type(f) for f in facts] == [GrowCancelled, JobEnded]
    state2, _ = request(None, j, GrowRequest(1, 2))
    state2 = run(state2, place(state2, j, {"hC": 4}))
    facts = engine.decide_job_end(state2, 5.0)
    ended = run(state2, facts)
    assert not ended.live and ended.held == ()
    assert engine.effects(state2, facts[-1], ended) == [engine.Free("101", (4, 5))]


def test_recovery_reruns_a_running_notification() -> None:
    j = job(notify_cmd="true")
    state, _ = request(None, j, GrowRequest(1, 1))
    state = run(state, place(state, j, {"hC": 4}))
    assert engine.decide_recover(state, 3.0) == []  # not started: dispatch will start it
    state = run(state, engine.decide_dispatch(state, 3.0))
    facts = engine.decide_recover(state, 9.0)
    assert isinstance(facts[0], NotifyStarted) and facts[0].attempt == 2
    resumed = engine.resume_effects(state)
    assert engine.Reserve("101", state.held) in resumed


def test_charges_timeline() -> None:
    j = job({"hA": 2})
    state, _ = request(None, j, GrowRequest(2, 2, no_notify=True), at=10.0)
    state = run(state, place(state, j, {"hB": 2}, at=20.0))
    state = run(state, engine.decide_dispatch(state, 20.0))
    for tid in (2, 3):
        state = run(state, engine.decide_task_event(state, tid, "started", "", 25.0, SETTINGS))
    assert state.charges == ((0.0, 2), (20.0, 4))


def test_replay_equals_incremental_state() -> None:
    j = job(notify_cmd="true")
    log: list[Fact] = []
    state, facts = request(None, j, GrowRequest(1, 2))
    log += facts
    for step in (
        lambda s: place(s, j, {"hC": 4}),
        lambda s: engine.decide_dispatch(s, 3.0),
        lambda s: engine.decide_notify_done(s, 1, 0, "", 4.0, SETTINGS),
        lambda s: engine.decide_dispatch(s, 4.0),
        lambda s: engine.decide_task_event(s, 4, "started", "", 5.0, SETTINGS),
        lambda s: engine.decide_task_event(s, 5, "started", "", 5.0, SETTINGS),
    ):
        facts = step(state)
        log += facts
        state = run(state, facts)
    assert engine.replay(log) == state
    assert state.version == 1


def test_evolve_rejects_facts_for_untracked_jobs() -> None:
    with pytest.raises(ValueError, match="untracked"):
        engine.evolve(None, GrowCancelled("1", 0.0, "cancel"))


def test_job_options_checked_at_submit() -> None:
    engine.check_job_options(job())
    with pytest.raises(errors.BadSlots):
        engine.check_job_options(job(min_tasks=5, max_tasks=4))
    with pytest.raises(errors.InvalidRequest):
        engine.check_job_options(job(ptile=0))
    with pytest.raises(errors.NotifyCmdTooLong):
        engine.check_job_options(job(notify_cmd="y" * 5000))


# --- batches of task events (xce_task_events) -------------------------------------

KINDS = ("started", "start_failed", "exited")


def _in_flight(grow: bool, size: int, notify_failures: int) -> ResizeState:
    """A job of 4 tasks with a grow (GROW_STARTING) or shrink (SHRINK_STOPPING) of
    ``size`` tasks launched."""
    j = job({"hA": 2, "hB": 2}, max_tasks=12)
    if grow:
        state, _ = request(None, j, GrowRequest(size, size, no_notify=True))
        state = run(state, place(state, j, {"hC": 8}))
    else:
        state, _ = request(None, j, ReleaseRequest(count=min(size, 3), no_notify=True))
    if state.change is not None and state.change.pending is not None and notify_failures:
        pending = state.change.pending
        state = fold.rebuilt(
            state,
            change=fold.rebuilt(
                state.change, pending=fold.rebuilt(pending, failures=notify_failures)
            ),
        )
    return run(state, engine.decide_dispatch(state, 3.0))


events = st.lists(
    st.builds(
        TaskEvent,
        job_id=st.sampled_from(["101", "101", "101", "202"]),
        task_id=st.integers(min_value=0, max_value=12),
        kind=st.sampled_from(KINDS),
        reason=st.sampled_from(["", "no binary"]),
    ),
    max_size=30,
)


#: A change in flight (_in_flight's arguments) and a batch of events for it.
IN_FLIGHT = {
    "grow": st.booleans(),
    "size": st.integers(min_value=1, max_value=8),
    "failures": st.integers(min_value=0, max_value=2),
    "batch": events,
}


@settings(max_examples=300, deadline=None)
@given(**IN_FLIGHT)
def test_a_batch_decides_what_single_events_decide(
    grow: bool, size: int, failures: int, batch: list[TaskEvent]
) -> None:
    start = _in_flight(grow, size, failures)
    one_by_one: list[Fact] = []
    state = start
    for event in batch:
        if event.job_id != state.job_id:
            continue  # the runtime hands each job only its own events
        facts = engine.decide_task_event(
            state, event.task_id, event.kind, event.reason, 5.0, SETTINGS
        )
        one_by_one += facts
        state = run(state, facts)
        assert state.held_count == len(state.held)
    batched = engine.decide_task_events(start, batch, 5.0, SETTINGS)
    # The same facts, but a run of starts (or of stops with one status) is one fact.
    assert _one_per_task(batched) == one_by_one
    assert not any(map(_mergeable, batched, batched[1:])), batched

    # The job events tell the same: the stopped tasks (one event for a run of them)
    # and every other event as it was.
    def told(facts: list[Fact]) -> tuple[list[int], list[tuple[str, object]]]:
        got = job_events.project(facts, prior=start)
        exited = [i for e in got if e.type == "tasks_exited" for i in e.data["task_ids"]]
        rest = [(e.type, dict(e.data)) for e in got if e.type != "tasks_exited"]
        return exited, rest

    assert told(batched) == told(one_by_one)
    if batched:
        assert run(start, batched) == state
    # transition() folds the run of task facts at once: the same state, and the same
    # slots freed (in one Free for the run).
    folded, effects = engine.transition(start, batched)
    assert folded == (state if batched else start)
    single = [
        e
        for i, f in enumerate(batched)
        for e in engine.effects(run(start, batched[:i]), f, run(start, batched[: i + 1]))
    ]
    freed = [i for e in single if isinstance(e, engine.Free) for i in e.task_ids]
    assert [i for e in effects if isinstance(e, engine.Free) for i in e.task_ids] == freed
    assert [e for e in effects if not isinstance(e, engine.Free)] == [
        e for e in single if not isinstance(e, engine.Free)
    ]


def _as_runs(batch: list[TaskEvent], cuts: list[bool]) -> TaskEvents:
    """``batch`` with consecutive alike events (one job, kind, status, reason, stopped)
    joined into runs; an event ``cuts`` marks stays a single event of its own."""
    parts: list[TaskEvent | TaskEventRun] = []
    for event, cut in zip(batch, cuts + [False] * len(batch), strict=False):
        key = (event.job_id, event.kind, event.status, event.reason, event.stopped)
        last = parts[-1] if parts else None
        if cut:
            parts.append(event)
        elif isinstance(last, TaskEventRun) and key == (
            last.job_id,
            last.kind,
            last.status,
            last.reason,
            last.stopped,
        ):
            parts[-1] = last.of((*last.task_ids, event.task_id))
        else:
            parts.append(TaskEventRun(event.job_id, (event.task_id,), *key[1:]))
    return TaskEvents(parts)


@settings(max_examples=400, deadline=None)
@given(**IN_FLIGHT, data=st.data())
def test_runs_of_alike_events_decide_what_their_events_decide(
    grow: bool, size: int, failures: int, batch: list[TaskEvent], data: st.DataObject
) -> None:
    """A batch given as runs of alike events (core/task_events.py) decides the facts
    the same events one by one in a batch decide; the change's own tasks reported all
    alike (a release's exits, a grow's starts), the run the engine takes at once, are
    mixed in at random places."""
    start = _in_flight(grow, size, failures)
    assert start.change is not None
    own = [t.id for t in start.change.tasks]
    kind = "started" if grow else "exited"
    for _ in range(data.draw(st.integers(0, 2))):
        at = data.draw(st.integers(0, len(batch)))
        ids = data.draw(st.permutations(own)) if data.draw(st.booleans()) else own
        k = data.draw(st.integers(1, len(ids)))
        stopped = not grow and data.draw(st.booleans())
        batch[at:at] = [TaskEvent("101", i, kind, None, "", stopped) for i in ids[:k]]
    cuts = data.draw(st.lists(st.booleans(), max_size=len(batch)))
    runs = _as_runs(batch, cuts)
    assert list(runs) == batch
    assert engine.decide_task_events(start, runs, 5.0, SETTINGS) == engine.decide_task_events(
        start, batch, 5.0, SETTINGS
    )


def _mergeable(a: Fact, b: Fact) -> bool:
    """Two facts that decide_task_events should have written as one."""
    starts = (TaskStarted, TasksStarted)
    stops = (TaskStopped, TasksStopped)
    if isinstance(a, starts) and isinstance(b, starts):
        return True
    return isinstance(a, stops) and isinstance(b, stops) and a.status == b.status


def _one_per_task(facts: list[Fact]) -> list[Fact]:
    """The facts with each TasksStarted / TasksStopped as one fact per task."""
    out: list[Fact] = []
    for f in facts:
        if isinstance(f, TasksStarted):
            out += [TaskStarted(f.job_id, f.at, i) for i in f.task_ids]
        elif isinstance(f, TasksStopped):
            out += [TaskStopped(f.job_id, f.at, i, f.status) for i in f.task_ids]
        else:
            out.append(f)
    return out


def test_a_batch_completes_a_grow_in_one_decision() -> None:
    start = _in_flight(True, 3, 0)
    ids = [t.id for t in start.change.tasks]  # type: ignore[union-attr]
    batch = [TaskEvent("101", i, "started") for i in ids] + [TaskEvent("101", ids[0], "exited")]
    facts = engine.decide_task_events(start, batch, 5.0, SETTINGS)
    # The three starts are one fact; the exit after the commit is one of a committed
    # task: a job event, nothing more.
    assert [type(f).__name__ for f in facts] == ["TasksStarted", "Committed", "TaskExited"]
    assert facts[0] == TasksStarted("101", 5.0, tuple(ids))
    state = run(start, facts)
    assert state.change is None and len(state.tasks) == 7 and state.held_count == 7


# --- host failure ----------------------------------------------------------------------


def _running(alloc: Sequence[str], min_tasks: int = 1, resizable: bool = True) -> JobInfo:
    return JobInfo(
        "9",
        "alice",
        JobState.RUN,
        min_tasks,
        16,
        tuple(Task(i, h) for i, h in enumerate(alloc)),
        resizable=resizable,
        notify_cmd="note",
        start_time=0.0,
    )


def test_a_host_loss_is_an_involuntary_shrink_with_a_record() -> None:
    from xce_resize_plugin.core import converters
    from xce_resize_plugin.core.facts import TasksLost

    job = _running(["a", "a", "b", "b"])
    facts = losses.decide_host_loss(None, job, "b", [2, 3], 5.0, SETTINGS)
    assert [type(f).__name__ for f in facts] == ["JobTracked", "TasksLost"]
    state, effects = engine.transition(None, facts)
    assert state is not None and [t.host for t in state.tasks] == ["a", "a"]
    [record] = state.records
    assert (record.kind, record.reason, record.version) == (ChangeKind.SHRINK, "host_failure", 1)
    assert state.charges == ((0.0, 4), (5.0, 2))
    kinds = [type(e).__name__ for e in effects]
    assert kinds == ["Free", "CommitAllocation", "Notify"]
    notify = effects[2]
    assert isinstance(notify, engine.Notify) and notify.version == 1 and notify.attempt == 1
    # The fact and the record go through the journal's encoding and back.
    lost = facts[1]
    assert isinstance(lost, TasksLost)
    assert converters.decode_fact(converters.encode_fact(lost)) == lost
    assert engine.replay(converters.decode_fact(converters.encode_fact(f)) for f in facts) == state


def test_a_record_without_a_reason_keeps_its_journal_bytes() -> None:
    from xce_resize_plugin.core import converters
    from xce_resize_plugin.core.models import ResizeRecord

    plain = ResizeRecord(1.0, ChangeKind.GROW, (), (Task(1, "a"),), (Task(1, "a"),), 1)
    assert b"reason" not in converters.encode_record(plain)
    assert "reason" not in converters.record_json(plain)
    lost = ResizeRecord(1.0, ChangeKind.SHRINK, (), (), (), 2, "host_failure")
    assert converters.record_json(lost)["reason"] == "host_failure"


@pytest.mark.parametrize(
    ("alloc", "lost", "min_tasks", "resizable"),
    [
        (["b", "a"], [0], 1, True),  # task 0 on the failed host
        (["a", "b", "b"], [1, 2], 2, True),  # below min_tasks
        (["a", "b"], [1], 1, False),  # rigid
    ],
)
def test_a_job_that_cannot_lose_the_tasks_does_not_survive(
    alloc: list[str], lost: list[int], min_tasks: int, resizable: bool
) -> None:
    job = _running(alloc, min_tasks, resizable)
    assert not losses.survives_loss(None, job, lost)
    with pytest.raises(errors.InvalidRequest):
        losses.decide_host_loss(None, job, "b", lost, 1.0, SETTINGS)


def test_a_pending_grow_survives_a_host_loss() -> None:
    job = _running(["a", "b"])
    facts = engine.decide_request(
        None, job, OWNER, GrowRequest(2, 2), 1.0, DefaultPolicy(), SETTINGS
    )
    state = engine.replay(facts)
    assert state is not None
    lost = losses.decide_host_loss(state, job, "b", [1], 2.0, SETTINGS)
    after = engine.replay([*facts, *lost])
    assert (
        after is not None and after.phase is Phase.GROW_PENDING and after.pending == state.pending
    )
