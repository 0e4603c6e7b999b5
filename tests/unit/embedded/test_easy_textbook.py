"""The host's scheduler is textbook EASY on rigid jobs, whatever the hosts look like.

The reference (:mod:`tests.easy_reference`) counts processors and never places a job;
the embedded controller runs the same workload on hosts of random sizes (one slot each,
a few large ones, one host holding everything) and must give every job the same start
time: hosts must not matter to jobs without span rules.

The small workloads never reach what only large machines and deep queues take: more
hosts than a word of the free-slot bitmap holds (64, :mod:`~.controllers.slots`),
free-slot changes of many hosts at once (the bulk path, from ``slots._BULK`` hosts on)
and a queue read by blocks (more than :data:`~.controllers.pending_queue.BLOCK` jobs
behind the head). A second property test runs 65 to 300 hosts and 100 to 200 jobs
under a load the machine cannot keep up with, and counts those paths
(:func:`paths_taken`) to show it reaches them.
"""

from __future__ import annotations

import random
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.conftest import make_pm
from tests.easy_reference import RefJob, textbook_easy
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.pending_queue import PendingQueue
from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.controllers.slots import FreeSlots
from xce_resize_plugin.core.models import Task


class Starts(Observer):
    """Every job's start time, as the controller reports it."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        self.starts[job_id] = time


def production_starts(hosts: list[int], jobs: list[RefJob]) -> dict[str, float]:
    """The embedded controller's start times for ``jobs`` on hosts of these sizes."""
    with tempfile.TemporaryDirectory() as tmp:
        ctl = EmbeddedController(
            make_pm(),
            tmp,
            [(f"h{i:03d}", n) for i, n in enumerate(hosts)],
            store="none",
            strict=True,
        )
        try:
            seen = Starts()
            ctl.add_observer(seen)
            for job in jobs:
                ctl.submit(
                    "u",
                    job.size,
                    runtime=job.runtime,
                    estimate=job.estimate,
                    job_id=job.id,
                    submit_time=job.submit,
                )
            ctl.run()
            assert ctl.check_invariants() == []
            return seen.starts
        finally:
            ctl.stop()


def test_a_one_slot_host_free_now_is_usable_when_the_head_has_extra_slots() -> None:
    # Five one-slot hosts. At t=10 only h000 is free; the head (3 tasks) will start at
    # 100 with 5 slots free, so 2 are extra: a long 1-task job may use h000 now. Pinning
    # the head to the first free hosts in host order (h000..h002) refused it.
    jobs = [
        RefJob("1", 0.0, 1, 10.0, 10.0),
        RefJob("2", 0.0, 4, 100.0, 100.0),
        RefJob("3", 0.0, 3, 10.0, 10.0),
        RefJob("4", 0.0, 1, 500.0, 500.0),
    ]
    expected = {"1": 0.0, "2": 0.0, "3": 100.0, "4": 10.0}
    assert textbook_easy(5, jobs) == expected
    assert production_starts([1] * 5, jobs) == expected
    assert production_starts([5], jobs) == expected


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[int], list[RefJob]]:
    layout = draw(st.sampled_from(["one-slot", "mixed", "single"]))
    if layout == "one-slot":
        hosts = [1] * draw(st.integers(1, 12))
    elif layout == "mixed":
        hosts = draw(st.lists(st.integers(1, 6), min_size=1, max_size=6))
    else:
        hosts = [draw(st.integers(1, 12))]
    capacity = sum(hosts)
    jobs = []
    for i in range(draw(st.integers(1, 25))):
        runtime = float(draw(st.integers(1, 40)))
        # Estimates above and below the run time: jobs past their estimate end "now".
        estimate = float(draw(st.integers(1, 60)))
        submit = float(draw(st.integers(0, 40)))
        size = draw(st.integers(1, capacity))
        jobs.append(RefJob(str(101 + i), submit, size, runtime, estimate))
    return hosts, jobs


@settings(max_examples=300, deadline=None)
@given(workloads())
def test_production_scheduler_gives_the_textbook_start_times(
    data: tuple[list[int], list[RefJob]],
) -> None:
    hosts, jobs = data
    assert production_starts(hosts, jobs) == textbook_easy(sum(hosts), jobs)


# -- large machines, deep queues --------------------------------------------------------


