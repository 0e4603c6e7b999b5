"""The pending jobs in queue order, with what lets a backfill pass skip stretches of a
deep queue without reading them.

A pass reads the jobs behind the blocked head one by one (:mod:`.scheduler`), and in
a queue thousands deep nearly all of them fail its first, cheapest tests: more tasks
than the free slots, or neither ending by the shadow time nor fitting in the extra
slots (docs/performance.md, "Deep queues read by blocks"). :class:`PendingQueue`
keeps, per block of :data:`BLOCK` consecutive positions, a lower bound of its jobs'
``min_tasks`` and of their shortest planned durations, so that
:meth:`PendingQueue.behind` passes over a whole block of which no job could pass
those tests and yields the other blocks' jobs in order. The pass tests each job it is
given as before: skipping a block changes nothing but the steps, and the starts are
the same (tested against a plain list).

A job that leaves the queue leaves a hole (its block's bound stays a lower bound, made
exact again when a pass needs it); the holes are swept out once they outnumber the
jobs, and a queue of at most :data:`IN_PLACE` positions deletes in place. Arrivals
come at the end of the queue and touch only the last block; one that comes earlier (a
requeued job) makes the blocks from there on be measured again.
"""

from __future__ import annotations

import bisect
import math
import sys
from collections.abc import Callable, Hashable, Iterator
from itertools import compress, count, islice
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["BLOCK", "PendingQueue", "Queued", "fastest"]


class Queued(Protocol):
    """What the queue reads of a pending job (the scheduler's ``PendingJob``, which
    imports this module)."""

    @property
    def id(self) -> str: ...
    @property
    def min_tasks(self) -> int: ...
    @property
    def max_tasks(self) -> int: ...
    @property
    def duration(self) -> float | None: ...
    @property
    def duration_at(self) -> Callable[[int], float | None] | None: ...


J = TypeVar("J", bound=Queued)

#: Positions per block. Small enough that a block with one job that could start costs
#: little to read; large enough that skipping one saves many steps.
BLOCK = 64

#: Up to this many positions, a job that leaves is deleted in place, not left as a hole.
IN_PLACE = 2 * BLOCK

_NO_SIZE = sys.maxsize  # a hole's min_tasks: never fits


def fastest(job: Queued) -> float:
    """The shortest planned duration the job can have: its duration, or, when that
    depends on the start size, the duration at its largest start (the scheduler's
    rule: the largest start is the fastest); none (unbounded) is ``inf``."""
    d = job.duration if job.duration_at is None else job.duration_at(job.max_tasks)
    return math.inf if d is None else d


