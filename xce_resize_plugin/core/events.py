"""A job's events, projected from its journal facts (docs/in-job-api.md, "Job events").

The plugin is the source: the events of a job are a pure function of its facts, in
journal order, so they survive a controller restart with the same sequence numbers
(the ``seq`` of an event is its position in the job's list, from 1) and a host gets
them from the plugin alone. Each event names what happened in words a framework reads
(``grow_placed``, ``grow_committed``, ``release_coming``, ``tasks_exited``,
``tasks_lost``, ``size_changed``, ``job_ended``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attrs import frozen

from xce_resize_plugin.core import engine
from xce_resize_plugin.core.facts import (
    Committed,
    Fact,
    GrowPlaced,
    JobEnded,
    TaskExited,
    TasksLost,
    TasksStopped,
    TaskStopped,
)
from xce_resize_plugin.core.models import ChangeKind, Phase, ResizeState, Task
from xce_resize_plugin.errors import UnknownEventCursor

#: The event types, in the order docs/in-job-api.md describes them.
EVENT_TYPES = (
    "grow_placed",
    "grow_committed",
    "release_coming",
    "tasks_exited",
    "tasks_lost",
    "size_changed",
    "job_ended",
)

_STOPPING = (Phase.SHRINK_DRAINING, Phase.SHRINK_STOPPING)


@frozen
class JobEvent:
    """One event of a job: its ``seq`` (from 1, increasing), ``type``, ``time`` (the
    fact's time) and the fields of its type (``data``)."""

    seq: int
    type: str
    time: float
    data: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "type": self.type, "time": self.time, **self.data}


def _ids(tasks: Iterable[Task]) -> list[int]:
    return [t.id for t in tasks]


def _placed(fact: GrowPlaced) -> list[tuple[str, dict[str, Any]]]:
    tasks = [{"id": t.id, "host": t.host} for t in fact.tasks]
    return [("grow_placed", {"task_ids": _ids(fact.tasks), "tasks": tasks})]


def _committed(after: ResizeState) -> list[tuple[str, dict[str, Any]]]:
    record = after.records[-1]
    out: list[tuple[str, dict[str, Any]]] = []
    if record.kind is ChangeKind.GROW:
        out.append(("grow_committed", {"task_ids": _ids(record.delta), "version": record.version}))
    out.append(_size(record.before, record.after, record.version))
    return out


def _size(
    before: Sequence[Task], after: Sequence[Task], version: int
) -> tuple[str, dict[str, Any]]:
    return (
        "size_changed",
        {
            "tasks_before": len(before),
            "tasks_after": len(after),
            "task_ids": _ids(after),
            "version": version,
        },
    )


def _lost(
    before: ResizeState | None, fact: TasksLost, after: ResizeState
) -> list[tuple[str, dict[str, Any]]]:
    # ``reason`` tells a failed host (host_failure) from a release_exited job's own
    # exit (task_exit): the job reacts differently to each.
    lost = {"task_ids": _ids(fact.tasks), "host": fact.host, "status": None}
    out: list[tuple[str, dict[str, Any]]] = [("tasks_lost", {**lost, "reason": fact.reason})]
    old = before.tasks if before is not None else ()
    if after.tasks != old:
        out.append(_size(old, after.tasks, after.version))
    return out


def _of_fact(
    before: ResizeState | None, fact: Fact, after: ResizeState
) -> list[tuple[str, dict[str, Any]]]:
    """The events one fact makes, as (type, fields)."""
    change = after.change
    if (
        change is not None
        and change.kind is ChangeKind.SHRINK
        and after.phase in _STOPPING
        and (before is None or before.phase not in _STOPPING)
    ):
        # The release passed its notification: the stop comes at the deadline (now,
        # without a drain time).
        deadline = change.deadline if change.deadline is not None else fact.at
        return [("release_coming", {"task_ids": _ids(change.tasks), "deadline": deadline})]
    if isinstance(fact, GrowPlaced):
        return _placed(fact)
    if isinstance(fact, Committed):
        return _committed(after)
    if isinstance(fact, TaskStopped | TaskExited):
        reason = fact.reason if isinstance(fact, TaskExited) else "stopped"
        data = {"task_ids": [fact.task_id], "status": fact.status, "reason": reason}
        return [("tasks_exited", data)]
    if isinstance(fact, TasksStopped):
        # Tasks stopped at one instant with one status: one event naming them all.
        data = {"task_ids": list(fact.task_ids), "status": fact.status, "reason": "stopped"}
        return [("tasks_exited", data)]
    if isinstance(fact, TasksLost):
        return _lost(before, fact, after)
    if isinstance(fact, JobEnded):
        return [("job_ended", {})]
    return []


@frozen
class Projection:
    """Where a job's projection stands after some of its facts: the state they leave
    (``None``: before the job's first fact) and how many events they made (the ``seq``
    of the last one). Projecting the next facts from here numbers their events on."""

    state: ResizeState | None = None
    count: int = 0


def step(at: Projection, fact: Fact) -> tuple[Projection, list[JobEvent]]:
    """The events the job's next ``fact`` makes after ``at``, and where the projection
    stands then. Projecting facts one by one from any point gives the events a
    projection from the first fact gives (an event depends only on the state before
    its fact and the fact), so a reader may keep a :class:`Projection` and go on."""
    after = engine.evolve(at.state, fact)
    found = [
        JobEvent(at.count + i, kind, fact.at, data)
        for i, (kind, data) in enumerate(_of_fact(at.state, fact, after), 1)
    ]
    return Projection(after, at.count + len(found)), found


def project_from(at: Projection, facts: Iterable[Fact]) -> tuple[Projection, list[JobEvent]]:
    """The events of the job's ``facts`` that follow ``at``, and where the projection
    stands after them."""
    out: list[JobEvent] = []
    for fact in facts:
        at, found = step(at, fact)
        out += found
    return at, out


def project(facts: Iterable[Fact], prior: ResizeState | None = None) -> list[JobEvent]:
    """The events of one job's facts, in order, numbered from 1. ``prior``: the state
    the facts start from (``None``: the job's first fact)."""
    return project_from(Projection(prior), facts)[1]


def check_cursor(after: int, last: int) -> None:
    """Raise :class:`~xce_resize_plugin.errors.UnknownEventCursor` for a cursor below 0
    or beyond ``last``, the job's last event."""
    if after < 0 or after > last:
        raise UnknownEventCursor(f"after={after}; this job's events run from 1 to {last}")


def after_cursor(events: list[JobEvent], after: int | None) -> list[JobEvent]:
    """The events after the cursor ``after`` (``None``: all of them); a cursor below 0 or
    beyond the last event raises :class:`~xce_resize_plugin.errors.UnknownEventCursor`."""
    if after is None:
        return events
    check_cursor(after, events[-1].seq if events else 0)
    return events[after:]
