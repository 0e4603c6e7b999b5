"""What a host that holds the embedded controller relies on (the live controller does):
the typed hook wrapper, the injected lock and hook controller, the observer events, and
the restart that leaves task processes to the holder."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.conftest import CtlFactory, ToyResizer, make_pm
from xce_resize_plugin import hookimpl, hookspecs
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.sim import (
    EmbeddedController,
    MemoryStore,
    NotificationRequest,
    NotificationResult,
    ScriptedNotificationRunner,
    TaskState,
)
from xce_resize_plugin.core.models import JobInfo, JobState, Task
from xce_resize_plugin.host import ClusterView, Controller, HostHooks, TaskEvent

HOST_HOOKS = [
    (name, fn)
    for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
    if name.startswith("xce_") and "controller" in inspect.signature(fn).parameters
]


def test_host_hooks_has_one_forwarding_method_per_host_hook() -> None:
    assert len(HOST_HOOKS) >= 13
    for name, spec in HOST_HOOKS:
        method = getattr(HostHooks, name.removeprefix("xce_"))
        params = list(inspect.signature(method).parameters)
        assert params == ["self", *inspect.signature(spec).parameters], name
    wrapped = {n for n, _ in inspect.getmembers(HostHooks, inspect.isfunction)} - {"__init__"}
    assert wrapped == {name.removeprefix("xce_") for name, _ in HOST_HOOKS}


def test_host_hooks_forward_arguments_and_results(make_ctl: CtlFactory) -> None:
    seen: list[tuple[str, Any]] = []

    class Plugin:
        @hookimpl
        def xce_job_validate(self, controller: Controller, job: JobInfo) -> None:
            seen.append(("validate", job.id))

        @hookimpl
        def xce_resize_status(self, controller: Controller, job_id: str) -> Any:
            return ("status of", job_id)

        @hookimpl
        def xce_rest_routes(self, controller: Controller) -> Sequence[Any]:
            return ["route"]

    ctl = make_ctl(Plugin())
    hooks = HostHooks(ctl.plugin_manager)
    hooks.job_validate(ctl, JobInfo("7", "u", JobState.PEND, 1, 1))
    assert seen == [("validate", "7")]
    assert hooks.resize_status(ctl, "7") == ("status of", "7")
    assert hooks.rest_routes(ctl) == [["route"]]  # one list per implementation


class CountingLock:
    """A re-entrant lock that says how deep it is held."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.depth = 0
        self.entries = 0

    def __enter__(self) -> bool:
        self._lock.acquire()
        self.depth += 1
        self.entries += 1
        return True

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        self._lock.release()


def test_the_injected_lock_is_held_around_entry_points_and_hooks(make_ctl: CtlFactory) -> None:
    lock = CountingLock()
    depths: list[int] = []

    class Plugin:
        @hookimpl
        def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
            depths.append(lock.depth)

        @hookimpl
        def xce_job_end(self, controller: Controller, job_id: str) -> None:
            depths.append(lock.depth)

    ctl = make_ctl(Plugin(), lock=lock)
    job = ctl.submit("u", 2, runtime=5)
    ctl.run()
    assert ctl.job(job).state is JobState.DONE
    assert depths and all(d > 0 for d in depths)
    assert lock.depth == 0 and lock.entries > 0


def test_the_hooks_get_the_injected_controller(tmp_path: Path) -> None:
    class Holder:
        """A host holding the embedded controller, forwarding the protocol to it."""

        embedded: EmbeddedController

        def __getattr__(self, name: str) -> Any:
            return getattr(self.embedded, name)

    holder = Holder()
    given: list[object] = []

    class Plugin:
        @hookimpl
        def xce_controller_start(self, controller: Controller) -> None:
            given.append(controller)

        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            given.append(controller)

    holder.embedded = EmbeddedController(
        make_pm(Plugin()),
        tmp_path,
        {"h1": 1},
        store="memory",
        autostart=False,
        hook_controller=holder,  # type: ignore[arg-type]
    )
    holder.embedded.start()
    holder.embedded.settle()
    assert given == [holder, holder]
    holder.embedded.close()