@contextmanager
def paths_taken() -> Iterator[Counter[str]]:
    """While open, counts what the controllers do on the paths of large machines and
    deep queues:

    - ``deep passes``: passes that read the queue behind the head by blocks (more than
      ``BLOCK`` jobs behind it: :meth:`.PendingQueue.behind`);
    - ``deep reads``: the jobs those passes were given to test;
    - ``blocks skipped``: blocks they passed over on the scheduler's test (no job of
      the block ends by the shadow time or fits in the extra slots);
    - ``bulk changes``: free-slot changes of ``_BULK`` hosts or more at once
      (``FreeSlots._apply_bulk``);
    - ``whole-word stretches``: hosts with free slots read a whole word of the bitmap
      (64 hosts) or more in one step (its full-word path).
    """
    seen: Counter[str] = Counter()
    behind, apply_bulk = PendingQueue.behind, FreeSlots._apply_bulk
    stretches = FreeSlots._open_stretches

    def counted_behind(
        queue: PendingQueue[Any],
        start: int,
        free: Callable[[], int],
        skippable: Callable[[int, float], bool],
    ) -> Iterator[Any]:
        seen["deep passes"] += 1

        def counted_skippable(smallest: int, shortest: float) -> bool:
            skip = skippable(smallest, shortest)
            seen["blocks skipped"] += skip
            return skip

        for job in behind(queue, start, free, counted_skippable):
            seen["deep reads"] += 1
            yield job

    def counted_bulk(slots: FreeSlots, idx: Sequence[int], news: Sequence[int]) -> None:
        seen["bulk changes"] += 1
        apply_bulk(slots, idx, news)

    def counted_stretches(slots: FreeSlots) -> Iterator[tuple[int, int]]:
        for first, stop in stretches(slots):
            seen["whole-word stretches"] += stop - first >= 64
            yield first, stop

    with (
        patch.object(PendingQueue, "behind", counted_behind),
        patch.object(FreeSlots, "_apply_bulk", counted_bulk),
        patch.object(FreeSlots, "_open_stretches", counted_stretches),
    ):
        yield seen


def large_workload(layout: str, ints: Callable[[int, int], int]) -> tuple[list[int], list[RefJob]]:
    """Hosts and jobs for :func:`test_large_machines_give_the_textbook_start_times`;
    ``ints(a, b)`` gives an integer from a to b (a hypothesis draw, or a seeded
    ``random.Random.randint``).

    More than a word of the bitmap's hosts: ``one-slot``, 65 to 300 hosts of one slot
    (placed and freed as runs of alike hosts), or ``mixed``, 65 to 150 hosts of 1 to 4
    slots (a run of hosts with the same free slots but not the same slots or use is
    changed host by host, in bulk from ``_BULK`` hosts on: one-slot hosts never take
    that path). 100 to 200 jobs, all submitted within 300 s and running up to 1,000 s,
    one in two of up to 8 tasks (to backfill) and the others of any size up to the
    whole machine (heads that block): far more work than the machine does by the last
    arrival, so that the queue behind a blocked head grows past ``BLOCK``.
    """
    if layout == "one-slot":
        hosts = [1] * ints(65, 300)
    else:
        hosts = [ints(1, 4) for _ in range(ints(65, 150))]
    capacity = sum(hosts)
    jobs = []
    for i in range(ints(100, 200)):
        submit = float(ints(0, 300))
        runtime = float(ints(1, 1000))
        # Above and below the run time, as in workloads().
        estimate = float(ints(1, 1500))
        size = ints(1, 8) if ints(0, 1) else ints(1, capacity)
        jobs.append(RefJob(str(101 + i), submit, size, runtime, estimate))
    return hosts, jobs


@st.composite
def large_workloads(draw: st.DrawFn) -> tuple[list[int], list[RefJob]]:
    layout = draw(st.sampled_from(["one-slot", "mixed"]))
    return large_workload(layout, lambda a, b: draw(st.integers(a, b)))


def test_large_machines_give_the_textbook_start_times() -> None:
    """As the property test above, on machines of more than 64 hosts with queues more
    than ``BLOCK`` deep; the examples, together, must have read a deep queue by blocks
    (and skipped some) and changed free slots in bulk, or the test proved nothing."""
    taken: list[Counter[str]] = []

    @settings(max_examples=50, deadline=None)
    @given(large_workloads())
    def compare(data: tuple[list[int], list[RefJob]]) -> None:
        hosts, jobs = data
        with paths_taken() as seen:
            starts = production_starts(hosts, jobs)
        assert starts == textbook_easy(sum(hosts), jobs)
        event("deep queue read by blocks" if seen["deep reads"] else "no deep queue read")
        taken.append(seen)

    compare()
    assert any(seen["deep reads"] and seen["blocks skipped"] for seen in taken), taken
    assert any(seen["bulk changes"] for seen in taken), taken


@pytest.mark.parametrize(("layout", "seed"), [("one-slot", 1), ("mixed", 2)])
def test_a_seeded_large_workload_takes_the_deep_paths(layout: str, seed: int) -> None:
    """One workload of each layout, fixed: the same start times as the reference, and
    every path the property test is there for taken (bulk changes: mixed hosts only)."""
    hosts, jobs = large_workload(layout, random.Random(seed).randint)
    with paths_taken() as seen:
        starts = production_starts(hosts, jobs)
    assert starts == textbook_easy(sum(hosts), jobs)
    assert seen["deep passes"] and seen["deep reads"] and seen["blocks skipped"], seen
    assert seen["whole-word stretches"], seen
    assert bool(seen["bulk changes"]) == (layout == "mixed"), seen
