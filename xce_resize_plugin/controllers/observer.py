"""Observers: what a driver of the embedded controller may watch while it runs.

A trace simulation needs to see every job start, every committed allocation and every
job end as they happen (to compute metrics, check the schedule and record the run), and
it needs a place to act at each settled instant (drivers that ask for resizes, as an
application or a site would). :class:`Observer` is that interface: subclass it,
override what you need and register it with
:meth:`~.controller.EmbeddedController.add_observer`.

Observers watch; they never take part in the host contract. The ``job_*`` callbacks
run inside the controller's own bookkeeping and must not call back into it. Only
:meth:`Observer.settled` runs at top level (no hook is running), where the driver API
(``submit``, ``kill``, ``request_resize``...) may be used; if it changed anything the
controller settles the instant again and calls ``settled`` again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import frozen

from xce_resize_plugin.core.models import JobState, Task

if TYPE_CHECKING:
    from xce_resize_plugin.controllers.jobs import VersionRecord
    from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController

__all__ = ["FinishedJob", "Observer"]


@frozen
class FinishedJob:
    """A job as it ended: enough to compute its metrics without keeping its record.

    ``versions`` is the log of committed allocations (version 0 is the start one).
    """

    id: str
    user: str
    state: JobState
    min_tasks: int
    max_tasks: int
    submit_time: float
    start_time: float | None
    end_time: float
    versions: tuple[VersionRecord, ...]
    exit_reason: str


class Observer:
    """No-op base: override the callbacks you need (the controller only calls those)."""

    def job_submitted(self, job_id: str, time: float) -> None:
        """The job was accepted (queued, or started on its ``alloc``)."""

    def job_started(self, job_id: str, time: float, tasks: tuple[Task, ...]) -> None:
        """The host started the job on ``tasks`` (allocation version 0)."""

    def allocation_committed(
        self, job_id: str, time: float, tasks: tuple[Task, ...], version: int
    ) -> None:
        """``commit_allocation`` made ``tasks`` the job's allocation ``version``."""

    def job_ending(self, job_id: str, time: float, state: JobState, reason: str) -> None:
        """The job is about to end as ``state``: its tasks are gone (or it never ran);
        next the controller frees its allocation and calls ``xce_job_end``."""

    def job_ended(self, job: FinishedJob) -> None:
        """The job ended and ``xce_job_end`` returned."""

    def settled(self, controller: EmbeddedController) -> None:
        """The instant settled during :meth:`~.controller.EmbeddedController.run`."""
