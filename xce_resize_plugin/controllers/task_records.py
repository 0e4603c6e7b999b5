"""A job's task processes as the embedded controller tracks them: their states, one
record per task, and the records of a job's many tasks kept in bulk.

Both controllers read these (:mod:`.jobs` holds them in a job's record); the simulated
controller changes a job's tasks in bulk where it can (:class:`TaskStates`), because a
trace's large jobs start, shrink and end thousands of tasks at one instant.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, MutableMapping, Sequence

from attrs import define

from xce_resize_plugin.core.models import Task, TasksInIdOrder

__all__ = [
    "LIVE_STATES",
    "TaskRecord",
    "TaskState",
    "TaskStates",
    "mark_exited",
    "mark_gone",
    "prune_ended",
]


class TaskState(enum.Enum):
    """A task's process as the host sees it."""

    #: Launched, the runner has not reported yet (a live runner reports later).
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    #: SIGTERM sent, exit not seen yet.
    STOPPING = "STOPPING"
    EXITED = "EXITED"
    #: The launch failed; the task never ran.
    FAILED = "FAILED"


#: Task states whose process may still be alive (both controllers read them).
LIVE_STATES = (TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING)


@define
class TaskRecord:
    """One task's process: where, in which state, since when.

    ``stop_since`` and ``grace`` are kept while the task is STOPPING so that a restarted
    controller can re-arm the SIGKILL deadline (the process would not wait for us).
    """

    host: str
    state: TaskState
    since: float
    status: int | None = None
    reason: str = ""
    stop_since: float | None = None
    grace: float | None = None


def mark_exited(rec: TaskRecord, now: float, status: int | None, reason: str) -> bool:
    """Mark a live task's record exited ``now``, as its process ended; whether the host
    had asked it to stop (a release, the job's end)."""
    stopped = rec.state is TaskState.STOPPING
    rec.state = TaskState.EXITED
    rec.since = now
    rec.status = status
    rec.reason = reason
    rec.stop_since = rec.grace = None
    return stopped


def mark_gone(rec: TaskRecord, now: float, reason: str) -> None:
    """Mark a live task's record exited ``now`` because its job ended (the end took its
    process down: no exit status of its own, the one it had is kept)."""
    mark_exited(rec, now, rec.status, reason)


def prune_ended(
    records: MutableMapping[int, TaskRecord], held: Iterable[int], keep: int
) -> list[int]:
    """Drop the records of ended tasks (exited, or failed to start) that the job no
    longer holds, but the ``keep`` newest (task ids only grow); the ids dropped.

    Such a task is done with for good: its slot is freed, the plugin has seen its end
    (it frees a task only after that), and task ids are never used again, so no launch
    or stop of it can come back. A live record, or one of a task still held (it may
    be re-launched or stopped again after a failover, and must then be re-reported,
    not started twice), is never dropped."""
    kept = set(held)
    ended = sorted(
        tid for tid, rec in records.items() if rec.state not in LIVE_STATES and tid not in kept
    )
    gone = ended[: max(0, len(ended) - keep)]
    for tid in gone:
        del records[tid]
    return gone


class _Group:
    """Start tasks changed together and not one by one since: one record's fields
    (``template``; its host is unused) shared by the task ids in ``ids``."""

    __slots__ = ("ids", "template")

    def __init__(self, ids: set[int], template: TaskRecord) -> None:
        self.ids = ids
        self.template = template

    def record(self, host: str) -> TaskRecord:
        t = self.template
        return TaskRecord(host, t.state, t.since, t.status, t.reason, t.stop_since, t.grace)


