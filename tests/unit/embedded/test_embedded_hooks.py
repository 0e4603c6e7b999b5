"""The host side of the contract: which hooks are called, when, and in which order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.conftest import CtlFactory, Recorder, ToyResizer, make_pm
from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import (
    ContractViolation,
    EmbeddedController,
    InvariantViolation,
    SettleLoopError,
    SubmissionRejected,
    TaskState,
)
from xce_resize_plugin.core.models import JobInfo, JobState, Task
from xce_resize_plugin.host import ClusterView, Controller, TaskEvent


def test_satisfies_the_controller_protocol(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(config={"notify_timeout": 30})
    assert isinstance(ctl, Controller)
    assert ctl.config["notify_timeout"] == 30
    assert ctl.now() == 0.0
    assert ctl.get_job("nope") is None


def test_no_plugin_registered(make_ctl: CtlFactory) -> None:
    ctl = make_ctl()
    job_id = ctl.submit("u", 2, runtime=5)
    ctl.run()
    assert ctl.job(job_id).state is JobState.DONE
    assert ctl.check_invariants() == []


def test_call_order_per_phase(make_ctl: CtlFactory, recorder: Recorder) -> None:
    ctl = make_ctl(recorder)
    assert recorder.calls == [("start", 0.0)]
    job_id = ctl.submit("u", 2, runtime=5)
    assert recorder.calls[-1] == ("validate", job_id, "PEND")
    recorder.calls.clear()
    ctl.settle()
    # The job started in the host's pass, before the plugin's cycle saw the free slots;
    # that start was a change, so a second cycle runs and changes nothing.
    cycle = [("sched", 0.0, {"h1": 2, "h2": 4, "h3": 4}), ("dispatch", 0.0)]
    assert recorder.calls == cycle + cycle
    recorder.calls.clear()
    ctl.run()
    # run() settles the current instant first, then jumps to the job's end.
    assert recorder.names() == ["sched", "dispatch", "end", "sched", "dispatch"]
    assert recorder.calls[2] == ("end", job_id, "DONE", 5.0)
    assert recorder.nested == []


def test_validate_rejection_changes_nothing(make_ctl: CtlFactory) -> None:
    class Rejecter:
        @hookimpl
        def xce_job_validate(self, controller: Controller, job: JobInfo) -> None:
            if job.ptile == 3:
                raise ValueError("no ptile 3 here")

    ctl = make_ctl(Rejecter())
    with pytest.raises(ValueError, match="ptile 3"):
        ctl.submit("u", 2, ptile=3)
    assert ctl.jobs() == []
    changes = ctl.changes
    with pytest.raises(SubmissionRejected):
        ctl.submit("u", "4,2")  # the host's own check, after the plugin's
    assert ctl.changes == changes
    # A scheduled arrival that is rejected is recorded, not raised from run().
    ctl.submit("u", 1, ptile=3, submit_time=10)
    ctl.run()
    assert [(t, reason) for t, _, reason in ctl.rejections] == [
        (10.0, "ValueError: no ptile 3 here")
    ]


def test_job_end_after_committed_slots_are_freed(make_ctl: CtlFactory, recorder: Recorder) -> None:
    ctl = make_ctl(recorder)
    a = ctl.submit("u", 3, runtime=5)
    b = ctl.submit("u", 2, runtime=100)
    ctl.run(until=5)
    hosts, held = recorder.end_snapshots[a]
    assert held == {}
    assert sum(h["used"] for h in hosts.values()) == 2  # only b's slots are left
    assert ctl.job(b).state is JobState.RUN
    ctl.kill(b)
    assert recorder.calls[-1] == ("end", b, "EXIT", 5.0)
    assert ctl.job(b).task_states == {0: TaskState.EXITED, 1: TaskState.EXITED}


def test_grow_gets_started_events_after_the_hook_returns(make_ctl: CtlFactory) -> None:
    toy = ToyResizer()
    recorder = Recorder()
    ctl = make_ctl(toy, recorder)
    job_id = ctl.submit("u", "2,8", runtime=50, resizable=True, alloc={"h1": 2})
    ctl.settle()
    toy.grow(job_id, 3)
    ctl.settle()
    assert not toy.reentered and recorder.nested == []
    started = [(e.task_id, e.kind) for e in toy.events]
    assert started == [(2, "started"), (3, "started"), (4, "started")]
    job = ctl.job(job_id)
    assert [(t.id, t.host) for t in job.tasks] == [
        (0, "h1"),
        (1, "h1"),
        (2, "h1"),
        (3, "h1"),
        (4, "h2"),
    ]
    assert job.version == 1 and [v.version for v in job.versions] == [0, 1]
    assert ctl.hosts_view()["h2"]["used"] == 1
    # sched -> dispatch (launch) -> events, in this order, at the same instant.
    names = recorder.names("validate", "start")
    first_task = names.index("task")
    assert names[first_task - 1] == "dispatch"
    ctl.run()
    assert ctl.job(job_id).state is JobState.DONE
    assert ctl.hosts_view()["h2"]["used"] == 0
    assert ctl.check_invariants() == []


def test_release_stops_then_frees(make_ctl: CtlFactory) -> None:
    toy = ToyResizer(grace=2.0)
    ctl = make_ctl(toy)
    job_id = ctl.submit("u", "1,6", runtime=100)
    ctl.settle()
    ctl.faults.stop_delay = 5.0  # longer than the grace: killed at the grace period
    toy.release(job_id, (4, 5))
    ctl.settle()
    job = ctl.job(job_id)
    assert job.task_states[4] is TaskState.STOPPING
    assert len(job.held) == 6
    ctl.advance(2)
    job = ctl.job(job_id)
    assert [t.id for t in job.tasks] == [0, 1, 2, 3]
    assert len(job.held) == 4
    exits = [(e.task_id, e.status, e.reason) for e in toy.events if e.kind == "exited"]
    assert exits == [(4, 137, "SIGKILL"), (5, 137, "SIGKILL")]
    assert ctl.check_invariants() == []


def test_injected_start_failure(make_ctl: CtlFactory) -> None:
    toy = ToyResizer()
    ctl = make_ctl(toy)
    job_id = ctl.submit("u", "2,5", runtime=100, alloc={"h1": 2})
    ctl.settle()
    ctl.faults.fail_starts.add((job_id, 3))
    ctl.faults.fail_start_if = lambda job, task: "no GPU" if task.id == 4 else False
    toy.grow(job_id, 3)
    ctl.settle()
    kinds = {e.task_id: (e.kind, e.reason) for e in toy.events}
    assert kinds == {
        2: ("started", ""),
        3: ("start_failed", "injected start failure"),
        4: ("start_failed", "no GPU"),
    }
    assert [t.id for t in ctl.job(job_id).tasks] == [0, 1, 2]
    assert ctl.check_invariants() == []


def test_inject_task_exit(make_ctl: CtlFactory) -> None:
    toy = ToyResizer()
    ctl = make_ctl(toy)
    job_id = ctl.submit("u", 2, runtime=100)
    ctl.settle()
    ctl.inject_task_exit(job_id, 1, status=9, reason="segfault")
    ctl.settle()
    assert [(e.task_id, e.kind, e.status) for e in toy.events] == [(1, "exited", 9)]
    assert ctl.job(job_id).task_states[1] is TaskState.EXITED


class Relauncher:
    """Launches a reserved task, then launches and stops it again (as after a
    failover) to see the re-reports."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.step = 0
        self.events: list[tuple[int, str]] = []

    @hookimpl
    def xce_dispatch_cycle(self, controller: Controller) -> None:
        task = Task(2, "h1")
        if self.step == 0:
            controller.reserve_slots(self.job_id, [task])
            controller.reserve_slots(self.job_id, [task])  # idempotent
            controller.launch_tasks(self.job_id, [task], {})
        elif self.step == 1:
            controller.launch_tasks(self.job_id, [task], {})  # running: re-reports
        elif self.step == 2:
            controller.stop_tasks(self.job_id, [2], 0.0)
        elif self.step == 3:
            controller.launch_tasks(self.job_id, [task], {})  # exited: re-reports
            controller.stop_tasks(self.job_id, [2, 99], 0.0)  # gone / unknown
            controller.free_slots(self.job_id, [2, 2, 42])
        self.step += 1

    @hookimpl
    def xce_task_events(self, controller: Controller, events: Sequence[TaskEvent]) -> None:
        # The embedded controller delivers task events in batches.
        for event in events:
            self.xce_task_event(controller, event)

    def xce_task_event(self, controller: Controller, event: TaskEvent) -> None:
        self.events.append((event.task_id, event.kind))


