"""How a state digest stands for the pending queue: by its jobs in order with their
keys. Its holes and block bounds (controllers/pending_queue.py) depend on the queue's
history and only save a backfill pass steps, so two queues holding the same jobs are
the same state however they came to hold them; a different job, order or key is not.
(Left in, an emptied queue's stale bounds kept LLNL Thunder's split runs from ever
meeting: docs/performance.md, "Runs split in time".)"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable

import attrs

from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.pending_queue import IN_PLACE, PendingQueue
from xce_resize_plugin.simulation.pause_state import _StatePickler


@attrs.frozen
class Job:
    id: str
    min_tasks: int
    max_tasks: int
    duration: float | None
    duration_at: Callable[[int], float | None] | None = None


def _pickled(obj: object) -> bytes:
    buf = io.BytesIO()
    _StatePickler(buf, Observer()).dump(obj)
    return buf.getvalue()


def _job(i: int) -> Job:
    return Job(f"j{i}", 1 + i % 7, 8, 60.0 * (1 + i % 5))


def _queue(ids: Iterable[int]) -> PendingQueue[Job]:
    q: PendingQueue[Job] = PendingQueue()
    for i in ids:
        q.add((float(i), f"j{i}"), _job(i))
    return q


def _measured(q: PendingQueue[Job]) -> PendingQueue[Job]:
    """The queue after a pass read it past every block (its bounds measured)."""
    list(q.behind(0, lambda: 0, lambda size, duration: True))
    return q


def test_a_queue_with_holes_is_the_queue_of_its_jobs() -> None:
    n = 3 * IN_PLACE
    gone = set(range(0, n, 3))
    q = _measured(_queue(range(n)))
    for i in sorted(gone):
        assert q.remove((float(i), f"j{i}"), f"j{i}")
    kept = [i for i in range(n) if i not in gone]
    assert q._holes > 0  # the layouts differ
    assert _pickled(q) == _pickled(_queue(kept))
    assert _pickled(q) == _pickled(_measured(_queue(kept)))


def test_an_emptied_queue_is_an_empty_queue() -> None:
    q = _measured(_queue(range(20)))
    for i in range(20):
        assert q.remove((float(i), f"j{i}"), f"j{i}")
    assert q._min_sizes  # stale bounds left behind
    assert _pickled(q) == _pickled(PendingQueue())


def test_different_jobs_orders_or_keys_are_different_queues() -> None:
    base = _pickled(_queue(range(10)))
    assert base != _pickled(_queue(range(9)))
    assert base != _pickled(_queue([*range(9), 11]))
    swapped: PendingQueue[Job] = PendingQueue()
    for i in range(10):
        swapped.add((float(i), f"j{i}"), _job(9 - i))
    assert base != _pickled(swapped)
    later: PendingQueue[Job] = PendingQueue()
    for i in range(10):
        later.add((float(i) + 0.5, f"j{i}"), _job(i))
    assert base != _pickled(later)