def test_observers_see_task_reports_notification_answers_and_cycles(
    make_ctl: CtlFactory,
) -> None:
    seen: list[tuple[Any, ...]] = []

    class Watch(Observer):
        def task_reported(self, event: TaskEvent, sync: bool) -> None:
            seen.append(("task", event.task_id, event.kind, event.reason, sync))

        def notification_answered(
            self, request: NotificationRequest, result: NotificationResult
        ) -> None:
            seen.append(("answer", request.job_id, request.attempt, result.status))

        def cycles_started(self, time: float) -> None:
            seen.append(("cycles", time))

        def cycles_ended(self, time: float, changed: bool) -> None:
            seen.append(("cycled", time, changed))

    toy = ToyResizer(grace=30.0)
    ctl = make_ctl(toy, notification_runner=ScriptedNotificationRunner())
    ctl.add_observer(Watch())
    job = ctl.submit("u", "1,4", runtime=100, alloc={"h1": 1})
    toy.grow(job, 1)
    ctl.settle()
    # The simulated runner answers a launch inside the controller's call: "sync".
    assert seen == [("cycles", 0.0), ("task", 1, "started", "", True), ("cycled", 0.0, True)]
    seen.clear()
    ctl.settle()
    assert seen == [("cycles", 0.0), ("cycled", 0.0, False)]
    seen.clear()
    ctl.faults.stop_delay = 5.0
    toy.release(job, (1,))
    ctl.advance(10)
    # The exit comes later from the event loop; reports about a task that is gone
    # already change nothing and are not passed on.
    assert ("task", 1, "exited", "SIGTERM", False) in seen
    seen.clear()
    ctl.task_exited(job, 1, 0, "late report")
    ctl.inject_task_exit(job, 0, 3, "crashed")
    assert seen == [("task", 0, "exited", "crashed", False)]
    seen.clear()
    ctl.run_notification(job, 1, "h1", "true", {}, 5.0)
    ended = ctl.submit("u", 1, runtime=1)
    ctl.kill(ended)
    ctl.run_notification(ended, 1, "h1", "true", {}, 5.0)  # answered by the controller
    assert seen == [("answer", job, 1, 0)]
    assert [n.reason for n in ctl.notifications(ended)] == ["job finished"]


def test_restart_can_leave_task_processes_to_the_holder(tmp_path: Path) -> None:
    class LaunchOnly:
        """Launches a grow whose start the runner never reports (a crash in between)."""

        @hookimpl
        def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
            if not launched:
                controller.reserve_slots(job, [Task(2, "h1")])

        @hookimpl
        def xce_dispatch_cycle(self, controller: Controller) -> None:
            if not launched:
                launched.append(True)
                controller.launch_tasks(job, [Task(2, "h1")], {})
                controller.stop_tasks(job, [1], 30.0)

    class Silent:
        def bind(self, reporter: object) -> None:
            pass

        def start(self, job_id: str, task: Task, env: object) -> None:
            pass

        def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
            stops.append((job_id, task_id))

    launched: list[bool] = []
    stops: list[tuple[str, int]] = []
    store = MemoryStore()
    ctl = EmbeddedController(
        make_pm(LaunchOnly()), tmp_path, {"h1": 4}, store=store, task_runner=Silent()
    )
    job = ctl.submit("u", "1,4", runtime=100, alloc={"h1": 2}, resizable=True)
    ctl.settle()
    assert ctl.job(job).task_states[2] is TaskState.STARTING
    assert ctl.job(job).task_states[1] is TaskState.STOPPING
    assert stops == [(job, 1)]
    ctl.close()

    held_back = EmbeddedController(
        make_pm(), tmp_path, store=store, task_runner=Silent(), resume_tasks=False
    )
    assert held_back.job(job).task_states[2] is TaskState.STARTING
    assert stops == [(job, 1)]  # not handed to the runner again
    held_back.close()
    resumed = EmbeddedController(make_pm(), tmp_path, store=store, task_runner=Silent())
    assert resumed.job(job).task_states[2] is TaskState.FAILED
    assert stops == [(job, 1), (job, 1)]
    resumed.close()
