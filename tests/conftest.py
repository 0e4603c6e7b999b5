"""The project's own test helpers, on top of the ``xce_resize`` pytest plugin.

The fixtures a site could use too (plugin manager, simulated controller, scenario run,
live cluster) are in :mod:`xce_resize_plugin.testing`, loaded through its ``pytest11``
entry point. What is here serves only this project's tests:

- test plugins that talk to a controller only through the host contract, like the real
  plugin: :class:`Recorder` records every host hook call (and the controller state the
  call saw), :class:`ToyResizer` is a minimal but correct resize plugin (reserve in the
  scheduler cycle, launch/stop in the dispatch cycle, commit on the task events, free
  its reservation at job end), so that the controller's side can be tested without the
  real engine;
- ``make_ctl``: embedded controllers with such plugins (``resize_sim_factory`` with
  this project's defaults);
- pytest's own ``pytester``, for running an example test suite as a site would;
- ``http_scope``: the ASGI scope of a request, for driving an application in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pluggy
import pytest

import xce_resize_plugin.hookspecs
from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.models import JobInfo, Task
from xce_resize_plugin.host import ClusterView, Controller, TaskEvent
from xce_resize_plugin.testing.sim import SimControllers

pytest_plugins = ["pytester"]


def make_pm(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("xce")
    pm.add_hookspecs(xce_resize_plugin.hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


class Recorder:
    """Records host hook calls as tuples; ``inside`` is true while a hook runs (so a
    nested hook call, i.e. re-entry, is visible as ``nested`` in the record)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.inside = False
        self.nested: list[str] = []
        self.on_job_end: Callable[[Controller, str], None] | None = None
        self.end_snapshots: dict[str, tuple[dict[str, dict[str, int]], dict[int, str]]] = {}

    def _enter(self, name: str) -> None:
        if self.inside:
            self.nested.append(name)
        self.inside = True

    @hookimpl
    def xce_controller_start(self, controller: Controller) -> None:
        self.calls.append(("start", controller.now()))

    @hookimpl
    def xce_controller_stop(self, controller: Controller) -> None:
        self.calls.append(("stop", controller.now()))

    @hookimpl
    def xce_job_validate(self, controller: Controller, job: JobInfo) -> None:
        self.calls.append(("validate", job.id, job.state.value))

    @hookimpl
    def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
        self._enter("sched")
        self.calls.append(("sched", controller.now(), dict(cluster.free_slots())))
        self.inside = False

    @hookimpl
    def xce_dispatch_cycle(self, controller: Controller) -> None:
        self._enter("dispatch")
        self.calls.append(("dispatch", controller.now()))
        self.inside = False

    @hookimpl
    def xce_task_events(self, controller: Controller, events: Sequence[TaskEvent]) -> None:
        # The embedded controller delivers task events in batches.
        for event in events:
            self.xce_task_event(controller, event)

    def xce_task_event(self, controller: Controller, event: TaskEvent) -> None:
        self._enter("task_event")
        self.calls.append(("task", event.job_id, event.task_id, event.kind, controller.now()))
        self.inside = False

    @hookimpl
    def xce_notify_done(
        self, controller: Controller, job_id: str, attempt: int, status: int | None, reason: str
    ) -> None:
        self._enter("notify_done")
        self.calls.append(("notify", job_id, attempt, status, reason, controller.now()))
        self.inside = False

    @hookimpl
    def xce_job_end(self, controller: Controller, job_id: str) -> None:
        self._enter("job_end")
        job = controller.get_job(job_id)
        assert job is not None
        self.calls.append(("end", job_id, job.state.value, controller.now()))
        ctl: Any = controller
        held = {t.id: t.host for t in ctl.job(job_id).held}
        self.end_snapshots[job_id] = (ctl.hosts_view(), held)
        if self.on_job_end is not None:
            self.on_job_end(controller, job_id)
        self.inside = False

    def names(self, *skip: str) -> list[str]:
        return [c[0] for c in self.calls if c[0] not in skip]