def test_idempotent_launch_and_stop_re_report(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(autostart=False)
    job_id = ctl.submit("u", 2, runtime=100)
    ctl.settle()
    plugin = Relauncher(job_id)
    ctl.plugin_manager.register(plugin)
    for _ in range(4):
        ctl.settle()
    assert plugin.events == [
        (2, "started"),
        (2, "started"),
        (2, "exited"),
        (2, "exited"),
        (2, "exited"),
        (99, "exited"),
    ]
    assert ctl.job(job_id).held == (Task(0, "h1"), Task(1, "h1"))


def test_launch_of_unreserved_task_is_loud(make_ctl: CtlFactory) -> None:
    class Sloppy:
        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            controller.launch_tasks("101", [Task(5, "h2")], {})

    ctl = make_ctl(Sloppy(), autostart=False)
    ctl.submit("u", 1, runtime=10)
    with pytest.raises(ContractViolation, match="not reserved"):
        ctl.settle()


def test_over_reservation_is_loud(make_ctl: CtlFactory) -> None:
    class Greedy:
        @hookimpl
        def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
            controller.reserve_slots("101", [Task(i, "h3") for i in range(1, 6)])

    ctl = make_ctl(Greedy(), autostart=False)
    ctl.submit("u", 1, runtime=10)
    with pytest.raises(ContractViolation, match="exceed"):
        ctl.settle()
    assert ctl.hosts_view()["h3"]["used"] == 0


class Leaky:
    """Reserves a slot for job 101 and never frees it."""

    @hookimpl
    def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
        job = controller.get_job("101")
        if job is not None and job.state is JobState.RUN:
            controller.reserve_slots("101", [Task(9, "h2")])


def test_slots_after_job_end_strict_raises(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(Leaky())
    ctl.submit("u", 1, runtime=10)
    with pytest.raises(InvariantViolation, match="still held 1 slot"):
        ctl.run()


def test_slots_after_job_end_recorded_and_reclaimed(make_ctl: CtlFactory) -> None:
    ctl = make_ctl(Leaky(), strict=False)
    ctl.submit("u", 1, runtime=10)
    ctl.run()
    problems = ctl.check_invariants()
    assert problems == ["job 101 still held 1 slot(s) after xce_job_end: 9@h2"]
    assert ctl.hosts_view()["h2"]["used"] == 0


def test_no_reentry_from_a_hook(make_ctl: CtlFactory) -> None:
    class Reenter:
        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            ctl: Any = controller
            ctl.settle()

    ctl = make_ctl(Reenter(), autostart=False)
    with pytest.raises(ContractViolation, match="inside a hook"):
        ctl.settle()


def test_settle_loop_cap(make_ctl: CtlFactory) -> None:
    class Flapper:
        @hookimpl
        def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
            controller.reserve_slots("101", [Task(1, "h2")])

        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            controller.free_slots("101", [1])

    ctl = make_ctl(Flapper(), settle_cap=50)
    ctl.submit("u", 1, runtime=10)
    with pytest.raises(SettleLoopError, match="50 cycles"):
        ctl.settle()


def test_protected_cluster_view(make_ctl: CtlFactory, recorder: Recorder) -> None:
    ctl = make_ctl(recorder, hosts={"h1": 4, "h2": 4}, protect_reservation=True)
    ctl.submit("u", 6, runtime=100)
    ctl.submit("u", 7, runtime=10)  # blocked head: needs 7 of 8 at t=100
    ctl.settle()
    sched = [c for c in recorder.calls if c[0] == "sched"][-1]
    assert sched[2] == {"h1": 0, "h2": 1}  # 2 free, only 1 not needed by the head


def test_resize_forwarding_without_plugin(make_ctl: CtlFactory) -> None:
    from xce_resize_plugin.core.models import GrowRequest
    from xce_resize_plugin.host import Principal

    ctl = make_ctl()
    assert ctl.request_resize(Principal("u"), "101", GrowRequest(1, 1)) is None
    assert ctl.resize_status("101") is None
    assert ctl.acct_usage("101") is None


def test_stop_hook_and_close(make_ctl: CtlFactory, recorder: Recorder) -> None:
    ctl = make_ctl(recorder)
    ctl.stop()
    assert recorder.calls[-1] == ("stop", 0.0)
    with pytest.raises(Exception, match="closed"):
        ctl.submit("u", 1)


def test_from_manager_without_plugins(tmp_path: Any) -> None:
    ctl = EmbeddedController(make_pm(), tmp_path, {"a": 1}, store="memory")
    ctl.submit("u", 1, runtime=1)
    ctl.run()
    assert ctl.now() == 1.0
