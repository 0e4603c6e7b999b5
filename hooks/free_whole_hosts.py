"""Site policy: a count-based shrink frees whole hosts first.

Why a site wants it: a host the job leaves entirely can take another job (or be powered
down); taking one task from each of four hosts frees nothing usable. The job's hosts with
the fewest of its tasks are emptied first (newest host first on ties), never task 0.

Enable with ``[resize] policy_files = ["hooks/free_whole_hosts.py"]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xce_resize_plugin import JobInfo, Task, hookimpl


@hookimpl
def xce_resize_select_release(
    job: JobInfo, candidates: Sequence[Task], count: int
) -> Sequence[int] | None:
    by_host: dict[str, list[Task]] = {}
    for task in candidates:
        by_host.setdefault(task.host, []).append(task)
    head_host = job.tasks[0].host if job.tasks else None
    # The head host can never be emptied (task 0 stays): it goes last.
    order = sorted(
        by_host,
        key=lambda h: (h == head_host, len(by_host[h]), -max(t.id for t in by_host[h])),
    )
    chosen: list[int] = []
    for host in order:
        for task in sorted(by_host[host], key=lambda t: t.id, reverse=True):
            if len(chosen) == count:
                return chosen
            chosen.append(task.id)
    return chosen if len(chosen) == count else None