class PendingQueue(Generic[J]):
    """The pending jobs ordered by a key (the controller's submit time, then job id),
    with per-block bounds for :meth:`behind`. Iterating gives the jobs in order."""

    __slots__ = (
        "_durations",
        "_holes",
        "_jobs",
        "_keys",
        "_measured",
        "_min_durations",
        "_min_sizes",
        "_sizes",
        "_stale",
    )

    def __init__(self) -> None:
        self._keys: list[Any] = []  # sorted; a hole keeps its key (bisect still works)
        self._jobs: list[J | None] = []  # None: a hole
        self._sizes: list[int] = []
        self._durations: list[float] = []
        self._min_sizes: list[int] = []
        self._min_durations: list[float] = []
        self._stale: set[int] = set()  # blocks with holes made since they were measured
        self._measured = 0  # blocks before this one have bounds (exact or lower)
        self._holes = 0

    def __len__(self) -> int:
        return len(self._jobs) - self._holes

    def __bool__(self) -> bool:
        return len(self._jobs) > self._holes

    def __iter__(self) -> Iterator[J]:
        return filter(None, self._jobs)

    def add(self, key: Hashable, job: J) -> None:
        """Queue ``job`` after every job whose key is not greater than ``key``."""
        keys = self._keys
        i = bisect.bisect_right(keys, key)
        size, duration = job.min_tasks, fastest(job)
        if i == len(keys):
            keys.append(key)
            self._jobs.append(job)
            self._sizes.append(size)
            self._durations.append(duration)
            b = i // BLOCK
            if b < self._measured:  # the last block, measured: its bounds take the job
                self._min_sizes[b] = min(self._min_sizes[b], size)
                self._min_durations[b] = min(self._min_durations[b], duration)
            return
        keys.insert(i, key)
        self._jobs.insert(i, job)
        self._sizes.insert(i, size)
        self._durations.insert(i, duration)
        # Every later position moved: the blocks from this one on are measured again.
        self._measured = min(self._measured, i // BLOCK)

    def remove(self, key: Hashable, job_id: str) -> bool:
        """Take the job with this key and id out; ``False`` if it is not queued."""
        keys, jobs = self._keys, self._jobs
        i = bisect.bisect_left(keys, key)
        while i < len(keys) and keys[i] == key:
            queued = jobs[i]
            if queued is not None and queued.id == job_id:
                if len(jobs) <= IN_PLACE:
                    # Not deep: moving the later jobs down costs less than the holes
                    # would (every pass reads past them), and measuring its few
                    # blocks again is cheap.
                    del keys[i], jobs[i], self._sizes[i], self._durations[i]
                    self._measured = min(self._measured, i // BLOCK)
                    if self._holes * 2 > len(jobs):
                        self._sweep()
                    return True
                jobs[i] = None
                self._sizes[i] = _NO_SIZE
                self._durations[i] = math.inf
                self._stale.add(i // BLOCK)  # its bounds are still lower bounds
                self._holes += 1
                if self._holes > BLOCK and self._holes * 2 > len(jobs):
                    self._sweep()
                return True
            i += 1
        return False

    def _sweep(self) -> None:
        """Drop the holes (all at once: the positions of every later job change)."""
        live = list(map(bool, self._jobs))
        self._keys = list(compress(self._keys, live))
        self._jobs = list(compress(self._jobs, live))
        self._sizes = list(compress(self._sizes, live))
        self._durations = list(compress(self._durations, live))
        self._holes = 0
        self._measured = 0
        self._stale.clear()

    def _bounds(self) -> tuple[list[int], list[float]]:
        """Each block's bounds, measured anew from the first block that moved."""
        blocks = -(-len(self._jobs) // BLOCK)
        first = self._measured
        if first < blocks:
            del self._min_sizes[first:], self._min_durations[first:]
            for b in range(first, blocks):
                self._measure(b, append=True)
            self._measured = blocks
        return self._min_sizes, self._min_durations

    def _measure(self, b: int, append: bool = False) -> None:
        lo = b * BLOCK
        size = min(self._sizes[lo : lo + BLOCK])
        duration = min(self._durations[lo : lo + BLOCK])
        if append:
            self._min_sizes.append(size)
            self._min_durations.append(duration)
        else:
            self._min_sizes[b], self._min_durations[b] = size, duration
        self._stale.discard(b)

    def position_after(self, read: int) -> int:
        """The position after the ``read``-th job (holes counted)."""
        if read <= 0:
            return 0
        return next(islice(compress(count(), self._jobs), read - 1, None), len(self._jobs)) + 1

    def behind(
        self,
        start: int,
        free: Callable[[], int],
        skippable: Callable[[int, float], bool],
    ) -> Iterator[J]:
        """The jobs from position ``start`` on, in order, but for whole blocks of which
        no job can start: at each block's first position, a block whose smallest
        ``min_tasks`` is above ``free()`` (the free slots now) is passed over, and so
        is one for which ``skippable(smallest min_tasks, shortest fastest duration)``
        holds (the caller's test that no job of it fits in the extra slots or ends by
        the shadow time). Stops when ``free()`` is 0. Both are asked afresh at each
        block, so they may shrink while the caller starts the jobs it is given."""
        jobs = self._jobs
        n = len(jobs)
        min_sizes, min_durations = self._bounds()
        stale = self._stale
        i = start
        while i < n:
            b = i // BLOCK
            end = min((b + 1) * BLOCK, n)
            if i == b * BLOCK:
                total = free()
                if total <= 0:
                    return
                if min_sizes[b] > total or skippable(min_sizes[b], min_durations[b]):
                    i = end
                    continue
                if b in stale:  # holes since it was measured: its bounds may be low
                    self._measure(b)
                    if min_sizes[b] > total or skippable(min_sizes[b], min_durations[b]):
                        i = end
                        continue
            yield from filter(None, jobs[i:end])
            i = end
