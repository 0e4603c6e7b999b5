"""A host failure during a change in flight, settled per state as docs/failover.md
says ("Host failure"); the controller's host API; a restart after an involuntary
shrink (real LMDB files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import Harness
from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.runners import (
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    SimTaskRunner,
)
from xce_resize_plugin.controllers.violations import HostStateError, UnknownHost
from xce_resize_plugin.core.audit import replay_problems
from xce_resize_plugin.core.models import (
    GrowRequest,
    JobState,
    LossOutcome,
    Phase,
    ReleaseRequest,
    Task,
)

HOSTS = [("hA", 4), ("hB", 4), ("hC", 4)]
ROOT = Path(__file__).resolve().parents[2]


class HeldNotifications:
    """A notification runner whose answers the test gives."""

    def __init__(self) -> None:
        self.waiting: dict[int, NotificationDone] = {}
        self.requests: list[NotificationRequest] = []

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        self.requests.append(request)
        self.waiting[request.attempt] = done

    def answer(self, attempt: int, status: int) -> None:
        self.waiting.pop(attempt)(NotificationResult(status, f"exit {status}"))


class HeldStarts(SimTaskRunner):
    """Task starts are reported when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.starting: list[tuple[str, Task]] = []

    def start(self, job_id: str, task: Task, env: Any) -> None:
        self.starting.append((job_id, task))

    def report(self) -> None:
        starting, self.starting = self.starting, []
        for job_id, task in starting:
            self.reporter.task_started(job_id, task.id)


def make(tmp_path: Path, **kw: Any) -> Harness:
    return Harness(tmp_path, hosts=HOSTS, **kw)


def submit(h: Harness, tasks: str = "2,12", **kw: Any) -> str:
    kw.setdefault("alloc", {"hA": 2, "hB": 2})
    job = h.ctl.submit("alice", tasks, resizable=True, runtime=1000, **kw)
    h.ctl.settle()
    return job


