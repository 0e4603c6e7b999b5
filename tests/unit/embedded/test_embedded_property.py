"""Property: random submits, kills, grows, releases and time steps never overbook a
host or a user, keep every invariant, and every job ends."""

from __future__ import annotations

import contextlib
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ToyResizer, make_pm
from xce_resize_plugin.controllers.sim import EmbeddedController, SubmissionRejected, TaskFaults
from xce_resize_plugin.core.models import JobState

HOSTS = {"h1": 4, "h2": 3, "h3": 2}

submit = st.tuples(
    st.just("submit"),
    st.sampled_from(["alice", "bob", "carol"]),
    st.integers(1, 6),  # min
    st.integers(0, 8),  # extra for max
    st.one_of(st.none(), st.integers(1, 3)),  # ptile
    st.integers(0, 80),  # runtime
    st.one_of(st.none(), st.integers(0, 60)),  # estimate
)
kill = st.tuples(st.just("kill"), st.integers(0, 50))
advance = st.tuples(st.just("advance"), st.integers(0, 15))
grow = st.tuples(st.just("grow"), st.integers(0, 50), st.integers(1, 3))
release = st.tuples(st.just("release"), st.integers(0, 50), st.integers(1, 3))
# Grows and releases only apply to running jobs that are not busy: offer them often.
ops = st.lists(
    st.one_of(submit, advance, grow, release, grow, release, submit, kill),
    min_size=10,
    max_size=60,
)


def _busy(toy: ToyResizer, job_id: str) -> bool:
    return job_id in toy.wants or job_id in toy.reserved or job_id in toy.releases


@settings(max_examples=80, deadline=None)
@given(ops=ops, stop_delay=st.sampled_from([0.0, 3.0]), grace=st.sampled_from([1.0, 10.0]))
def test_random_workload_keeps_invariants(ops: list[Any], stop_delay: float, grace: float) -> None:
    toy = ToyResizer(grace=grace)
    with tempfile.TemporaryDirectory() as tmp:
        ctl = EmbeddedController(
            make_pm(toy),
            tmp,
            HOSTS,
            user_slots={"alice": 6},
            store="memory",
            strict=True,
            faults=TaskFaults(stop_delay=stop_delay, fail_start_if=lambda j, t: t.id % 5 == 4),
        )
        ids: list[str] = []
        for op in ops:
            kind = op[0]
            if kind == "submit":
                _, user, lo, extra, ptile, runtime, estimate = op
                with contextlib.suppress(SubmissionRejected):  # could never start: fine
                    ids.append(
                        ctl.submit(
                            user, (lo, lo + extra), ptile=ptile, runtime=runtime, estimate=estimate
                        )
                    )
            elif kind == "advance":
                ctl.advance(op[1])
            elif kind == "kill" and ids:
                ctl.kill(ids[op[1] % len(ids)])
            else:
                # Pick among the jobs the operation applies to, so that it happens often.
                room = {
                    j.id: (j.max_tasks - len(j.tasks), len(j.tasks) - max(1, j.min_tasks))
                    for j in ctl.jobs()
                    if j.state is JobState.RUN and not _busy(toy, j.id)
                }
                can = [i for i, (g, r) in room.items() if (g if kind == "grow" else r) > 0]
                if can:
                    job = ctl.job(can[op[1] % len(can)])
                    g, r = room[job.id]
                    if kind == "grow":
                        toy.grow(job.id, min(op[2], g))
                    else:
                        n = min(op[2], r)
                        toy.release(job.id, tuple(t.id for t in job.tasks[-n:]))
            ctl.settle()
            assert ctl.check_invariants() == []
            for host, view in ctl.hosts_view().items():
                assert 0 <= view["used"] <= view["slots"], host
        ctl.run()
        assert ctl.check_invariants() == []
        assert all(j.state in (JobState.DONE, JobState.EXIT) for j in ctl.jobs())
        assert all(v["used"] == 0 for v in ctl.hosts_view().values())
        assert ctl.users_view() == {"alice": {"slots_in_use": 0}}
        ctl.close()
