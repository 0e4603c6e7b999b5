"""Textbook EASY backfilling (Lifka 1995; Mu'alem and Feitelson 2001), written to be
read, not to be fast: the reference the production scheduler is compared with.

Rigid jobs on a machine of ``capacity`` processors, counted, never placed. The rules,
exactly as docs/simulation.md states them:

- at each instant, job ends are processed first, then arrivals, then one pass;
- the queue is ordered by submit time, then job id (numeric ids numerically);
- jobs start from the head of the queue while they fit;
- the first job that does not fit is the *head*; its *shadow time* is found by walking
  the running jobs by expected end (start + estimate; a job past its estimate ends
  "now"; all jobs ending at the same instant count) until the head fits;
- *extra* = free processors at the shadow time minus the head's;
- every later job, in queue order, is backfilled if it fits now and either is expected
  to end by the shadow time or fits in the extra processors (which then shrink).

A job really runs ``runtime`` seconds; the scheduler only knows ``estimate``.
"""

from __future__ import annotations

from attrs import frozen

from xce_resize_plugin.controllers.jobs import job_id_key


@frozen
class RefJob:
    """One rigid job of the reference workload."""

    id: str
    submit: float
    size: int
    runtime: float
    estimate: float


def textbook_easy(capacity: int, jobs: list[RefJob]) -> dict[str, float]:
    """Every job's start time under textbook EASY on ``capacity`` processors."""
    assert all(1 <= j.size <= capacity for j in jobs)
    future = sorted(jobs, key=lambda j: (j.submit, job_id_key(j.id)))
    queue: list[RefJob] = []
    running: list[tuple[RefJob, float]] = []  # (job, start)
    starts: dict[str, float] = {}
    now = future[0].submit if future else 0.0
    while future or queue or running:
        # 1. ends, 2. arrivals, 3. one pass.
        running = [(j, s) for j, s in running if s + j.runtime > now]
        while future and future[0].submit <= now:
            queue.append(future.pop(0))
        queue.sort(key=lambda j: (j.submit, job_id_key(j.id)))
        _one_pass(now, capacity, queue, running, starts)
        times = [s + j.runtime for j, s in running] + [j.submit for j in future[:1]]
        if not times:
            break
        now = min(times)
    return starts


def _one_pass(
    now: float,
    capacity: int,
    queue: list[RefJob],
    running: list[tuple[RefJob, float]],
    starts: dict[str, float],
) -> None:
    free = capacity - sum(j.size for j, _ in running)

    def start(job: RefJob) -> int:
        queue.remove(job)
        running.append((job, now))
        starts[job.id] = now
        return job.size

    while queue and queue[0].size <= free:
        free -= start(queue[0])
    if not queue:
        return
    head = queue[0]
    # The shadow time: release running jobs by expected end, a whole instant at a time.
    ends = sorted({max(now, s + j.estimate) for j, s in running})
    shadow = None
    for t in ends:
        avail = free + sum(j.size for j, s in running if max(now, s + j.estimate) <= t)
        if avail >= head.size:
            shadow = t
            extra = avail - head.size
            break
    assert shadow is not None  # every job fits the machine: the head fits once all end
    for job in list(queue[1:]):
        if job.size > free:
            continue
        if now + job.estimate <= shadow:
            free -= start(job)
        elif job.size <= extra:
            free -= start(job)
            extra -= job.size
