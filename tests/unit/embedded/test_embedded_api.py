"""The driver API: the event loop, the views, task-count parsing, persistence details."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from tests.conftest import CtlFactory, ToyResizer, make_pm
from xce_resize_plugin.controllers.jobs import JobOptions
from xce_resize_plugin.controllers.sim import (
    EmbeddedController,
    MemoryStore,
    NotificationResult,
    ScriptedNotificationRunner,
    SimClock,
    SubmissionRejected,
    UnknownJob,
    parse_tasks,
)
from xce_resize_plugin.core.models import GrowHosts, JobState


def test_parse_tasks() -> None:
    assert parse_tasks(4) == (4, 4)
    assert parse_tasks("2,8") == (2, 8)
    assert parse_tasks("3") == (3, 3)
    assert parse_tasks((1, 5)) == (1, 5)
    for bad in ("x", "1,2,3", "", True):
        with pytest.raises(SubmissionRejected):
            parse_tasks(bad)  # type: ignore[arg-type]


def test_at_callbacks_run_in_time_then_insertion_order(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    seen: list[tuple[str, float]] = []
    ctl.at(5, lambda: seen.append(("b", ctl.now())))
    ctl.at(3, lambda: seen.append(("a", ctl.now())))
    ctl.at(5, lambda: seen.append(("c", ctl.now())))
    # A callback may schedule more at the same instant and submit jobs.
    ctl.at(5, lambda: ctl.at(5, lambda: seen.append(("d", ctl.now()))))
    ctl.at(5, lambda: seen.append(("job", float(ctl.submit("u", 1, runtime=1)))))
    assert ctl.next_time == 3.0
    ctl.run()
    assert seen == [("a", 3.0), ("b", 5.0), ("c", 5.0), ("job", 101.0), ("d", 5.0)]
    assert ctl.now() == 6.0  # the job's end was the last instant
    with pytest.raises(ValueError, match="already at"):
        ctl.at(1, lambda: None)
    with pytest.raises(ValueError, match="already at"):
        ctl.run(until=2)


def test_run_until_moves_the_clock_even_when_idle(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(clock=SimClock(100.0))
    assert ctl.now() == 100.0
    ctl.run(until=250)
    assert ctl.now() == 250.0
    ctl.advance(0.5)
    assert ctl.now() == 250.5
    job_id = ctl.submit("u", 1)  # runtime None: runs until killed
    ctl.run()
    assert ctl.job(job_id).state is JobState.RUN and ctl.now() == 250.5


def test_views(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(user_slots={"carol": 3})
    a = ctl.submit("alice", 5, runtime=10, resizable=True, grow_hosts="new-only", env={"A": "1"})
    ctl.submit("bob", 12, runtime=10)
    ctl.settle()
    assert ctl.hosts_view() == {
        "h1": {"slots": 4, "used": 4},
        "h2": {"slots": 4, "used": 1},
        "h3": {"slots": 4, "used": 0},
    }
    assert ctl.users_view() == {"alice": {"slots_in_use": 5}, "carol": {"slots_in_use": 0}}
    view = ctl.job(a)
    assert view.slots == 5 and view.grow_hosts is GrowHosts.NEW_ONLY
    info = view.info()
    assert info == ctl.get_job(a)
    assert info.env == {"A": "1"} and info.resizable and info.start_time == 0.0
    data = view.to_dict()
    assert data["state"] == "RUN" and data["tasks"][0] == [0, "h1"]
    assert [j.id for j in ctl.jobs()] == ["101", "102"]
    res = ctl.reservation
    assert res is not None and res.job_id == "102" and res.shadow == 10.0
    with pytest.raises(UnknownJob, match="no job 999"):
        ctl.job("999")
    with pytest.raises(ValueError, match="not running"):
        ctl.inject_task_exit(a, 42)


def test_memory_store_restart_keeps_notification_logs_and_versions(tmp_path: Path) -> None:
    from xce_resize_plugin import hookimpl
    from xce_resize_plugin.host import Controller

    class Notify:
        done = False

        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            job = controller.get_job("101")
            if job is not None and job.state is JobState.RUN and not self.done:
                self.done = True
                controller.run_notification("101", 1, "h1", "hello", {"X": "y"}, 1.0)

    store = MemoryStore()
    toy = ToyResizer()
    runner = ScriptedNotificationRunner(lambda r: NotificationResult(0, "exit 0", "out", "", 0.01))
    ctl = EmbeddedController(
        make_pm(Notify(), toy), tmp_path, {"h1": 4}, store=store, notification_runner=runner
    )
    ctl.submit("u", "1,4", runtime=50, alloc={"h1": 1})
    toy.grow("101", 2)
    ctl.advance(1)
    before = ctl.job("101")
    logs = ctl.notifications("101")
    assert len(logs) == 1 and logs[0].stdout == "out"
    assert runner.requests[0].env == {"X": "y"}
    del ctl
    ctl2 = EmbeddedController(make_pm(), tmp_path, store=store)
    assert ctl2.notifications("101") == logs
    assert ctl2.job("101") == before
    assert [v.version for v in ctl2.job("101").versions] == [0, 1]


def test_submission_checks(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    for kwargs in (
        {"n": 0},
        {"n": "3,2"},
        {"ptile": 0},
        {"runtime": -1},
        {"estimate": float("inf")},
        {"alloc": {"nohost": 1}},
        {"alloc": {"h1": 1, "h2": 1}, "ptile": 0},
    ):
        with pytest.raises(SubmissionRejected):
            ctl.submit("u", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(SubmissionRejected, match="user"):
        ctl.submit("", 1)
    assert ctl.jobs() == [] and ctl.changes == 0


def test_observers_see_a_job_ending_before_it_ended(make_ctl: CtlFactory) -> None:
    from xce_resize_plugin.controllers.observer import FinishedJob, Observer

    seen: list[tuple[str, ...]] = []

    class Watch(Observer):
        def job_ending(self, job_id: str, time: float, state: JobState, reason: str) -> None:
            seen.append(("ending", job_id, str(time), state.value, reason))

        def job_ended(self, job: FinishedJob) -> None:
            seen.append(("ended", job.id, str(job.end_time), job.state.value, job.exit_reason))

    ctl = make_ctl()
    ctl.add_observer(Watch())
    done = ctl.submit("u", 2, runtime=10)
    waiting = ctl.submit("u", 12, runtime=10)  # queued behind the first job
    ctl.kill(waiting)
    ctl.run()
    assert seen == [
        ("ending", waiting, "0.0", "EXIT", "killed"),
        ("ended", waiting, "0.0", "EXIT", "killed"),
        ("ending", done, "10.0", "DONE", "done"),
        ("ended", done, "10.0", "DONE", "done"),
    ]


def test_submit_job_passes_on_every_option(make_ctl: CtlFactory) -> None:
    """``submit_job`` hands each field of a :class:`JobOptions` to ``submit``: a
    field the two spell differently, or one it drops, would show here."""
    ctl = make_ctl()
    options = JobOptions(
        estimate=120.0,
        ptile=2,
        resizable=True,
        autoresize=True,
        grow_hosts=GrowHosts.ANY,
        notify_cmd="true",
        alloc=(("h2", 2),),
        initial=2,
        release_exited=True,
        grace=7.5,
    )
    record = ctl.record(ctl.submit_job("u", (1, 4), options, runtime=60.0))
    assert record is not None
    names = attrs.fields_dict(JobOptions).keys() - {"initial"}
    seen = {name: getattr(record, name) for name in names}
    seen["initial"] = record.initial_tasks
    assert seen == attrs.asdict(options, recurse=False)


def test_a_job_that_could_never_start_is_refused_whatever_came_before(
    make_ctl: CtlFactory,
) -> None:
    """A submission that cannot start even on the empty cluster (too many tasks, too
    many for its ptile, above its user's limit) is refused; the empty cluster's
    capacity is kept per ptile, so earlier submissions of other sizes change nothing."""
    from xce_resize_plugin.controllers.sim import SubmissionRejected

    ctl = make_ctl(hosts={"a": 3, "b": 2}, user_slots={"bob": 2})
    for n, ptile, user, ok in [
        (5, None, "u", True),
        (6, None, "u", False),
        (2, 1, "u", True),
        (3, 1, "u", False),
        (4, 2, "u", True),
        (5, 2, "u", False),
        (2, None, "bob", True),
        (3, None, "bob", False),
        (5, None, "u", True),
    ]:
        if ok:
            ctl.submit(user, n, ptile=ptile, runtime=1)
        else:
            with pytest.raises(SubmissionRejected, match="can never start"):
                ctl.submit(user, n, ptile=ptile, runtime=1)
