"""Finished jobs by the time they ended: which of them are due to be dropped.

The embedded controller adds a job here once its end is reported (``xce_job_end``
returned) and a holder that purges finished jobs takes them out: the due ones from the
front after a while (the live controller's ``[controller] finished_job_keep``), and a
user's oldest when that user has more finished jobs kept than it allows
(``[controller] finished_job_max``; docs/live-controller.md, "Jobs and tasks").

Heaps, one of every job and one per user: an add and a take cost ``log n``, and
finding nothing due costs one comparison, so a purge run at every tick costs in
proportion to what it drops, not to the number of finished jobs kept. A job taken out
through one heap stays in the other until it comes to the top there and is skipped; a
heap is rebuilt from the jobs still kept once most of it is such leftovers, so its size
stays bounded by the jobs kept, whatever the churn of jobs.
"""

from __future__ import annotations

import heapq

#: A heap is rebuilt when it holds more than twice its live entries plus this many.
_SLACK = 1024


class FinishedJobs:
    """Job ids by end time, earliest first (ties by id: ids are unique), and per user."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._by_user: dict[str, list[tuple[float, str]]] = {}
        #: The jobs kept: id -> (end time, user).
        self._kept: dict[str, tuple[float, str]] = {}
        self._counts: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def count(self, user: str) -> int:
        """How many of ``user``'s finished jobs are kept."""
        return self._counts.get(user, 0)

    def users_over(self, most: int) -> list[str]:
        """The users with more than ``most`` finished jobs kept, by name."""
        return sorted(u for u, n in self._counts.items() if n > most)

    def add(self, end_time: float, job_id: str, user: str = "") -> None:
        """Keep ``job_id`` (a job already kept is left as it is)."""
        if job_id in self._kept:
            return
        self._kept[job_id] = (end_time, user)
        self._counts[user] = self._counts.get(user, 0) + 1
        entry = (end_time, job_id)
        heapq.heappush(self._heap, entry)
        heapq.heappush(self._by_user.setdefault(user, []), entry)

    def pop_due(self, before: float) -> tuple[float, str] | None:
        """The earliest entry if it ended at ``before`` or earlier (taken out), else
        ``None`` (nothing is due)."""
        heap = self._heap
        while heap and heap[0][0] <= before:
            entry = heapq.heappop(heap)
            if self._take(entry):
                return entry
        return None

    def pop_oldest(self, user: str) -> tuple[float, str] | None:
        """``user``'s earliest entry (taken out), or ``None`` when it has none."""
        heap = self._by_user.get(user)
        while heap:
            entry = heapq.heappop(heap)
            if self._take(entry, user):
                return entry
        return None

    def _take(self, entry: tuple[float, str], user: str | None = None) -> bool:
        """Take the entry's job out if the entry is its live one (not a leftover of a
        job already taken out through the other heap; from a user's heap, not one of
        a job kept again since, for another user)."""
        end_time, job_id = entry
        kept = self._kept.get(job_id)
        if kept is None or kept[0] != end_time or (user is not None and kept[1] != user):
            return False
        del self._kept[job_id]
        user = kept[1]
        left = self._counts[user] - 1
        if left:
            self._counts[user] = left
        else:
            del self._counts[user]
        self._compact(user)
        return True

    def _compact(self, user: str) -> None:
        """Rebuild a heap that is mostly leftovers (see the module docstring)."""
        kept = self._kept
        if len(self._heap) > 2 * len(kept) + _SLACK:
            self._heap = [(end, job_id) for job_id, (end, _) in kept.items()]
            heapq.heapify(self._heap)
        mine = self._by_user.get(user)
        if mine is None:
            return
        count = self._counts.get(user, 0)
        if not count:
            del self._by_user[user]
        elif len(mine) > 2 * count + _SLACK:
            # From the user's own heap (not every job kept): its live entries, once.
            fresh = list({e for e in mine if kept.get(e[1]) == (e[0], user)})
            heapq.heapify(fresh)
            self._by_user[user] = fresh
