"""`xce-resize jobs JOB`: the resize line says the phase, the pending grow and the
change in flight in words, from the REST status document."""

from __future__ import annotations

from xce_resize_plugin.cli.jobs import resize_summary
from xce_resize_plugin.core.converters import status_json
from xce_resize_plugin.core.models import ChangeKind, PendingGrow, Phase, Task
from xce_resize_plugin.core.status import ResizeStatus

TASKS = (Task(0, "h1"), Task(1, "h1"))


def test_idle() -> None:
    status = ResizeStatus("7", Phase.IDLE, TASKS, 1, 8, 3)
    assert resize_summary(status_json(status)) == "IDLE"


def test_pending_grow_range_and_exact() -> None:
    status = ResizeStatus("7", Phase.GROW_PENDING, TASKS, 1, 8, 3, PendingGrow(1, 4, None, 0.0))
    assert resize_summary(status_json(status)) == "GROW_PENDING; pending grow of 1 to 4 task(s)"
    status = ResizeStatus("7", Phase.GROW_PENDING, TASKS, 1, 8, 3, PendingGrow(2, 2, None, 0.0))
    assert resize_summary(status_json(status)) == "GROW_PENDING; pending grow of 2 task(s)"


def test_change_in_flight_names_its_tasks() -> None:
    status = ResizeStatus(
        "7",
        Phase.SHRINK_STOPPING,
        TASKS,
        1,
        8,
        3,
        None,
        ChangeKind.SHRINK,
        (Task(1, "h1"),),
    )
    assert resize_summary(status_json(status)) == "SHRINK_STOPPING; shrink in flight (tasks 1)"
