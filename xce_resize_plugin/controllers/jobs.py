"""The embedded controller's job records and the read-only views it hands out.

A :class:`JobRecord` is the controller's mutable, private state of one job; callers
only ever see frozen snapshots (:class:`~xce_resize_plugin.core.models.JobInfo` for the
plugin, :class:`JobView` for scenario output and tests), so nothing outside the
controller can change a job behind its back. Held slots are not stored here: the
cluster ledger owns them (one source of truth); the store saves both together.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from attrs import define, field, fields_dict, frozen

from xce_resize_plugin.controllers.task_records import TaskRecord, TaskState
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import (
    GrowHosts,
    JobInfo,
    JobState,
    Task,
    project,
)

#: The job options a submission gives under these names wherever it comes from: a
#: scenario file's ``[[jobs]]`` and a ``POST /v1/jobs`` body to the live controller
#: (``tasks``, or ``min_tasks`` and ``max_tasks``, is ``bsub -n``).
SUBMIT_OPTIONS = {
    "tasks",
    "min_tasks",
    "max_tasks",
    "ptile",
    "resizable",
    "autoresize",
    "grow_hosts",
    "notify_cmd",
    "estimate",
    "alloc",
    "initial",
    "release_exited",
    "grace",
}


@frozen(kw_only=True)
class JobOptions:
    """The options of :data:`SUBMIT_OPTIONS` (but the task range) as a submission
    carries them: declared once here, the base of a scenario's job
    (:class:`~xce_resize_plugin.scenarios.files.JobSpec`) and of a live ``POST
    /v1/jobs`` body (:class:`~xce_resize_plugin.controllers.live.submission.Submission`),
    and handed to
    :meth:`~xce_resize_plugin.controllers.sim.sim_controller.EmbeddedController.submit_job`
    as one object, so the two paths pass them on in one place."""

    estimate: float | None = None
    ptile: int | None = None
    resizable: bool = False
    autoresize: bool = False
    grow_hosts: GrowHosts = GrowHosts.PREFER_EXISTING
    notify_cmd: str | None = None
    alloc: tuple[tuple[str, int], ...] | None = None
    initial: int | None = None
    #: Tasks that exit on their own leave the allocation (docs/in-job-api.md).
    release_exited: bool = False
    grace: float = 0.0


_OPTION_NAMES = tuple(fields_dict(JobOptions))


def submit_keywords(options: JobOptions) -> dict[str, Any]:
    """``options`` as the keywords of
    :meth:`~xce_resize_plugin.controllers.sim.sim_controller.EmbeddedController.submit`
    (where ``initial`` is ``initial_tasks``)."""
    # Only the options' own fields: a scenario's job or a live submission has more.
    keywords = {name: getattr(options, name) for name in _OPTION_NAMES}
    keywords["initial_tasks"] = keywords.pop("initial")
    return keywords


@frozen
class VersionRecord:
    """One committed allocation: its version, when, and the tasks."""

    version: int
    time: float
    tasks: Sequence[Task]


@frozen
class NotificationLog:
    """One notification command run: what ran, when (simulated), and what came out.

    ``status`` is the exit status (``None``: timed out or could not run); ``elapsed``
    is the real time it took in seconds.
    """

    job_id: str
    attempt: int
    host: str
    command: str
    time: float
    status: int | None
    reason: str
    stdout: str = ""
    stderr: str = ""
    elapsed: float = 0.0


def job_id_key(job_id: str) -> tuple[int, int, str]:
    """Sort key of job ids: numeric ids numerically ("99" < "101"), then the others."""
    number = read_decimal(job_id)
    if number is not None:
        return (0, number, job_id)
    return (1, 0, job_id)


@define
class JobRecord:
    """The controller's state of one job (mutable, private to the controller).

    ``tasks`` is the committed allocation in allocation order; ``versions`` the log of
    committed allocations (version 0 is the start allocation). ``task_states`` covers
    every task id the job ever ran or tried to run. ``end_reported`` turns true once
    ``xce_job_end`` returned, so a controller that crashed in between reports it again.
    """

    id: str
    user: str
    min_tasks: int
    max_tasks: int
    submit_time: float
    runtime: float | None = None
    estimate: float | None = None
    ptile: int | None = None
    resizable: bool = False
    grow_hosts: GrowHosts = GrowHosts.PREFER_EXISTING
    notify_cmd: str | None = None
    env: dict[str, str] = field(factory=dict)
    #: Submitted autoresizable (``bsub -ar``): handed to the plugin in the job's view;
    #: whether it is on now is the plugin's (its journal), not this record's.
    autoresize: bool = False
    alloc: tuple[tuple[str, int], ...] | None = None
    #: The most tasks the scheduler starts the job with (``None``: ``max_tasks``).
    start_tasks: int | None = None
    #: The most tasks the job starts with, whatever is free (``submit --initial``): a
    #: resizable job that starts small and grows itself; ``None``: no such cap.
    initial_tasks: int | None = None
    state: JobState = JobState.PEND
    start_time: float | None = None
    end_time: float | None = None
    tasks: Sequence[Task] = ()
    version: int = 0
    versions: list[VersionRecord] = field(factory=list)
    task_states: MutableMapping[int, TaskRecord] = field(factory=dict)
    exit_reason: str = ""
    #: Put back in the queue after a host failure (``JobInfo.requeued``).
    requeued: bool = False
    #: How many times (``JobInfo.requeues``).
    requeues: int = 0
    #: The job's default drain time for its releases (``submit --grace``, seconds).
    grace: float = 0.0
    end_reported: bool = False
    #: ``JobInfo.release_exited``: tasks that exit on their own leave the allocation.
    release_exited: bool = False
    notifications: list[NotificationLog] = field(factory=list)

    @property
    def finished(self) -> bool:
        return self.state in (JobState.DONE, JobState.EXIT)

    @property
    def duration(self) -> float | None:
        """What the scheduler plans with: the user's estimate, else the runtime."""
        return self.estimate if self.estimate is not None else self.runtime

    def expected_end(self) -> float | None:
        """Planned end of a running job (``None``: runs until killed)."""
        if self.start_time is None or self.duration is None:
            return None
        return self.start_time + self.duration

    def planned_end(self) -> float | None:
        """When the simulation ends the job: start + the true runtime."""
        if self.start_time is None or self.runtime is None:
            return None
        return self.start_time + self.runtime

    def info(self) -> JobInfo:
        return job_info(self)

    def view(self, held: Mapping[int, str]) -> JobView:
        return project(
            JobView,
            self,
            held=tuple(Task(tid, host) for tid, host in held.items()),
            task_states={tid: rec.state for tid, rec in self.task_states.items()},
            env=dict(self.env),
            versions=tuple(self.versions),
        )


