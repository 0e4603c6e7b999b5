"""Finished jobs by the time they ended: which of them are due to be dropped.

The embedded controller adds a job here once its end is reported (``xce_job_end``
returned) and a holder that purges finished jobs after a while (the live controller's
``[controller] finished_job_keep``, docs/live-controller.md, "Jobs and tasks") takes
the due ones from the front. A heap: an add and a take cost ``log n``, and finding
nothing due costs one comparison, so a purge run at every tick costs in proportion
to what it drops, not to the number of finished jobs kept.
"""

from __future__ import annotations

import heapq


class FinishedJobs:
    """Job ids by end time, earliest first (ties by id: ids are unique)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, end_time: float, job_id: str) -> None:
        heapq.heappush(self._heap, (end_time, job_id))

    def pop_due(self, before: float) -> tuple[float, str] | None:
        """The earliest entry if it ended at ``before`` or earlier (taken out), else
        ``None`` (nothing is due)."""
        heap = self._heap
        if not heap or heap[0][0] > before:
            return None
        return heapq.heappop(heap)