def hosts_of(h: Harness, job_id: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for task in h.ctl.job(job_id).tasks:
        out[task.host] = out.get(task.host, 0) + 1
    return out


def records(h: Harness, job_id: str) -> list[tuple[str, str | None]]:
    usage = h.ctl.acct_usage(job_id)
    assert usage is not None
    return [(r.kind.value, r.reason) for r in usage.records]


def test_grow_notifying_goes_back_to_pending_and_is_placed_again(tmp_path: Path) -> None:
    notes = HeldNotifications()
    h = make(tmp_path, notification_runner=notes)
    job = submit(h, notify_cmd="true")
    h.request("alice", job, GrowRequest(2, 2))
    assert h.ctl.resize_status(job).phase is Phase.GROW_NOTIFYING  # type: ignore[union-attr]
    failure = h.ctl.host_down("hB")
    assert failure.outcomes == {job: LossOutcome.SHRUNK}
    h.ctl.settle()
    status = h.ctl.resize_status(job)
    assert status is not None and status.phase is Phase.GROW_NOTIFYING
    # Attempt 1 was the grow's, 2 the shrink's (for information), 3 the grow's again.
    assert sorted(notes.waiting) == [1, 2, 3]
    assert all(t.host != "hB" for t in status.in_flight_tasks)
    notes.answer(1, 0)  # the first grow's late answer changes nothing
    h.ctl.settle()
    assert h.ctl.resize_status(job).phase is Phase.GROW_NOTIFYING  # type: ignore[union-attr]
    notes.answer(3, 0)
    h.ctl.settle()
    assert records(h, job) == [("shrink", "host_failure"), ("grow", None)]
    assert len(h.ctl.job(job).tasks) == 4 and "hB" not in hosts_of(h, job)
    assert h.ctl.check_invariants() == []


def test_grow_starting_loses_its_tasks_there_and_commits_the_rest(tmp_path: Path) -> None:
    runner = HeldStarts()
    h = make(tmp_path, task_runner=runner)
    job = submit(h)
    h.request("alice", job, GrowRequest(4, 4))
    assert h.ctl.resize_status(job).phase is Phase.GROW_STARTING  # type: ignore[union-attr]
    placed = {t.host for _, t in runner.starting}
    assert placed == {"hA", "hB"}  # the job's own hosts first
    h.ctl.host_down("hB")
    assert h.ctl.resize_status(job).phase is Phase.GROW_STARTING  # type: ignore[union-attr]
    runner.report()
    h.ctl.settle()
    assert records(h, job) == [("shrink", "host_failure"), ("grow", None)]
    assert hosts_of(h, job) == {"hA": 4}
    assert h.ctl.hosts_view()["hB"]["used"] == 0
    assert h.ctl.check_invariants() == []


def test_shrink_notifying_is_abandoned(tmp_path: Path) -> None:
    notes = HeldNotifications()
    h = make(tmp_path, notification_runner=notes)
    job = submit(h, notify_cmd="true", alloc={"hA": 2, "hB": 2, "hC": 2})
    h.request("alice", job, ReleaseRequest(hosts={"hC": None}))
    h.ctl.host_down("hB")
    h.ctl.settle()
    status = h.ctl.resize_status(job)
    assert status is not None and status.phase is Phase.IDLE
    notes.answer(1, 0)  # the release's late answer changes nothing
    h.ctl.settle()
    assert hosts_of(h, job) == {"hA": 2, "hC": 2}
    assert records(h, job) == [("shrink", "host_failure")]
    assert h.ctl.check_invariants() == []


@pytest.mark.parametrize(
    ("min_tasks", "release", "outcome", "after"),
    [
        (2, "hC", LossOutcome.SHRUNK, {"hA": 2}),  # the release goes on stopping
        (2, "hB", LossOutcome.SHRUNK, {"hA": 2, "hC": 2}),  # the release was all there
        (3, "hC", LossOutcome.EXIT, {"hA": 2, "hB": 2, "hC": 2}),  # 2 left < min 3
    ],
)
def test_shrink_stopping_goes_on_without_the_lost_tasks(
    tmp_path: Path, min_tasks: int, release: str, outcome: LossOutcome, after: dict[str, int]
) -> None:
    h = make(tmp_path)
    h.ctl.faults.stop_delay = 5
    job = submit(h, tasks=f"{min_tasks},12", alloc={"hA": 2, "hB": 2, "hC": 2})
    h.request("alice", job, ReleaseRequest(hosts={release: None}))
    assert h.ctl.resize_status(job).phase is Phase.SHRINK_STOPPING  # type: ignore[union-attr]
    assert h.ctl.host_down("hB").outcomes == {job: outcome}
    h.ctl.advance(10)
    view = h.ctl.job(job)
    if outcome is LossOutcome.EXIT:
        assert view.state.value == "EXIT" and view.exit_reason == "host failure"
    else:
        assert hosts_of(h, job) == after
        assert records(h, job)[0] == ("shrink", "host_failure")
    assert h.ctl.check_invariants() == []


def test_host_api_errors_change_nothing(tmp_path: Path) -> None:
    h = make(tmp_path)
    submit(h)
    before = h.snapshot()
    with pytest.raises(UnknownHost, match="hZ"):
        h.ctl.host_down("hZ")
    with pytest.raises(HostStateError, match="not unavail"):
        h.ctl.host_up("hB")
    with pytest.raises(HostStateError, match="not closed"):
        h.ctl.host_open("hB")
    h.ctl.host_close("hC")
    with pytest.raises(HostStateError, match="already closed"):
        h.ctl.host_close("hC")
    h.ctl.host_open("hC")
    assert h.snapshot() == before
    assert [v.state for v in h.ctl.host_views()] == [HostState.OK] * 3


def test_a_closed_host_that_fails_comes_back_closed(tmp_path: Path) -> None:
    h = make(tmp_path)
    job = submit(h)
    h.ctl.host_close("hB")
    h.ctl.host_down("hB")
    assert h.ctl.host_view("hB").state is HostState.UNAVAIL
    h.ctl.host_up("hB")
    view = h.ctl.host_view("hB")
    assert view.state is HostState.CLOSED and view.used == 0 and view.jobs == {}
    assert h.ctl.host_view("hA").jobs == {job: 2}


def test_a_restart_after_an_involuntary_shrink_finds_the_same_state(tmp_path: Path) -> None:
    h = make(tmp_path)
    job = submit(h, alloc={"hA": 2, "hB": 2, "hC": 2})
    h.ctl.host_down("hB")
    h.ctl.settle()
    seen = (h.ctl.job(job), h.ctl.resize_status(job), h.ctl.acct_usage(job), h.ctl.host_views())
    h.crash_and_restart()
    h.ctl.settle()
    again = (h.ctl.job(job), h.ctl.resize_status(job), h.ctl.acct_usage(job), h.ctl.host_views())
    assert again == seen
    assert again[3][1].state is HostState.UNAVAIL
    assert h.ctl.check_invariants() == []
    h.ctl.close()
    assert replay_problems(tmp_path / "resize") == []


def test_a_requeued_job_resizes_again_with_its_history(tmp_path: Path) -> None:
    policy = str(ROOT / "hooks" / "requeue_on_host_failure.py")
    h = make(tmp_path, config={"policy_files": [policy]})
    job = submit(h, alloc={"hB": 2, "hA": 2})
    h.request("alice", job, GrowRequest(2, 2))
    assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.REQUEUE}
    h.ctl.settle()
    assert h.ctl.job(job).state.value == "RUN" and hosts_of(h, job) == {"hA": 4, "hC": 4}
    # Its new run loses a host first, then releases a task: the versions go on.
    assert h.ctl.host_down("hC").outcomes == {job: LossOutcome.SHRUNK}
    h.request("alice", job, ReleaseRequest(count=1))
    usage = h.ctl.acct_usage(job)
    assert usage is not None
    assert [(r.kind.value, r.reason, r.version) for r in usage.records] == [
        ("grow", None, 1),
        ("shrink", "host_failure", 2),
        ("shrink", None, 3),
    ]
    assert h.ctl.job(job).version == 3
    assert h.ctl.check_invariants() == []
    h.ctl.close()
    assert replay_problems(tmp_path / "resize") == []