class TaskStates(MutableMapping[int, TaskRecord]):
    """A job's task records (task id -> :class:`TaskRecord`), each made on first use.

    A job starts with every task RUNNING since its start, and most jobs of a trace
    simulation end without anyone asking about one of their tasks: making a record per
    task at every start and marking each exited at every end was a good part of what a
    start and an end cost for jobs of thousands of tasks. This holds the start's tasks
    and their common state, and a record only for each task read or changed one by one
    (a shrink stops a few of a job's many tasks) or added later (a grow's); it behaves
    as the dict of records it stands for, which it makes whole only when iterated.

    A release that stops thousands of a large job's start tasks at once keeps them as
    one group with one state (:meth:`stop_group`, :meth:`exit_group`) rather than a
    record each; a task of a group read or changed on its own gets its own record then.
    """

    __slots__ = (
        "_added",
        "_full",
        "_groups",
        "_hosts",
        "_reason",
        "_records",
        "_since",
        "_state",
        "_tasks",
    )

    def __init__(self, tasks: Sequence[Task], state: TaskState, since: float) -> None:
        #: Records made so far: of start tasks read or changed, and of tasks added.
        self._records: dict[int, TaskRecord] = {}
        #: The records are the whole dict (then the rest below is unused).
        self._full = False
        self._tasks = tasks
        self._state = state
        self._since = since
        self._reason = ""
        #: How many of the records are of tasks added after the start.
        self._added = 0
        #: The start tasks' hosts: by id, or (ids ``0..n-1`` in order) by index; made
        #: at the first look-up.
        self._hosts: dict[int, str] | list[str] | None = None
        #: Start tasks changed together (no record of their own, not in another
        #: group): their state is the group's, not the start's.
        self._groups: list[_Group] = []

    def _host_of(self, task_id: int) -> str | None:
        """The host of a start task (``None``: not one)."""
        hosts = self._hosts
        if hosts is None:
            hosts = self._hosts = self._host_index()
        if isinstance(hosts, list):
            if isinstance(task_id, int) and 0 <= task_id < len(hosts):
                return hosts[task_id]
            return None
        return hosts.get(task_id)

    def _host_index(self) -> dict[int, str] | list[str]:
        tasks = self._tasks
        n = len(tasks)
        if isinstance(tasks, TasksInIdOrder) and n and tasks[0].id == 0 and tasks[-1].id == n - 1:
            # Ascending ids from 0 to n-1: task i is at index i. A host's lazy list gives
            # its hosts without making its tasks (a release stops thousands at once).
            return list(tasks.task_hosts())
        return {t.id: t.host for t in tasks}

    def _record(self, task_id: int) -> TaskRecord | None:
        """The task's record, made now for a start task never read before."""
        rec = self._records.get(task_id)
        if rec is not None or self._full:
            return rec
        host = self._host_of(task_id)
        if host is None:
            return None
        for group in self._groups:
            if task_id in group.ids:
                # From now on the task changes on its own.
                group.ids.discard(task_id)
                rec = self._records[task_id] = group.record(host)
                return rec
        rec = self._records[task_id] = TaskRecord(
            host, self._state, self._since, reason=self._reason
        )
        return rec

    def _all(self) -> dict[int, TaskRecord]:
        if not self._full:
            made: dict[int, TaskRecord | None] = dict(self._records)
            grouped = {tid: group for group in self._groups for tid in group.ids}
            state, since, reason = self._state, self._since, self._reason
            records: dict[int, TaskRecord] = {}
            for t in self._tasks:
                rec = made.pop(t.id, None)
                if rec is None:
                    group = grouped.get(t.id)
                    rec = (
                        TaskRecord(t.host, state, since, reason=reason)
                        if group is None
                        else group.record(t.host)
                    )
                records[t.id] = rec
            # The added tasks, in the order they came.
            records.update((tid, rec) for tid, rec in made.items() if rec is not None)
            self._records, self._full = records, True
            self._tasks, self._hosts, self._groups = (), None, []
        return self._records

    def _ungrouped_start_tasks(self, task_ids: Sequence[int]) -> set[int] | None:
        """``task_ids`` as a set when they are distinct start tasks, none with a record
        of its own or in a group (``None`` otherwise): checked in C, not task by task."""
        ids = set(task_ids)
        if not ids or len(ids) != len(task_ids) or set(map(type, ids)) != {int}:
            return None
        hosts = self._hosts
        if hosts is None:
            hosts = self._hosts = self._host_index()
        if isinstance(hosts, list):
            if min(ids) < 0 or max(ids) >= len(hosts):
                return None
        elif not ids <= hosts.keys():
            return None
        if not ids.isdisjoint(self._records):
            return None
        if any(not ids.isdisjoint(group.ids) for group in self._groups):
            return None
        return ids

    def stop_group(
        self, task_ids: Sequence[int], now: float, grace: float, stoppable: tuple[TaskState, ...]
    ) -> bool:
        """Mark these start tasks STOPPING as one group, as the host's stop marks each
        task's record (state, ``stop_since``, ``grace``); ``False`` (nothing changed)
        unless they are all distinct start tasks in a ``stoppable`` state, without a
        record or a group of their own: the caller then takes them one by one."""
        if self._full or self._state not in stoppable:
            return False
        ids = self._ungrouped_start_tasks(task_ids)
        if ids is None:
            return False
        template = TaskRecord("", TaskState.STOPPING, self._since, None, self._reason, now, grace)
        self._groups.append(_Group(ids, template))
        return True

    def exit_group(
        self, task_ids: Sequence[int], now: float, status: int | None, reason: str
    ) -> bool | None:
        """Mark a group exited ``now`` when ``task_ids`` are exactly its tasks and it may
        still be alive, as the host marks each task's record; whether it was STOPPING
        (asked to stop), or ``None`` (nothing changed: the caller takes them one by
        one)."""
        if self._full:
            return None
        n = len(task_ids)
        for group in self._groups:
            if len(group.ids) == n and group.ids == set(task_ids):
                if group.template.state not in LIVE_STATES:
                    return None
                return mark_exited(group.template, now, status, reason)
        return None

    def exit_live(
        self, now: float, reason: str, live: tuple[TaskState, ...]
    ) -> Iterable[TaskRecord]:
        """Mark the start tasks still in a ``live`` state without a record exited
        ``now``, without making their records; return the records made, which the
        caller marks itself."""
        if not self._full:
            if self._state in live:
                self._state, self._since, self._reason = TaskState.EXITED, now, reason
            for group in self._groups:
                if group.template.state in live:
                    mark_gone(group.template, now, reason)  # as the caller marks a record
        return self._records.values()

    def __getitem__(self, task_id: int) -> TaskRecord:
        rec = self._record(task_id)
        if rec is None:
            raise KeyError(task_id)
        return rec

    def __setitem__(self, task_id: int, record: TaskRecord) -> None:
        if not self._full and task_id not in self._records:
            if self._host_of(task_id) is None:
                self._added += 1
            else:
                for group in self._groups:
                    group.ids.discard(task_id)
        self._records[task_id] = record

    def __delitem__(self, task_id: int) -> None:
        del self._all()[task_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._records) if self._full else len(self._tasks) + self._added

    def __contains__(self, task_id: object) -> bool:
        if task_id in self._records:
            return True
        return not self._full and isinstance(task_id, int) and self._host_of(task_id) is not None

    def get(self, task_id: int, default: TaskRecord | None = None) -> TaskRecord | None:  # type: ignore[override]
        rec = self._record(task_id)
        return default if rec is None else rec

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, TaskStates) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TaskStates({self._all()!r})"
