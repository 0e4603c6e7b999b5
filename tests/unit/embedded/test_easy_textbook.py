"""The host's scheduler is textbook EASY on rigid jobs, whatever the hosts look like.

The reference (:mod:`tests.easy_reference`) counts processors and never places a job;
the embedded controller runs the same workload on hosts of random sizes (one slot each,
a few large ones, one host holding everything) and must give every job the same start
time: hosts must not matter to jobs without span rules.
"""

from __future__ import annotations

import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import make_pm
from tests.easy_reference import RefJob, textbook_easy
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.models import Task


class Starts(Observer):
    """Every job's start time, as the controller reports it."""

    def __init__(self) -> None:
        self.starts: dict[str, float] = {}

    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
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