class ToyResizer:
    """A minimal resize plugin: ``grow(job, n)`` and ``release(job, task_ids)``.

    Grow: reserve ``n`` slots in host order (respecting ptile and headroom) in the
    scheduler cycle, launch them in the dispatch cycle, commit when all started (tasks
    that failed to start are freed and left out). Release: stop the tasks in the
    dispatch cycle, free each slot on ``exited``, commit when all are gone.
    """

    def __init__(self, grace: float = 10.0) -> None:
        self.grace = grace
        self.wants: dict[str, int] = {}
        self.releases: dict[str, tuple[int, ...]] = {}
        self.reserved: dict[str, list[Task]] = {}
        self.launched: set[str] = set()
        self.started: dict[str, set[int]] = {}
        self.failed: dict[str, set[int]] = {}
        self.stopping: dict[str, set[int]] = {}
        self.version: dict[str, int] = {}
        self.next_id: dict[str, int] = {}
        self.events: list[TaskEvent] = []
        self.in_call = False
        self.reentered = False

    def grow(self, job_id: str, n: int) -> None:
        self.wants[job_id] = n

    def release(self, job_id: str, task_ids: tuple[int, ...]) -> None:
        self.releases[job_id] = task_ids

    @hookimpl
    def xce_sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
        for job_id, n in sorted(self.wants.items()):
            job = controller.get_job(job_id)
            if job is None or job.state.value != "RUN" or job_id in self.reserved:
                continue
            room = controller.slot_headroom(job.user)
            if room is not None:
                n = min(n, room)
            per_host: dict[str, int] = {}
            for t in job.tasks:
                per_host[t.host] = per_host.get(t.host, 0) + 1
            nid = self.next_id.get(job_id, max(t.id for t in job.tasks) + 1)
            tasks: list[Task] = []
            for host, free in cluster.free_slots().items():
                take = free
                if job.ptile is not None:
                    take = min(take, job.ptile - per_host.get(host, 0))
                for _ in range(max(0, min(take, n - len(tasks)))):
                    tasks.append(Task(nid, host))
                    nid += 1
            if len(tasks) < n:
                continue
            controller.reserve_slots(job_id, tasks)
            self.next_id[job_id] = nid
            self.reserved[job_id] = tasks
            del self.wants[job_id]

    @hookimpl
    def xce_dispatch_cycle(self, controller: Controller) -> None:
        self.in_call = True
        for job_id, tasks in sorted(self.reserved.items()):
            if job_id not in self.launched:
                self.launched.add(job_id)
                controller.launch_tasks(job_id, tasks, {"XCE_GROW": "1"})
        for job_id, ids in sorted(self.releases.items()):
            if job_id not in self.stopping:
                self.stopping[job_id] = set(ids)
                # Task ids are never reused: later grows number after the released ones.
                job = controller.get_job(job_id)
                assert job is not None
                top = max(t.id for t in job.tasks) + 1
                self.next_id[job_id] = max(self.next_id.get(job_id, 0), top)
                controller.stop_tasks(job_id, ids, self.grace)
        self.in_call = False

    @hookimpl
    def xce_task_events(self, controller: Controller, events: Sequence[TaskEvent]) -> None:
        # The embedded controller delivers task events in batches.
        for event in events:
            self.xce_task_event(controller, event)

    def xce_task_event(self, controller: Controller, event: TaskEvent) -> None:
        if self.in_call:
            self.reentered = True
        self.events.append(event)
        job_id = event.job_id
        if job_id in self.reserved:
            ids = {t.id for t in self.reserved[job_id]}
            if event.task_id in ids:
                if event.kind == "started":
                    self.started.setdefault(job_id, set()).add(event.task_id)
                elif event.kind == "start_failed":
                    self.failed.setdefault(job_id, set()).add(event.task_id)
                    controller.free_slots(job_id, [event.task_id])
                done = self.started.get(job_id, set()) | self.failed.get(job_id, set())
                if done >= ids:
                    self._commit_grow(controller, job_id)
        if job_id in self.stopping and event.kind == "exited":
            pending = self.stopping[job_id]
            if event.task_id in pending:
                controller.free_slots(job_id, [event.task_id])
                pending.discard(event.task_id)
                if not pending:
                    job = controller.get_job(job_id)
                    assert job is not None
                    gone = set(self.releases.pop(job_id))
                    del self.stopping[job_id]
                    self._commit(controller, job_id, [t for t in job.tasks if t.id not in gone])

    def _commit_grow(self, controller: Controller, job_id: str) -> None:
        job = controller.get_job(job_id)
        assert job is not None
        added = [t for t in self.reserved.pop(job_id) if t.id in self.started.get(job_id, set())]
        self.launched.discard(job_id)
        self.started.pop(job_id, None)
        self.failed.pop(job_id, None)
        if added:
            self._commit(controller, job_id, list(job.tasks) + added)

    def _commit(self, controller: Controller, job_id: str, tasks: list[Task]) -> None:
        version = self.version.get(job_id, 0) + 1
        self.version[job_id] = version
        controller.commit_allocation(job_id, tasks, version)

    @hookimpl
    def xce_job_end(self, controller: Controller, job_id: str) -> None:
        tasks = self.reserved.pop(job_id, None)
        if tasks:
            controller.free_slots(job_id, [t.id for t in tasks])
        self.wants.pop(job_id, None)
        self.launched.discard(job_id)
        self.releases.pop(job_id, None)
        self.stopping.pop(job_id, None)


