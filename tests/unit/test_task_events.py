"""core/task_events.py: runs of alike task events read as the events they stand for."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.core.models import TaskEvent
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents

_runs = st.builds(
    TaskEventRun,
    job_id=st.sampled_from(["1", "2"]),
    task_ids=st.lists(st.integers(0, 9), max_size=5).map(tuple),
    kind=st.sampled_from(["started", "exited"]),
    status=st.none() | st.integers(0, 2),
    reason=st.sampled_from(["", "gone"]),
    stopped=st.booleans(),
)
_singles = st.builds(
    TaskEvent,
    job_id=st.sampled_from(["1", "2"]),
    task_id=st.integers(0, 9),
    kind=st.sampled_from(["started", "exited"]),
)


def _flat(parts: list[TaskEvent | TaskEventRun]) -> list[TaskEvent]:
    out: list[TaskEvent] = []
    for p in parts:
        if isinstance(p, TaskEventRun):
            out += [
                TaskEvent(p.job_id, i, p.kind, p.status, p.reason, p.stopped) for i in p.task_ids
            ]
        else:
            out.append(p)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(_runs | _singles, max_size=6), st.data())
def test_events_given_as_runs_read_as_the_flat_events(
    parts: list[TaskEvent | TaskEventRun], data: st.DataObject
) -> None:
    events = TaskEvents(parts)
    flat = _flat(parts)
    assert len(events) == len(flat) and list(events) == flat and events == flat
    n = len(flat)
    for k in range(-n, n):
        assert events[k] == flat[k]
    a, b = data.draw(st.integers(-n - 2, n + 2)), data.draw(st.integers(-n - 2, n + 2))
    step = data.draw(st.sampled_from([None, 1, 2, -1]))
    part = events[a:b:step]
    assert list(part) == flat[a:b:step]
    if step in (None, 1):
        assert isinstance(part, TaskEvents)
    assert [list(r) for r in events.runs()] == [
        _flat([p]) for p in parts if not isinstance(p, TaskEventRun) or p.task_ids
    ]
    with pytest.raises(IndexError):
        events[n]


def test_a_run_is_its_events_and_its_slices_are_runs() -> None:
    run = TaskEventRun("7", (4, 5, 6), "exited", 0, "", True)
    assert list(run) == [TaskEvent("7", i, "exited", 0, "", True) for i in (4, 5, 6)]
    assert run[1] == TaskEvent("7", 5, "exited", 0, "", True)
    assert run[1:] == TaskEventRun("7", (5, 6), "exited", 0, "", True)
    assert run.of((9,)) == TaskEventRun("7", (9,), "exited", 0, "", True)
