"""The queue a pass reads by blocks (:mod:`~.controllers.pending_queue`) holds the jobs
a plain sorted list holds, skips only blocks in which no job could start, and a pass
over it starts exactly the jobs a pass over the plain list starts."""

from __future__ import annotations

import math
from functools import partial

from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.pending_queue import BLOCK, PendingQueue, fastest
from xce_resize_plugin.controllers.scheduler import PendingJob, RunningJob, easy_pass
from xce_resize_plugin.controllers.slots import FreeSlots


def _slower_when_smaller(runtime: float, ref: int, size: int) -> float:
    """A malleable job's planned duration: non-increasing in the start size."""
    return runtime * ref / size


def _jobs(
    sizes: st.SearchStrategy[int],
    widths: st.SearchStrategy[int],
    durations: st.SearchStrategy[float | None],
) -> st.SearchStrategy[PendingJob]:
    """Pending jobs, one in two malleable (a duration that depends on the start size)."""
    return st.builds(
        lambda i, size, extra, duration, malleable: PendingJob(
            f"j{i}",
            f"u{i % 3}",
            size,
            size + extra,
            None,
            duration,
            partial(_slower_when_smaller, duration or 100.0, size) if malleable else None,
        ),
        st.integers(0, 10**6),
        sizes,
        widths,
        durations,
        st.booleans(),
    )


_job = _jobs(st.integers(1, 40), st.integers(0, 8), st.one_of(st.none(), st.floats(1.0, 5000.0)))
#: Small sizes and few durations: extra slots equal to a job's size, and ends exactly
#: at the shadow time, come often.
_small_job = _jobs(
    st.integers(1, 6), st.integers(0, 2), st.sampled_from([None, 10.0, 100.0, 1000.0])
)


def _unique(jobs: list[PendingJob]) -> list[PendingJob]:
    seen: set[str] = set()
    out = []
    for job in jobs:
        if job.id not in seen:
            seen.add(job.id)
            out.append(job)
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), _job), min_size=1, max_size=400),
    st.lists(st.integers(0, 10**6), max_size=400),
    st.integers(0, 40),
    st.integers(0, 40),
    st.floats(0.0, 6000.0),
)
def test_the_queue_is_a_sorted_list_and_skips_only_blocks_where_none_could_start(
    arrivals: list[tuple[int, PendingJob]],
    leaving: list[int],
    free: int,
    extra: int,
    horizon: float,
) -> None:
    """Arrivals at any place (not only at the end), departures (holes, sweeps, short
    queues deleted in place): the jobs in order are the model's, and ``behind`` gives
    every job that passes the pass's first tests, in order, leaving out only jobs that
    fail them."""
    queue: PendingQueue[PendingJob] = PendingQueue()
    model: list[tuple[int, str, PendingJob]] = []
    jobs = _unique([job for _, job in arrivals])
    keys = {job.id: key for (key, _), job in zip(arrivals, jobs, strict=False)}
    for job in jobs:
        key = (keys[job.id], job.id)
        queue.add(key, job)
        model.append((keys[job.id], job.id, job))
        model.sort(key=lambda e: (e[0], e[1]))
    for pick in leaving:
        if not model:
            break
        k, jid, _ = model.pop(pick % len(model))
        assert queue.remove((k, jid), jid)
        assert not queue.remove((k, jid), jid)  # gone: not there twice
    expected = [job for _, _, job in model]
    assert list(queue) == expected and len(queue) == len(expected)
    assert bool(queue) == bool(expected)

    def fails(job: PendingJob) -> bool:
        return job.min_tasks > free or (extra < job.min_tasks and fastest(job) > horizon)

    given_jobs = list(
        queue.behind(0, lambda: free, lambda size, shortest: extra < size and shortest > horizon)
    )
    if free <= 0:
        assert given_jobs == []
        return
    assert [j for j in expected if j in given_jobs] == given_jobs  # in order, none twice
    assert all(fails(job) for job in expected if job not in given_jobs)
    # And read again, after the blocks with holes were measured: the same.
    again = list(
        queue.behind(0, lambda: free, lambda size, shortest: extra < size and shortest > horizon)
    )
    assert again == given_jobs
    if len(expected) > 2 * BLOCK and free < 40:
        assert len(given_jobs) <= len(expected)


