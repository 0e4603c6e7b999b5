"""Property, with the real plugin: random workloads of rigid and resizable jobs, grows,
releases and time steps, with ``reclaim`` off and on. The blocked queue head is never
delayed by a grow (it starts no later than the shadow time it first got), and a
reclaim never takes task 0 nor leaves a job below its ``min_tasks``."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.sim import EmbeddedController, SubmissionRejected
from xce_resize_plugin.core.models import GrowRequest, JobState, ReleaseRequest, Task
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.manager import get_plugin_manager

HOSTS = {"h1": 4, "h2": 3, "h3": 2}

submit = st.tuples(
    st.just("submit"),
    st.integers(1, 6),  # min
    st.integers(0, 6),  # extra for max
    st.one_of(st.none(), st.integers(1, 3)),  # ptile
    st.integers(1, 80),  # runtime (the scheduler plans with it: estimates are exact)
    st.sampled_from([True, True, False]),  # resizable
)
advance = st.tuples(st.just("advance"), st.integers(0, 15))
grow = st.tuples(st.just("grow"), st.integers(0, 50), st.integers(1, 4))
release = st.tuples(st.just("release"), st.integers(0, 50), st.integers(1, 3))
ops = st.lists(
    st.one_of(submit, advance, grow, release, submit, grow, grow), min_size=10, max_size=50
)


class Watch(Observer):
    """The first shadow time each head got, and every committed allocation's checks."""

    def __init__(self, minimum: dict[str, int]) -> None:
        self.minimum = minimum
        self.first_shadow: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.problems: list[str] = []

    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
        self.started[job_id] = time

    def allocation_committed(
        self, job_id: str, time: float, tasks: tuple[Task, ...], version: int
    ) -> None:
        ids = {t.id for t in tasks}
        if 0 not in ids:
            self.problems.append(f"t={time}: job {job_id} lost task 0")
        if len(tasks) < self.minimum[job_id]:
            self.problems.append(f"t={time}: job {job_id} below its min_tasks")

    def settled(self, controller: Any) -> None:
        res = controller.reservation
        if res is not None:
            self.first_shadow.setdefault(res.job_id, res.shadow)


def _act(ctl: EmbeddedController, op: Any, jobs: dict[str, str]) -> None:
    running = [j for j in ctl.jobs() if j.state is JobState.RUN and j.id in jobs]
    if not running:
        return
    job = running[op[1] % len(running)]
    owner = Principal(jobs[job.id])
    request: Any = (
        GrowRequest(1, op[2], cancel_pending=True)
        if op[0] == "grow"
        else ReleaseRequest(count=op[2], cancel_pending=True)
    )
    with contextlib.suppress(ResizeError):  # in flight, too small, not resizable: fine
        ctl.request_resize(owner, job.id, request)


@settings(max_examples=100, deadline=None)
@given(ops=ops, reclaim=st.sampled_from(["off", "shrink"]))
def test_the_head_is_never_delayed_and_reclaim_keeps_min_and_task_0(
    ops: list[Any], reclaim: str
) -> None:
    config = {"journal_sync": False, "reclaim": reclaim}
    minimum: dict[str, int] = {}
    watch = Watch(minimum)
    jobs: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ctl = EmbeddedController(
            get_plugin_manager(config, entry_points=False),
            tmp,
            HOSTS,
            config=config,
            store="memory",
            strict=True,
            protect_reservation=True,
        )
        ctl.add_observer(watch)
        try:
            for n, op in enumerate(ops):
                if op[0] == "submit":
                    _, lo, extra, ptile, runtime, resizable = op
                    user = f"u{n % 3}"
                    with contextlib.suppress(SubmissionRejected):  # could never start
                        job_id = ctl.submit(
                            user,
                            (lo, lo + extra),
                            ptile=ptile,
                            runtime=runtime,
                            resizable=resizable,
                        )
                        minimum[job_id] = lo
                        jobs[job_id] = user
                elif op[0] == "advance":
                    ctl.advance(op[1])
                else:
                    _act(ctl, op, jobs)
            ctl.run()
            assert ctl.check_invariants() == []
        finally:
            ctl.stop()
    assert watch.problems == []
    for job_id, shadow in watch.first_shadow.items():
        assert watch.started[job_id] <= shadow, f"head {job_id} started after its shadow time"
