"""Property: whatever targets are set and however slots come and go, a job converges on
its target once slots allow, never goes below ``min_tasks``, never releases task 0 and
never holds more slots than a host has (docs/in-job-api.md, "A target size").

The host is played here in a few lines: three hosts of 4 slots, some taken by other
work; each step places the pending grow on what is free, dispatches the change and
reports its tasks started or exited, then asks for the converging release, as the
runtime does after a transition."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_engine import OWNER, POLICY, SETTINGS, job, run
from xce_resize_plugin import errors
from xce_resize_plugin.core import engine, target
from xce_resize_plugin.core.models import (
    JobInfo,
    Phase,
    ResizeState,
    TargetRequest,
    TaskEvent,
    host_counts,
)
from xce_resize_plugin.core.placement import FreeSlotIndex, GrowHostView

CAPACITY = {"hA": 4, "hB": 4, "hC": 4}
MIN, MAX = 2, 10

_targets = st.tuples(
    st.just("target"),
    st.integers(MIN, MAX),
    st.lists(st.integers(0, 14), max_size=3, unique=True),
)
_others = st.tuples(st.just("others"), st.sampled_from(sorted(CAPACITY)), st.integers(0, 4))
_steps = st.tuples(st.just("step"), st.just(0), st.just(0))


class Host:
    """The slots of the three hosts: the job's held tasks and other work."""

    def __init__(self) -> None:
        self.others = dict.fromkeys(CAPACITY, 0)

    def free(self, state: ResizeState) -> dict[str, int]:
        held = host_counts(state.held)
        return {h: CAPACITY[h] - self.others[h] - held.get(h, 0) for h in CAPACITY}

    def take(self, state: ResizeState, host: str, want: int) -> None:
        """Other work takes up to ``want`` slots of ``host`` (only free ones) or gives
        back what it holds beyond ``want``."""
        held = host_counts(state.held).get(host, 0)
        self.others[host] = min(want, CAPACITY[host] - held)

    def check(self, state: ResizeState) -> None:
        held = host_counts(state.held)
        for h, cap in CAPACITY.items():
            assert held.get(h, 0) + self.others[h] <= cap, "overbooked"
        assert len(state.tasks) >= MIN and state.tasks[0].id == 0


def step(state: ResizeState, j: JobInfo, host: Host, at: float) -> ResizeState:
    if state.phase is Phase.GROW_PENDING:
        free = host.free(state)
        view = GrowHostView(FreeSlotIndex(free), host_counts(state.tasks))
        state = run(state, engine.decide_placement(state, j, view, None, POLICY, at))
        host.check(state)
    if state.change is not None:
        state = run(state, engine.decide_dispatch(state, at))
        change = state.change
        assert change is not None
        grow = change.kind.value == "grow"
        if not grow:
            assert 0 not in {t.id for t in change.tasks}, "task 0 released"
        kind = "started" if grow else "exited"
        events = [TaskEvent(j.id, t.id, kind) for t in change.tasks]
        state = run(state, engine.decide_task_events(state, events, at, SETTINGS))
    state = run(state, target.decide_converge(state, j, at, POLICY))
    host.check(state)
    return state


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(_targets, _others, _steps), max_size=25))
def test_any_targets_and_slot_changes_converge_on_the_last_target(
    ops: list[tuple[str, object, object]],
) -> None:
    j = job({"hA": 2}, min_tasks=MIN, max_tasks=MAX)
    host = Host()
    state: ResizeState | None = None
    at = 1.0
    wanted: int | None = None
    for kind, a, b in ops:
        at += 1.0
        if kind == "target":
            assert isinstance(a, int) and isinstance(b, list)
            try:
                facts = target.decide_target(
                    state, j, OWNER, TargetRequest(a, tuple(b)), at, POLICY, SETTINGS
                )
            except (errors.InvalidRequest, errors.ReleaseFirstHost):
                continue  # ids the job does not hold, or task 0: refused, nothing changed
            state = run(state, facts)
            wanted = a
        elif kind == "others" and state is not None:
            assert isinstance(a, str) and isinstance(b, int)
            host.take(state, a, b)
        elif state is not None:
            state = step(state, j, host, at)
        if state is not None:
            host.check(state)
    if state is None or wanted is None:
        return
    # The other work ends: the slots allow any target up to MAX, so it is reached.
    host.others = dict.fromkeys(CAPACITY, 0)
    for _ in range(6):
        at += 1.0
        state = step(state, j, host, at)
    assert state.target is not None and state.target.tasks == wanted
    assert len(state.tasks) == wanted
    assert state.pending is None and state.change is None