def test_hook_xce_host_failed_reports_lost_tasks_and_answers_per_job(tmp_path: Path) -> None:
    h = make(tmp_path)
    elastic = submit(h, alloc={"hA": 2, "hB": 2})
    rigid = h.ctl.submit("bob", 2, runtime=1000, alloc={"hB": 1, "hC": 1})
    h.ctl.settle()
    failure = h.ctl.host_down("hB")
    assert failure.lost == {elastic: (2, 3), rigid: (0,)}
    assert failure.outcomes == {elastic: LossOutcome.SHRUNK, rigid: LossOutcome.EXIT}
    assert h.ctl.job(rigid).exit_reason == "host failure"
    assert h.ctl.check_invariants() == []


def test_hook_xce_host_failed_without_a_plugin_ends_every_job(tmp_path: Path) -> None:
    """A host without the resize plugin (no answer) ends the jobs that lost tasks."""
    import pluggy

    from xce_resize_plugin import hookspecs

    pm = pluggy.PluginManager("xce")
    pm.add_hookspecs(hookspecs)
    h = make(tmp_path, pm=pm)
    job = h.ctl.submit("alice", "2,8", resizable=True, runtime=1000, alloc={"hA": 2, "hB": 2})
    h.ctl.settle()
    assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.EXIT}
    assert h.ctl.hosts_view()["hA"]["used"] == 0


class _CrashInHostFailed(Exception):
    """The controller died while the plugin was told of a host failure."""


