"""Task events reported in runs: many tasks of one job that did the same thing at once.

A release of thousands of tasks ends with thousands of ``exited`` events that differ
only in their task id, and a host that learns of them together (a worker's report, the
simulated runner stopping a release's tasks) would make an event object per task, which
the plugin would then read one by one only to write one fact of all their ids
(``TasksStopped``). A host may instead hand ``xce_task_events`` a :class:`TaskEvents`:
the events in order, where a :class:`TaskEventRun` stands for several alike events. It
reads as the flat sequence of :class:`~.models.TaskEvent` it stands for (so a plugin
that knows nothing of runs sees exactly those events), and the plugin decides a run of
a release's exits, or of a grow's starts, at once (docs/host-integration.md).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, repeat
from typing import overload

from attrs import frozen

from xce_resize_plugin.core.models import TaskEvent

__all__ = ["TaskEventRun", "TaskEvents"]


@frozen
class TaskEventRun(Sequence[TaskEvent]):
    """The same event (``kind``, ``status``, ``reason``, ``stopped``: as in
    :class:`~.models.TaskEvent`) of the tasks ``task_ids`` of job ``job_id``, in that
    order; reads as those events."""

    job_id: str
    task_ids: tuple[int, ...]
    kind: str
    status: int | None = None
    reason: str = ""
    stopped: bool = False

    def __len__(self) -> int:
        return len(self.task_ids)

    @overload
    def __getitem__(self, i: int) -> TaskEvent: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[TaskEvent]: ...

    def __getitem__(self, i: int | slice) -> TaskEvent | Sequence[TaskEvent]:
        if isinstance(i, slice):
            return self.of(self.task_ids[i])
        return TaskEvent(
            self.job_id, self.task_ids[i], self.kind, self.status, self.reason, self.stopped
        )

    def of(self, task_ids: tuple[int, ...]) -> TaskEventRun:
        """The same event of the tasks ``task_ids``."""
        return TaskEventRun(
            self.job_id, task_ids, self.kind, self.status, self.reason, self.stopped
        )

    def __iter__(self) -> Iterator[TaskEvent]:
        return map(
            TaskEvent,
            repeat(self.job_id),
            self.task_ids,
            repeat(self.kind),
            repeat(self.status),
            repeat(self.reason),
            repeat(self.stopped),
        )


Part = TaskEvent | TaskEventRun


class TaskEvents(Sequence[TaskEvent]):
    """Task events in order, given as single events and runs (:attr:`parts`); reads,
    compares and slices as the flat sequence of events they stand for."""

    __slots__ = ("_ends", "parts")

    def __init__(self, parts: Iterable[Part]) -> None:
        #: The single events and runs, in order (empty runs left out).
        self.parts: tuple[Part, ...] = tuple(p for p in parts if _size(p))
        self._ends = list(accumulate(map(_size, self.parts)))

    def runs(self) -> Iterator[TaskEventRun]:
        """Every part as a run (a single event as a run of one)."""
        return map(_as_run, self.parts)

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @overload
    def __getitem__(self, i: int) -> TaskEvent: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[TaskEvent]: ...

    def __getitem__(self, i: int | slice) -> TaskEvent | Sequence[TaskEvent]:
        n = len(self)
        if isinstance(i, slice):
            first, stop, step = i.indices(n)
            if step != 1:
                return tuple(self)[i]
            return TaskEvents(self._cut(first, stop))
        k = i + n if i < 0 else i
        if not 0 <= k < n:
            raise IndexError("task event index out of range")
        j = bisect_right(self._ends, k)
        start = self._ends[j - 1] if j else 0
        return _as_run(self.parts[j])[k - start]

    def _cut(self, first: int, stop: int) -> Iterator[Part]:
        start = 0
        for part, end in zip(self.parts, self._ends, strict=True):
            if end > first and start < stop:
                if start >= first and end <= stop:
                    yield part
                else:
                    run = _as_run(part)
                    yield run.of(run.task_ids[max(first - start, 0) : min(stop, end) - start])
            start = end

    def __iter__(self) -> Iterator[TaskEvent]:
        return chain.from_iterable(map(_as_run, self.parts))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"TaskEvents({list(self.parts)!r})"


def _size(part: Part) -> int:
    return len(part.task_ids) if isinstance(part, TaskEventRun) else 1


def _as_run(part: Part) -> TaskEventRun:
    if isinstance(part, TaskEventRun):
        return part
    return TaskEventRun(
        part.job_id, (part.task_id,), part.kind, part.status, part.reason, part.stopped
    )