def _state_dirs(root: Path) -> list[Path]:
    """The live controllers' state directories under ``root`` (a test's temporary
    directory, or the run's): those with a ``workers`` directory, a few levels down."""
    found = (
        p.parent
        for pattern in ("workers", "*/workers", "*/*/workers", "*/*/*/workers")
        for p in root.glob(pattern)
    )
    return sorted({p for p in found if p.is_dir()})


@pytest.fixture(autouse=True)
def cgroups_removed(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that has a temporary directory, the cgroups of the agents whose
    state directories are in it are killed and removed (docs/live-controller.md,
    "Process containment"): a test's clean-up kills the agents with SIGKILL, which
    leaves them. Torn down last: the processes are gone by then."""
    # Taken now: a fixture torn down already cannot be asked for.
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        from xce_resize_plugin.testing.live import remove_cgroups

        for state in _state_dirs(tmp):
            remove_cgroups(state)


@pytest.fixture(scope="session", autouse=True)
def no_cgroup_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No cgroup of an agent of this run is left at its end: of the clusters this
    test process made (their state directories may be anywhere), and of every state
    directory under the run's temporary directory. What is left is removed here, and
    reported as an error of the run."""
    from xce_resize_plugin.testing.live import cgroup_trees, remove_cgroups, started_states

    yield
    states = [*started_states(), *_state_dirs(tmp_path_factory.getbasetemp())]
    left = [t for state in states for t in cgroup_trees(state) if t.exists()]
    for state in states:
        remove_cgroups(state)
    assert not left, f"cgroups left behind by the tests: {left}"


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


CtlFactory = Callable[..., EmbeddedController]


@pytest.fixture
def make_ctl(tmp_path: Path, resize_sim_factory: SimControllers) -> CtlFactory:
    """Build controllers on ``tmp_path/state`` (closed at teardown); plugins as positional
    args (instead of the real plugin), controller options as keywords. Default: hosts
    h1..h3 with 4 slots, a non-durable LMDB store, strict invariants."""

    def factory(*plugins: object, **kwargs: Any) -> EmbeddedController:
        kwargs.setdefault("hosts", {"h1": 4, "h2": 4, "h3": 4})
        kwargs.setdefault("strict", True)
        kwargs.setdefault("state_dir", tmp_path / "state")
        pm = kwargs.pop("pm", None) or make_pm(*plugins)
        return resize_sim_factory(pm=pm, **kwargs)

    return factory


def http_scope(method: str, path: str, headers: dict[str, str]) -> dict[str, Any]:
    """The ASGI scope of an HTTP/1.1 request from loopback."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