def test_a_crash_before_the_plugin_settled_a_host_failure_is_settled_after_the_restart(
    tmp_path: Path,
) -> None:
    """The host freed the failed host's slots, then died before the plugin wrote its
    loss: the restarted plugin asserts again every slot it knows the job holds, those
    on the failed host included. The controller starts, the job loses those tasks as an
    involuntary shrink, and the state is the one without the crash."""
    from xce_resize_plugin import hookimpl

    def run(crash: bool, where: Path) -> tuple[Any, ...]:
        h = make(where)
        job = submit(h, alloc={"hA": 2, "hB": 2})
        h.request("alice", job, GrowRequest(min_add=2, max_add=2))  # tracked from now
        assert hosts_of(h, job) == {"hA": 4, "hB": 2}

        class Crash:
            @hookimpl(tryfirst=True)
            def xce_host_failed(self, **kw: Any) -> None:
                raise _CrashInHostFailed

        if crash:
            h.ctl.plugin_manager.register(Crash())
            with pytest.raises(_CrashInHostFailed):
                h.ctl.host_down("hB")
            h.crash_and_restart()
        else:
            h.ctl.host_down("hB")
        h.ctl.settle()
        assert h.ctl.check_invariants() == []
        seen = (
            h.ctl.job(job).state,
            hosts_of(h, job),
            h.ctl.job(job).held,
            records(h, job),
            h.ctl.host_view("hB"),
        )
        h.ctl.close()
        assert replay_problems(where / "resize") == []
        return seen

    crashed = run(True, tmp_path / "crashed")
    assert crashed[1] == {"hA": 4} and crashed[4].used == 0
    assert crashed == run(False, tmp_path / "not")


def _requeued_and_waiting(tmp_path: Path) -> tuple[Harness, str]:
    """A job grown once, then requeued by a host failure, waiting in the queue (the
    other hosts are closed: nothing may start it)."""
    policy = str(ROOT / "hooks" / "requeue_on_host_failure.py")
    h = make(tmp_path, config={"policy_files": [policy]})
    job = submit(h, alloc={"hB": 2, "hA": 2})
    h.request("alice", job, GrowRequest(2, 2))
    h.ctl.advance(10)  # a run of some length: its next one starts later than it did
    h.ctl.host_close("hA")
    h.ctl.host_close("hC")
    assert h.ctl.host_down("hB").outcomes == {job: LossOutcome.REQUEUE}
    h.ctl.settle()
    return h, job


@pytest.mark.parametrize("resized_again", [True, False])
def test_compaction_keeps_a_requeued_job_waiting_to_start_again(
    tmp_path: Path, resized_again: bool
) -> None:
    """A job requeued after a host failure has its resize state ended while it waits
    (journal ``done``), but its history goes on at its next start: ``journal compact``
    run meanwhile must keep its facts, or ``verify`` finds the next run's facts
    without the history its state carries. Once the job has really finished, its facts
    go like any other's."""
    from xce_resize_plugin.journal import compaction
    from xce_resize_plugin.journal.verification import verify

    h, job = _requeued_and_waiting(tmp_path)
    assert h.ctl.job(job).state.value == "PEND"
    h.ctl.close()
    journal_dir = tmp_path / "resize"
    assert compaction.compact(journal_dir, keep_days=0, now=1e9) == 0  # held: kept
    h.ctl = h._make()
    h.ctl.host_open("hA")
    h.ctl.host_open("hC")
    h.ctl.settle()
    assert h.ctl.job(job).state.value == "RUN"
    h.ctl.advance(10)
    if resized_again:
        h.request("alice", job, ReleaseRequest(count=1))
    usage = h.ctl.acct_usage(job)
    assert usage is not None
    versions = [("grow", 1), ("shrink", 2)] if resized_again else [("grow", 1)]
    assert [(r.kind.value, r.version) for r in usage.records] == versions
    # Not resized again, the new run is tracked all the same (on top of the held one):
    # its accounting counts it (before, only the earlier run's segments were shown).
    restarted = h.ctl.job(job).start_time
    assert usage.segments and usage.segments[-1].start == restarted
    h.ctl.kill(job)
    h.ctl.settle()
    h.ctl.close()
    report = verify(journal_dir)
    assert report.ok, report.problems
    assert replay_problems(journal_dir) == []
    assert compaction.compact(journal_dir, keep_days=0, now=1e9) > 0  # finished: goes
    report = verify(journal_dir)
    assert report.ok, report.problems


