"""The embedded controller's state, and the steps every part of it takes.

:class:`~.sim_controller.EmbeddedController` is built in layers, each a class in its
own module that adds one concern to the ones below it (docs/architecture.md, "The
embedded controller in layers"):

1. :class:`ControllerState` (this module): what the controller holds, the clock, job
   lookups, hook calls and persistence;
2. :class:`~.scheduling.Scheduling`: admission, the queue, the FCFS + EASY pass, job
   starts and ends, and the blocked head the plugin sees;
3. :class:`~.contract.HostContract`: the Controller protocol the plugin calls, the task
   runner's reports, and the delivery of queued events to the plugin;
4. :class:`~.host_states.HostStates`: host failures, drains and requeues;
5. :class:`~.views.Views`: read-only views and the invariant check;
6. :class:`~.sim_controller.EmbeddedController`: construction, restart, lifecycle, the
   driver's inputs and the event loop.

A layer calls only what it or a layer below defines. The attributes are declared here,
once, and set by the constructor (:meth:`~.sim_controller.EmbeddedController._setup`);
the scheduler's own are declared and set in :mod:`.scheduling`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import pluggy

from xce_resize_plugin.controllers.cluster import Cluster, HostState
from xce_resize_plugin.controllers.finished_jobs import FinishedJobs
from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.jobs import JobRecord, job_id_key
from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.controllers.runners import (
    InRunner,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    SettableClock,
    StartMany,
    StopMany,
    TaskRunner,
)
from xce_resize_plugin.controllers.sim.events import EventQueue, Timeline
from xce_resize_plugin.controllers.sim.work import JobWork
from xce_resize_plugin.controllers.store import Store
from xce_resize_plugin.controllers.task_records import (
    LIVE_STATES,
    TaskRecord,
    TaskState,
    TaskStates,
    mark_gone,
)
from xce_resize_plugin.controllers.violations import ContractViolation, EmbeddedError, UnknownJob
from xce_resize_plugin.core.models import JobState, LossOutcome, Task
from xce_resize_plugin.host import Controller, HostHooks, Principal, TaskEvent

STOPPABLE = (TaskState.STARTING, TaskState.RUNNING)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def exit_all(records: MutableMapping[int, TaskRecord], now: float, reason: str) -> None:
    """:func:`exit_tasks` for all of a job's task records (those never made at once:
    see :class:`~xce_resize_plugin.controllers.task_records.TaskStates`)."""
    if isinstance(records, TaskStates):
        exit_tasks(records.exit_live(now, reason, LIVE_STATES), now, reason)
    else:
        exit_tasks(records.values(), now, reason)


def exit_tasks(records: Iterable[TaskRecord], now: float, reason: str) -> None:
    """Mark the live ones of these task records exited now (their processes are gone)."""
    for rec in records:
        if rec.state in LIVE_STATES:
            mark_gone(rec, now, reason)


def lost_with_host(job: JobRecord, task_id: int) -> bool:
    """Whether the task went with a failed host: a job that a host failure ends keeps
    it in its allocation, unheld, while its processes elsewhere are stopped (see
    ``loss_ender``)."""
    rec = job.task_states.get(task_id)
    return rec is not None and rec.state is TaskState.EXITED and rec.reason == HOST_FAILURE


class ControllerState:
    """What the embedded controller holds, and the steps every layer takes (see the
    module docstring). Not used on its own."""

    # -- injected, or set once by the constructor -----------------------------------
    _pm: pluggy.PluginManager
    _hooks: HostHooks
    #: The object handed to the hooks as ``controller`` (this one, or its holder).
    _host: Controller
    _lock: AbstractContextManager[Any]
    _loss_ender: Callable[[str, LossOutcome], LossOutcome | None] | None
    _resume_tasks: bool
    #: A report made inside a call to the task runner answers it ("sync").
    _in_runner: InRunner
    task_event_batches: bool
    _state_dir: Path
    _work_dir: Path
    _store: Store
    #: Whether anything is saved (not with a store that drops it).
    _persist: bool
    keep_finished: bool
    #: The most ended tasks and notification runs a job's record keeps, the newest (and
    #: fewer allocation versions); ``None``: all (see EmbeddedController).
    history_kept: int | None
    _tasks_forgotten: Callable[[str, list[int]], None] | None
    lean_cycles: bool
    strict: bool
    protect_reservation: bool
    settle_cap: int
    tokens: dict[str, Principal]
    _config: Mapping[str, Any]
    _cluster: Cluster
    _clock: SettableClock
    _runner: TaskRunner
    _start_many: StartMany
    _stop_many: StopMany
    _notifier: NotificationRunner

    # -- observers (only the callbacks an observer overrides) -----------------------
    _observers: list[Observer]
    _on_submit: list[Callable[[str, float], None]]
    _on_start: list[Callable[[str, float, Sequence[Task]], None]]
    _on_commit: list[Callable[[str, float, Sequence[Task], int], None]]
    _on_ending: list[Callable[[str, float, JobState, str], None]]
    _on_end: list[Callable[[FinishedJob], None]]
    _on_requeue: list[Callable[[str, float], None]]
    _on_task: list[Callable[[TaskEvent, bool], None]]
    _on_answer: list[Callable[[NotificationRequest, NotificationResult], None]]
    _on_cycles: list[Callable[[float], None]]
    _on_cycled: list[Callable[[float, bool], None]]
    _on_host: list[Callable[[str, float, str, bool, Principal | None], None]]

    # -- jobs, time and events -------------------------------------------------------
    _jobs: dict[str, JobRecord]
    #: Ids of finished jobs whose records were dropped (``keep_finished=False``; and
    #: non-numeric ids that :meth:`forget_finished` dropped): never given again.
    _forgotten: set[str]
    #: The finished jobs kept, their ends reported, by end time (what
    #: :meth:`forget_finished` takes from).
    _finished: FinishedJobs
    #: Jobs submitted with an arrival still to come.
    _future: dict[str, JobRecord]
    _next_id: int
    _work: dict[str, JobWork]
    #: Per running job, the generation of its scheduled end: a job whose end moved
    #: (work-based run time) leaves a stale timeline entry that must do nothing.
    _end_gen: dict[str, int]
    _timeline: Timeline
    _events: EventQueue
    #: The change counter: an instant is settled when a cycle leaves it as it was.
    _changes: int
    _instant: int
    _round: int
    _problems: list[str]
    _rejections: list[tuple[float, str, str]]
    _hook_depth: int
    _started: bool
    _closed: bool
    #: While the plugin starts: slots its resume asserted on failed hosts.
    _resumed_losses: dict[str, dict[str, set[int]]] | None

    # -- what is still to be saved ---------------------------------------------------
    _dirty: set[str]
    #: Jobs dropped whose records are still to be deleted from the store.
    _deleted: set[str]
    _meta_dirty: bool
    _saved_clock: float

    # -- the clock and the configuration ----------------------------------------------

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        return self._pm

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``[resize]`` section (read-only)."""
        return self._config

    @property
    def state_dir(self) -> Path:
        return self._state_dir

    def now(self) -> float:
        return self._clock.now()

    # -- jobs, hook calls ----------------------------------------------------------------

    def _job(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}")
        return job

    def _ordered_jobs(self) -> list[JobRecord]:
        return sorted(self._jobs.values(), key=lambda j: (j.submit_time, job_id_key(j.id)))

    def _hook(self, call: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Call a host hook (a :class:`~xce_resize_plugin.host.HostHooks` method): state
        saved first (a plugin crash loses nothing), and the depth tracked so the plugin
        cannot re-enter the driver API from inside."""
        persist = self._persist
        if persist:
            self._flush()
        self._hook_depth += 1
        try:
            return call(*args, **kwargs)
        finally:
            self._hook_depth -= 1
            if persist:
                self._flush()

    def _top_level(self, what: str) -> None:
        if self._hook_depth:
            raise ContractViolation(f"{what}() called from inside a hook")
        if self._closed:
            raise EmbeddedError(f"{what}(): the controller is closed")

    # -- persistence -------------------------------------------------------------------

    def _changed(self, job_id: str) -> None:
        self._changes += 1
        if self._persist:
            self._dirty.add(job_id)

    def _meta(self) -> dict[str, Any]:
        return {
            "clock": self.now(),
            "next_job_id": self._next_id,
            "hosts": [[h, n] for h, n in self._cluster.hosts.items()],
            "user_slots": self._cluster.user_limits,
            "config": dict(self._config),
            **self._host_states_meta(),
        }

    def _restore_host_states(self, saved: Mapping[str, Any]) -> None:
        """The failed and closed hosts as saved (hosts no longer configured are skipped)."""
        cluster = self._cluster
        for key, mark in (("hosts_down", cluster.set_down), ("hosts_closed", cluster.set_closed)):
            for name in saved.get(key, []):
                if cluster.has_host(str(name)):
                    mark(str(name), True)

    def _host_states_meta(self) -> dict[str, list[str]]:
        """The hosts out of scheduling, as saved (absent when every host is ok)."""
        cluster = self._cluster
        down = [h for h in cluster.hosts if cluster.host_state(h) is HostState.UNAVAIL]
        closed = sorted(self._closed_hosts())
        return {k: v for k, v in (("hosts_down", down), ("hosts_closed", closed)) if v}

    def _closed_hosts(self) -> set[str]:
        return {h for h in self._cluster.hosts if self._cluster.is_closed(h)}

    def _flush(self) -> None:
        if self._closed or not self._persist:
            return
        if self.now() != self._saved_clock:
            self._meta_dirty = True
        if not self._dirty and not self._meta_dirty and not self._deleted:
            return
        jobs = [
            (self._jobs[j], self._cluster.held(j)) for j in sorted(self._dirty) if j in self._jobs
        ]
        self._store.write(self._meta() if self._meta_dirty else None, jobs, sorted(self._deleted))
        self._dirty.clear()
        self._deleted.clear()
        self._meta_dirty = False
        self._saved_clock = self.now()
