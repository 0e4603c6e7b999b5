"""The discrete event loop's timeline and the queue of events owed to the plugin.

Two queues, for two different reasons:

- :class:`Timeline` holds what happens at a future simulated instant (a job arriving,
  a job's runtime elapsing, a task exiting after its stop delay, a scenario command).
  It is a heap ordered by time and then by insertion sequence, so two runs of the same
  input interleave identically.
- :class:`EventQueue` holds plugin events (``xce_task_event``, ``xce_notify_done``)
  produced while the plugin is inside a call to the controller. They are delivered only
  after the plugin's hook has returned, never by re-entering the plugin.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Iterator

from attrs import frozen

from xce_resize_plugin.core.task_events import TaskEventRun
from xce_resize_plugin.host import TaskEvent

#: The simulated clock's range, in seconds (317 years). Times (arrivals, run times,
#: requests, scenario instants) beyond it are refused where they are read (traces,
#: scenario files) rather than simulated: near 1e300 adding an hour changes nothing,
#: and a job would end as it starts. At 1e10 a double still resolves 2 µs. The
#: "unlimited" request 2**31 - 1 of some SWF logs is below it.
MAX_SECONDS = 1e10


class Timeline:
    """Callbacks at simulated times; ties run in insertion order."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    def at(self, time: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._heap, (float(time), next(self._seq), fn))

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_at(self, time: float) -> list[Callable[[], None]]:
        """Remove and return the callbacks due at ``time`` (in order). Callbacks they
        schedule for the same instant are returned by the next call."""
        due: list[Callable[[], None]] = []
        while self._heap and self._heap[0][0] <= time:
            due.append(heapq.heappop(self._heap)[2])
        return due

    def __len__(self) -> int:
        return len(self._heap)


@frozen
class NotifyDone:
    """A finished notification command, owed to ``xce_notify_done``."""

    job_id: str
    attempt: int
    status: int | None
    reason: str


#: A run stands for the events of several tasks alike (core/task_events.py).
PluginEvent = TaskEvent | TaskEventRun | NotifyDone


class EventQueue:
    """FIFO of plugin events waiting for the current hook to return."""

    def __init__(self) -> None:
        self._queue: deque[PluginEvent] = deque()

    def put(self, event: PluginEvent) -> None:
        self._queue.append(event)

    def drain(self) -> Iterator[PluginEvent]:
        """Yield events until the queue is empty, including ones queued meanwhile."""
        while self._queue:
            yield self._queue.popleft()

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[PluginEvent]:
        return iter(tuple(self._queue))
