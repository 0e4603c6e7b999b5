"""Observers: what a driver of the embedded controller may watch while it runs.

A trace simulation needs to see every job start, every committed allocation and every
job end as they happen (to compute metrics, check the schedule and record the run), and
it needs a place to act at each settled instant (drivers that ask for resizes, as an
application or a site would). A recording of a live run needs the inputs as they enter
the controller: task reports, notification outcomes, the scheduler cycles.
:class:`Observer` is that interface: subclass it, override what you need and register
it with :meth:`~.sim.sim_controller.EmbeddedController.add_observer`.
:class:`LiveObserver` adds what only the live controller
(:mod:`.live.live_controller`) has: hook calls made from any thread, jobs whose tasks
are being stopped before they end, the controller's start and close.

Observers watch; they never take part in the host contract. The ``job_*``, ``task_*``,
``notification_*`` and ``cycles_*`` callbacks run inside the controller's own
bookkeeping (under its lock) and must not call back into it. Only
:meth:`Observer.settled` runs at top level (no hook is running), where the driver API
(``submit``, ``kill``, ``request_resize``...) may be used; if it changed anything the
controller settles the instant again and calls ``settled`` again.

This module imports no controller: the controllers import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen

from xce_resize_plugin.controllers.jobs import VersionRecord
from xce_resize_plugin.controllers.runners import NotificationRequest, NotificationResult
from xce_resize_plugin.core.models import JobState, Principal, Task, TaskEvent

__all__ = ["FinishedJob", "LiveObserver", "Observer"]


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

    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        """The host started the job on ``tasks`` (allocation version 0)."""

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        """``commit_allocation`` made ``tasks`` the job's allocation ``version``."""

    def job_ending(self, job_id: str, time: float, state: JobState, reason: str) -> None:
        """The job is about to end as ``state``: its tasks are gone (or it never ran);
        next the controller frees its allocation and calls ``xce_job_end``. ``PEND``:
        a host failure's requeue (back to the queue, no ``xce_job_end``)."""

    def job_requeued(self, job_id: str, time: float) -> None:
        """The host put the job back in its queue (a host failure's requeue, after
        :meth:`job_ending` with ``PEND``): its run is over, its slots are free, and it
        starts again from scratch (another :meth:`job_started`)."""

    def job_ended(self, job: FinishedJob) -> None:
        """The job ended and ``xce_job_end`` returned."""

    def task_reported(self, event: TaskEvent, sync: bool) -> None:
        """The task runner reported a change of a task (queued for the plugin as
        ``event``). Reports that change nothing (about a task the job's end already
        took down, a repeated start) are not passed on. ``sync``: the runner answered
        inside the controller's own call to it (a launch refused at once)."""

    def notification_answered(
        self, request: NotificationRequest, result: NotificationResult
    ) -> None:
        """The notification runner answered ``request`` (before the controller logs the
        result and queues it for the plugin). A notification the controller answers
        itself (its job had finished) is not passed on."""

    def host_changed(
        self, name: str, time: float, state: str, evacuate: bool, principal: Principal | None
    ) -> None:
        """A host is about to change state: ``state`` is the command (``down``, ``up``,
        ``closed``, ``open``) that the controller accepted; what it does to the jobs
        follows. ``evacuate`` and ``principal`` (who asks the releases) go with
        ``closed``."""

    def cycles_started(self, time: float) -> None:
        """``settle`` is about to run the scheduler and dispatch cycles at ``time``."""

    def cycles_ended(self, time: float, changed: bool) -> None:
        """``settle`` ran its cycles (started at ``time``); ``changed``: whether they
        changed anything."""

    def settled(self, controller: Any) -> None:
        """The instant settled during :meth:`~.sim.sim_controller.EmbeddedController.run`.

        ``controller`` is the controller the observer was added to. It is typed ``Any``
        here so that this module, which the controllers import, imports none of them:
        an observer annotates it with the controller class it watches.
        """


class LiveObserver(Observer):
    """An observer of the live controller: the :class:`Observer` callbacks, plus what
    happens around the embedded controller (all called under the controller lock)."""

    def controller_started(self) -> None:
        """``xce_controller_start`` returned: the plugin recovered its journal."""

    def hook_returned(
        self, name: str, kwargs: Mapping[str, Any], error: BaseException | None
    ) -> None:
        """A host hook returned (``error``: what it raised), whichever thread called it
        and whether or not through the controller (the REST routes call hooks too).
        Still under the lock the call held, so no other input comes between the call and
        what the observer does. Not called once the controller is fenced, nor for a call
        that found it fenced: nothing of this controller's happened then."""

    def hook_decided(self, name: str, kwargs: Mapping[str, Any]) -> None:
        """A resize request (``name`` is ``xce_resize_request``) is decided and its
        facts are queued for the journal; the controller lock is released next while
        the fsync runs, so other inputs may come before :meth:`hook_returned`. Under the
        lock, in the order the requests were decided (which is the journal's order):
        where a recording writes the request. :meth:`hook_returned` follows once the
        write is durable (a failed write ends the observers' run instead:
        :meth:`controller_closed`)."""

    def job_over(
        self, job_id: str, state: JobState, reason: str, tasks: list[int], grace: float
    ) -> None:
        """The job is over (its task 0 ended, it was killed, its agent was lost):
        ``tasks`` are being stopped with ``grace`` seconds; it ends as ``state``
        (:meth:`~Observer.job_ending`) once none of its tasks is left."""

    def controller_closed(self, clean: bool) -> None:
        """The controller shut down; ``clean``: it had opened and stopped cleanly
        (``xce_controller_stop`` returned), else it was fenced or failed."""