@frozen
class JobView:
    """Everything the embedded controller knows about a job, frozen, for output/tests.

    ``held`` are the slots the job is charged for right now (committed allocation plus
    any grow the plugin reserved, minus released tasks already freed).
    """

    id: str
    user: str
    state: JobState
    min_tasks: int
    max_tasks: int
    tasks: Sequence[Task]
    held: tuple[Task, ...]
    task_states: Mapping[int, TaskState]
    resizable: bool
    autoresize: bool
    ptile: int | None
    grow_hosts: GrowHosts
    notify_cmd: str | None
    runtime: float | None
    estimate: float | None
    submit_time: float
    start_time: float | None
    end_time: float | None
    env: Mapping[str, str]
    version: int
    versions: tuple[VersionRecord, ...]
    exit_reason: str
    requeued: bool
    requeues: int
    release_exited: bool
    grace: float

    @property
    def slots(self) -> int:
        """Slots held now."""
        return len(self.held)

    def info(self) -> JobInfo:
        return job_info(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (scenario output)."""
        return {
            "id": self.id,
            "user": self.user,
            "state": self.state.value,
            "min_tasks": self.min_tasks,
            "max_tasks": self.max_tasks,
            "tasks": [[t.id, t.host] for t in self.tasks],
            "held": [[t.id, t.host] for t in self.held],
            "submit_time": self.submit_time,
            "start_time": self.start_time,
            "end_time": self.end_time,
            "runtime": self.runtime,
            "version": self.version,
            "versions": [
                {"version": v.version, "time": v.time, "tasks": [[t.id, t.host] for t in v.tasks]}
                for v in self.versions
            ],
            "exit_reason": self.exit_reason,
        }


def job_info(job: JobRecord | JobView) -> JobInfo:
    """The plugin's view of a job (the record and its frozen view share these fields).

    Spelled out, not built by reflection: the plugin asks for it at every transition,
    and mypy checks each field here.
    """
    return JobInfo(
        id=job.id,
        user=job.user,
        state=job.state,
        min_tasks=job.min_tasks,
        max_tasks=job.max_tasks,
        tasks=job.tasks,
        resizable=job.resizable,
        ptile=job.ptile,
        grow_hosts=job.grow_hosts,
        notify_cmd=job.notify_cmd,
        start_time=job.start_time,
        end_time=job.end_time,
        env=dict(job.env),
        autoresize=job.autoresize,
        requeued=job.requeued,
        requeues=job.requeues,
        release_exited=job.release_exited,
        grace=job.grace,
    )