def test_the_position_after_counts_jobs_not_holes() -> None:
    queue: PendingQueue[PendingJob] = PendingQueue()
    jobs = [PendingJob(f"j{i}", "u", 1, 1, None, 1.0) for i in range(3 * BLOCK)]
    for i, job in enumerate(jobs):
        queue.add((i,), job)
    assert queue.remove((0,), "j0") and queue.remove((2,), "j2")  # holes: deep queue
    assert queue.position_after(0) == 0
    assert queue.position_after(1) == 2  # j1, at position 1
    assert queue.position_after(2) == 4  # j3, after the hole of j2
    assert list(queue)[:2] == [jobs[1], jobs[3]]


def test_a_malleable_jobs_fastest_duration_is_at_its_largest_start() -> None:
    job = PendingJob("m", "u", 2, 8, None, None, partial(_slower_when_smaller, 80.0, 2))
    assert fastest(job) == 20.0
    assert fastest(PendingJob("r", "u", 2, 2, None, None)) == math.inf
    assert fastest(PendingJob("r", "u", 2, 2, None, 30.0)) == 30.0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_job, _small_job), min_size=BLOCK, max_size=6 * BLOCK),
    st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from([None, 0.0, 10.0, 100.0, 1000.0, 2500.0]))
    ),
    st.integers(0, 60),
    st.lists(st.integers(0, 10**6), max_size=3 * BLOCK),
)
def test_a_pass_over_the_block_queue_starts_what_a_pass_over_a_list_starts(
    arrivals: list[PendingJob],
    held: list[tuple[int, float | None]],
    free_slots: int,
    leaving: list[int],
) -> None:
    """Deep queues (one to six blocks behind the head), rigid, moldable and malleable
    jobs, jobs without a duration, running jobs with and without an end: the same
    starts and the same reservation as the plain list, holes included."""
    jobs = _unique(arrivals)
    queue: PendingQueue[PendingJob] = PendingQueue()
    for i, job in enumerate(jobs):
        queue.add((i,), job)
    for pick in leaving:
        live = list(queue)
        if len(live) <= BLOCK:
            break
        gone = live[pick % len(live)]
        assert queue.remove((jobs.index(gone),), gone.id)
    plain = list(queue)
    hosts = max(1, free_slots + sum(n for n, _ in held))
    names = [f"h{i:04d}" for i in range(hosts)]
    counts = [1 if i < free_slots else 0 for i in range(hosts)]
    running = []
    at = free_slots
    for k, (n, end) in enumerate(held):
        running.append(RunningJob(f"r{k}", end, {h: 1 for h in names[at : at + n]}))
        at += n
    running.sort(key=lambda r: math.inf if r.end is None else r.end)
    limits = {"u0": 30}.get
    expected = easy_pass(0.0, plain, running, FreeSlots(names, counts), limits)
    assert easy_pass(0.0, queue, running, FreeSlots(names, counts), limits) == expected


def _deep_pass(targets: list[PendingJob]) -> tuple[list[str], list[str]]:
    """Ten one-slot hosts, six held until t=100 and four free; the head needs eight
    (shadow time 100, extra slots 2); behind it 63 jobs too wide to start now, then a
    whole block of ``targets``. The jobs started over the block queue and over a list."""
    names = [f"h{i}" for i in range(10)]
    running = [RunningJob("r", 100.0, {h: 1 for h in names[:6]})]
    head = PendingJob("head", "u", 8, 8, None, 50.0)
    wide = [PendingJob(f"w{i}", "u", 5, 5, None, 10.0) for i in range(BLOCK - 1)]
    jobs = [head, *wide, *targets]
    queue: PendingQueue[PendingJob] = PendingQueue()
    for i, job in enumerate(jobs):
        queue.add((i,), job)
    starts = []
    for pending in (queue, jobs):
        free = FreeSlots(names, [0] * 6 + [1] * 4)
        result = easy_pass(0.0, pending, running, free, lambda user: None)
        assert result.reservation is not None and result.reservation.shadow == 100.0
        starts.append([s.job_id for s in result.starts])
    return starts[0], starts[1]


def test_a_block_whose_smallest_job_fits_the_extra_slots_exactly_is_read() -> None:
    targets = [PendingJob(f"t{i}", "u", 2, 2, None, None) for i in range(BLOCK)]
    over_queue, over_list = _deep_pass(targets)
    assert over_queue == over_list == ["t0"]  # 2 extra slots: one of them backfills


def test_a_block_whose_jobs_end_exactly_at_the_shadow_time_is_read() -> None:
    targets = [PendingJob(f"t{i}", "u", 3, 3, None, 100.0) for i in range(BLOCK)]
    over_queue, over_list = _deep_pass(targets)
    assert over_queue == over_list == ["t0"]  # ends at 100, the shadow time: backfilled