def test_a_requeued_job_killed_while_it_waits_is_compacted_like_any_other(
    tmp_path: Path,
) -> None:
    """Killed in the queue, the requeued job never runs again: its earlier run is no
    longer held (a ``JobEnded`` on its ended state), and compaction drops its facts."""
    from xce_resize_plugin.journal import compaction
    from xce_resize_plugin.journal.verification import verify

    h, job = _requeued_and_waiting(tmp_path)
    h.ctl.kill(job)
    h.ctl.settle()
    assert h.ctl.job(job).state.value == "EXIT"
    usage = h.ctl.acct_usage(job)
    assert usage is not None and [r.kind.value for r in usage.records] == ["grow"]
    h.ctl.close()
    journal_dir = tmp_path / "resize"
    assert replay_problems(journal_dir) == []
    assert compaction.compact(journal_dir, keep_days=0, now=1e9) > 0
    report = verify(journal_dir)
    assert report.ok, report.problems


def test_a_restart_while_a_requeued_run_is_being_stopped_does_not_track_it_again(
    tmp_path: Path,
) -> None:
    """A host that stops a requeued job's processes before it queues it (the live
    controller's way: the job stays RUN meanwhile) and restarts in between reports
    the job's start again: the run the requeue ended is not a new run, so it is not
    tracked again (it was, and the queued job stayed charged in full while it
    waited)."""
    from xce_resize_plugin.plugin import runtime_of

    policy = str(ROOT / "hooks" / "requeue_on_host_failure.py")
    hosts = [("hA", 2), ("hB", 2), ("hC", 2), ("hD", 2)]
    h = Harness(
        tmp_path, hosts=hosts, config={"policy_files": [policy]}, loss_ender=lambda *a: None
    )
    job = h.ctl.submit("alice", "2,4", runtime=10000, resizable=True, alloc={"hA": 1, "hB": 1})
    h.ctl.settle()
    h.request("alice", job, GrowRequest(1, 1, no_notify=True))
    h.ctl.advance(10)
    # The first requeue: the job.requeued flag is set from now on.
    assert h.ctl.host_down("hA").outcomes == {job: LossOutcome.REQUEUE}
    h.ctl.stop_tasks(job, [t.id for t in h.ctl.job(job).tasks if t.host != "hA"], 0.0)
    h.ctl.settle()
    assert h.ctl.requeue(job)
    h.ctl.settle()
    h.ctl.advance(10)
    # The second: a failover while the host stops the run's other processes.
    first = h.ctl.job(job).tasks[0].host
    assert h.ctl.host_down(first).outcomes == {job: LossOutcome.REQUEUE}
    h.ctl.host_up(first)
    h.ctl.advance(5)
    h.crash_and_restart()
    assert job not in runtime_of(h.ctl).states
    for name, _ in hosts:
        h.ctl.host_close(name)  # nothing may start it again
    h.ctl.stop_tasks(job, [t.id for t in h.ctl.job(job).tasks if t.host != first], 0.0)
    h.ctl.settle()
    assert h.ctl.requeue(job)
    h.ctl.settle()
    h.ctl.advance(1000)
    assert h.ctl.job(job).state is JobState.PEND
    assert job not in runtime_of(h.ctl).states
    usage = h.ctl.acct_usage(job)
    assert usage is not None and all(s.end <= 25.0 for s in usage.segments), usage.segments
    assert h.ctl.check_invariants() == []


def test_the_end_of_a_job_never_tracked_asks_the_host_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``xce_job_end`` comes for every job; only one whose run a requeue ended is looked
    up (to let its hold go). Before, every untracked job's end asked the host for the
    job (a JobInfo built per job of a simulation)."""
    from xce_resize_plugin.controllers.sim.contract import HostContract

    h = make(tmp_path)
    job = h.ctl.submit("bob", 2, runtime=100)
    h.ctl.settle()
    asked: list[str] = []
    get_job = HostContract.get_job

    def counted(self: HostContract, job_id: str) -> Any:
        asked.append(job_id)
        return get_job(self, job_id)

    monkeypatch.setattr(HostContract, "get_job", counted)
    h.ctl.run(until=200)
    assert h.ctl.job(job).state is JobState.DONE
    assert asked == []
