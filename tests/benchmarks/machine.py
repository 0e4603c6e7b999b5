"""A fixed amount of plain Python work, to tell how fast the machine is today.

The issue's absolute targets (seconds of wall time) are measured on a shared machine
whose speed changes from one day to the next: the same commit ran HPC2N's elastic run
in 28.9-30.0 CPU s one day and 38.5 the next (docs/performance.md). A benchmark that
prints an absolute time also prints how long this work took in the same process, so
that two reports can be compared: the work imports nothing from the package, so it
does not change when the package does.

The work is of the kind a simulation does: small objects made and dropped, dicts and
a heap of events, tuples compared, short function calls.
"""

from __future__ import annotations

import heapq
import time


class _Job:
    __slots__ = ("end", "id", "size")

    def __init__(self, id: int, size: int, end: float) -> None:
        self.id = id
        self.size = size
        self.end = end


def _step(free: dict[int, int], job: _Job) -> bool:
    host = job.id % 64
    if free.get(host, 0) >= job.size:
        free[host] -= job.size
        return True
    return False


def _work(n: int) -> int:
    """Start and end ``n`` jobs on 64 hosts in event order; the count of starts."""
    free = {h: 8 for h in range(64)}
    events: list[tuple[float, int, _Job]] = []
    started = 0
    seed = 12345
    for i in range(n):
        seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
        job = _Job(i, 1 + (seed >> 16) % 8, i + (seed >> 4) % 500)
        while events and events[0][0] <= i:
            _, _, done = heapq.heappop(events)
            free[done.id % 64] += done.size
        if _step(free, job):
            started += 1
            heapq.heappush(events, (job.end, job.id, job))
    return started


#: Jobs in one measurement: about half a second on the machine of 2026-12-05.
JOBS = 700_000


def reference_seconds(repeat: int = 3, jobs: int = JOBS) -> float:
    """The best of ``repeat`` CPU times of the fixed work (the least disturbed);
    ``jobs`` other than :data:`JOBS` only to test this function quickly."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        _work(jobs)
        best = min(best, time.process_time() - t0)
    return best
