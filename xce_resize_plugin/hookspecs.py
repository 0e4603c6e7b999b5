"""The contract: host hooks (grouped by controller phase) and site policy hooks.

This module is the single source of the hook reference (docs/hooks.md is checked
against it by a test). Host hooks are called by XCE, or by the embedded controller, with
a :class:`~xce_resize_plugin.host.Controller`; policy hooks are called by the plugin
and implemented by sites (built-in defaults are registered ``trylast``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from xce_resize_plugin.core.accounting import Usage
    from xce_resize_plugin.core.events import JobEvent
    from xce_resize_plugin.core.models import (
        JobInfo,
        LossOutcome,
        ResizeRecord,
        ResizeRequest,
        Task,
    )
    from xce_resize_plugin.core.placement import GrowHostView
    from xce_resize_plugin.core.reclaim import ReclaimCandidate, ReclaimHead, Selection
    from xce_resize_plugin.core.status import ResizeStatus
    from xce_resize_plugin.host import ClusterView, Controller, Principal, TaskEvent

hookspec = pluggy.HookspecMarker("xce")

# -------------------------------------------------------------------------
# lifecycle
# -------------------------------------------------------------------------


@hookspec
def xce_controller_start(controller: Controller) -> None:
    """The controller has started (or taken over after a failover).

    :param controller: the host controller.

    The plugin opens its journal under ``controller.state_dir``, increments the epoch
    (fencing any older controller), recovers the live jobs' state and re-issues the
    effects of in-flight changes (docs/failover.md). A corrupt or newer-schema journal
    raises :class:`~xce_resize_plugin.errors.JournalError`: the host must not start.

    Implemented by: the resize plugin.
    """


@hookspec
def xce_controller_stop(controller: Controller) -> None:
    """The controller is stopping cleanly: the plugin closes its journal.

    :param controller: the host controller.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# submission
# -------------------------------------------------------------------------


@hookspec
def xce_job_validate(controller: Controller, job: JobInfo) -> None:
    """Check a job's resize options at submission; raise to reject the submission.

    :param controller: the host controller.
    :param job: the job as submitted (state ``PEND``).

    Raises :class:`~xce_resize_plugin.errors.ResizeError` for min > max, ptile < 1, a
    notification command of 4096 bytes or more.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# requests (the REST routes and the embedded controller's command paths)
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_resize_request(
    controller: Controller, principal: Principal, job_id: str, request: ResizeRequest
) -> ResizeStatus | None:
    """Submit a grow, release or cancel for a job; return its state once durable.

    :param controller: the host controller.
    :param principal: who asks.
    :param job_id: the job to resize.
    :param request: a :class:`~xce_resize_plugin.core.models.GrowRequest`,
        :class:`~xce_resize_plugin.core.models.ReleaseRequest` or
        :class:`~xce_resize_plugin.core.models.CancelRequest` (also the
        :class:`~xce_resize_plugin.core.models.AutoresizeRequest` of a modify; the
        :class:`~xce_resize_plugin.core.models.ReadyRequest` of a task saying it is
        ready, which the policy hooks see as the action ``ready`` and do not validate;
        and ``DrainedRequest``: tasks of a release being drained that may stop now,
        authorised as the action ``drained``).

    firstresult: the resize plugin answers. Raises a
    :class:`~xce_resize_plugin.errors.ResizeError` (with LSF's code) on rejection, in
    which case nothing changed.

    Implemented by: the resize plugin.
    """


@hookspec(firstresult=True)
def xce_resize_status(controller: Controller, job_id: str) -> ResizeStatus | None:
    """The job's resize state: allocation, pending grow, change in flight, bounds.

    :param controller: the host controller.
    :param job_id: the job.

    firstresult: the resize plugin answers; ``None`` for a job the host does not know.

    Implemented by: the resize plugin.
    """


@hookspec(firstresult=True)
def xce_resize_events(
    controller: Controller, job_id: str, after: int | None
) -> Sequence[JobEvent] | None:
    """The job's events after the cursor ``after``, from its resize facts.

    :param controller: the host controller.
    :param job_id: the job.
    :param after: the ``seq`` of the last event the caller has (``None``: from the
        start; ``0``: every event).

    firstresult: the resize plugin answers, projecting the job's journal facts to
    events (``grow_placed``, ``grow_committed``, ``release_coming``, ``tasks_exited``,
    ``tasks_lost``, ``size_changed``, ``job_ended``; docs/in-job-api.md), each with a
    ``seq`` that stays the same across restarts. A cursor below 0 or beyond the last
    event raises :class:`~xce_resize_plugin.errors.UnknownEventCursor`. The resize
    plugin answers at most 1,000 events a call: a caller further behind calls again
    from the last ``seq`` it got. The events route (``GET /v1/jobs/{id}/events``)
    long-polls this hook.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# scheduler
# -------------------------------------------------------------------------


@hookspec
def xce_sched_cycle(controller: Controller, cluster: ClusterView) -> None:
    """Place pending grow requests on this cycle's free slots.

    :param controller: the host controller.
    :param cluster: the cycle's free-slot view, after the host placed its queue.

    The host calls it once per scheduling cycle, after its own pass over pending jobs
    (so a grow never takes slots ahead of a queued job). Placed grows reserve their
    slots through ``controller.reserve_slots`` before this hook returns.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# dispatch
# -------------------------------------------------------------------------


@hookspec
def xce_dispatch_cycle(controller: Controller) -> None:
    """Advance in-flight changes: run notifications, launch and stop tasks, commit.

    :param controller: the host controller.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# events
# -------------------------------------------------------------------------


@hookspec
def xce_task_event(controller: Controller, event: TaskEvent) -> None:
    """A task started, failed to start, or exited.

    A host reports each event once, through this hook or in a batch through
    ``xce_task_events``, never both.

    :param controller: the host controller.
    :param event: what happened to which task.

    Implemented by: the resize plugin.
    """


@hookspec
def xce_task_events(controller: Controller, events: Sequence[TaskEvent]) -> None:
    """Several task events at once, in the order they happened.

    The same as calling ``xce_task_event`` for each event in turn, except that each
    job's events in the batch are decided together and written in one journal
    transaction: a grow or shrink of k tasks then costs one write instead of k. Hosts
    that receive task states in batches (a worker's report, everything that arrived
    since the last delivery) should call this one.

    :param controller: the host controller.
    :param events: the events, oldest first; any number of jobs, possibly none. A
        :class:`~xce_resize_plugin.TaskEvents` may give many tasks' alike events as one
        :class:`~xce_resize_plugin.TaskEventRun` (docs/host-integration.md).

    Implemented by: the resize plugin.
    """


@hookspec
def xce_notify_done(
    controller: Controller, job_id: str, attempt: int, status: int | None, reason: str
) -> None:
    """A notification command started by ``controller.run_notification`` finished.

    :param controller: the host controller.
    :param job_id: the job.
    :param attempt: the attempt number given to ``run_notification``.
    :param status: its exit status, ``None`` when it timed out or could not run.
    :param reason: a short explanation for the logs (``timeout``, ``exit 3``).

    Implemented by: the resize plugin.
    """


@hookspec
def xce_job_start(controller: Controller, job: JobInfo) -> None:
    """A job started running (its first allocation is charged and its tasks launched).

    :param controller: the host controller.
    :param job: the job as it starts (state ``RUN``, ``tasks`` its allocation).

    The plugin starts tracking an autoresizable job here (``job.autoresize``, the
    submission's ``bsub -ar``) and keeps its demand from then on, and a requeued job
    (``job.requeued``) whose earlier run it tracked, whose history it continues; it
    ignores any other job. After ``xce_controller_start`` the host calls it again for
    each running job, since a crash may have come between a job's start and this call:
    the plugin ignores a job it tracks already.

    Implemented by: the resize plugin.
    """


@hookspec
def xce_job_end(controller: Controller, job_id: str) -> None:
    """The job finished (DONE or EXIT): cancel its pending grow, abort in-flight work.

    :param controller: the host controller.
    :param job_id: the job.

    The host frees every slot charged to the job — its allocation and any reservation
    the plugin made — so that slots never outlive a job even when the controller died
    between the job's end and the plugin's own ``free_slots`` (which it also issues;
    both are idempotent).

    Implemented by: the resize plugin.
    """


@hookspec(firstresult=True)
def xce_host_failed(
    controller: Controller, host: str, lost: Mapping[str, Sequence[int]]
) -> Mapping[str, LossOutcome] | None:
    """A host failed: its tasks are gone; say what becomes of each job that had some.

    :param controller: the host controller.
    :param host: the failed host (already ``unavail``: nothing is placed on it).
    :param lost: job id -> the ids of the job's tasks whose slots were on ``host``
        (committed tasks and those of a change in flight), for every job that had any.

    The host has marked those tasks exited and freed their slots before the call. The
    plugin settles each job at once (docs/failover.md): a resizable job that keeps task
    0 and at least ``min_tasks`` loses the tasks as an involuntary shrink (a committed
    change with a resize record, reason ``host_failure``; the notification command runs
    for information only); any other job is answered ``exit`` or, when the site's
    ``xce_resize_host_lost`` says so, ``requeue``. The host then ends the job
    (``EXIT``, and ``xce_job_end`` as for any end) or requeues it (without
    ``xce_job_end``: the plugin has already stopped tracking it). A job missing from
    the answer, or no answer at all, ends ``EXIT``.

    firstresult: the resize plugin answers with a
    :class:`~xce_resize_plugin.core.models.LossOutcome` per job of ``lost``.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# accounting
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_acct_usage(controller: Controller, job_id: str, now: float) -> Usage | None:
    """The job's allocation timeline up to ``now`` and its resize records.

    :param controller: the host controller.
    :param job_id: the job.
    :param now: the end of the timeline for a running job.

    firstresult: the resize plugin answers for every job the host knows, and for a
    finished job the host has forgotten whose final state the plugin's journal holds.

    Implemented by: the resize plugin.
    """


@hookspec(firstresult=True)
def xce_acct_job(controller: Controller, job_id: str) -> JobInfo | None:
    """The job as the plugin's records have it, for a job the host has forgotten.

    A host drops finished jobs after a while (LSF's ``CLEAN_PERIOD``); the plugin's
    journal keeps the final state and history of a job that resized (or asked to),
    also through compaction, which removes only facts. The host asks this
    to decide who may read that history (the ``view`` policy takes a job): the answer
    holds the owner, the range, the last allocation, start and end; it is given as
    ``DONE``, with no environment or notification command (the host's, not recorded).

    :param controller: the host controller.
    :param job_id: a job the host no longer knows.

    firstresult: the resize plugin answers for an ended job its journal holds, else
    ``None``.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# REST
# -------------------------------------------------------------------------


@hookspec
def xce_rest_routes(controller: Controller) -> Sequence[Any]:  # type: ignore[empty-body]
    """ASGI routes the host mounts under its API (``/v1/jobs/{id}/resize...``).

    :param controller: the host controller.

    Implemented by: the resize plugin.
    """


# -------------------------------------------------------------------------
# policy (plugin -> site). First non-None result wins; built-ins are trylast.
# -------------------------------------------------------------------------


@hookspec(firstresult=True)
def xce_resize_select_release(
    job: JobInfo, candidates: Sequence[Task], count: int
) -> Sequence[int] | None:
    """Choose which task ids a count-based shrink releases.

    :param job: the job.
    :param candidates: the tasks that may be released (task 0 is never among them).
    :param count: how many to release.

    firstresult: return exactly ``count`` ids from ``candidates`` (ints, in any
    iterable), or ``None`` to let a later implementation decide. Default: newest tasks
    first. Any other answer — task 0, an id that is not a candidate's, one twice, too
    many or too few, something that is not ids (``3``, ``"3"``, ``[True]``) — or an
    exception refuses the request with
    :class:`~xce_resize_plugin.errors.PolicyRejected` naming the hook; nothing changes.

    Implemented by: sites; built-in default in ``default_policies``.
    """


@hookspec(firstresult=True)
def xce_resize_order_grow_hosts(job: JobInfo, hosts: GrowHostView) -> Iterable[str] | None:
    """The order in which a grow tries hosts.

    :param job: the job.
    :param hosts: the cycle's hosts with their free slots and the job's tasks there.

    firstresult: return host names (may be lazy; only as many are read as the grow
    needs). Hosts not returned are not used; unknown names, repeats and hosts without a
    free slot are skipped, up to four names per host of the cycle (``len(hosts)``),
    and ``ptile``, ``new-only``, free slots and the user's limit hold whatever the
    order. Default: hosts already in the allocation first, then most free slots, then
    name. An answer that is not names (a string, a number, an item that is not a
    string), an exception, even one raised while the answer is read, or a name read
    beyond those four per host (an endless order) leaves that grow pending for the
    cycle and is logged naming the hook and the job; the cycle's other grows are
    placed as usual. An order kept for a larger machine (a rack file's) is filtered
    to the cycle's hosts first (``name in hosts``).

    Implemented by: sites; built-in default in ``default_policies``.
    """


@hookspec(firstresult=True)
def xce_resize_authorize(principal: Principal, job: JobInfo, action: str) -> bool | None:
    """Whether ``principal`` may perform ``action`` (grow, release, cancel, view) on ``job``.

    :param principal: who asks.
    :param job: the job. For ``view`` of the history of a finished job the host has
        dropped, the job as the plugin's journal recorded it (``xce_acct_job``):
        always ``DONE``, with no environment or notification command, and default
        span options; a policy that decides on those sees the defaults.
    :param action: ``grow``, ``release``, ``cancel``, ``modify`` (autoresize),
        ``target`` (set or clear a target size), ``drained`` (tasks of a release being
        drained may stop now), ``ready`` (a task is ready) or ``view``.

    firstresult: ``True`` allows, ``False`` denies, ``None`` defers. Default: the owner,
    an administrator, or the job's own token. Any other answer (``"no"``, ``1``) is not
    taken as allowing: the request is refused with
    :class:`~xce_resize_plugin.errors.PolicyRejected` naming the hook and the answer.

    Implemented by: sites; built-in default in ``default_policies``.
    """


@hookspec
def xce_resize_validate(job: JobInfo, request: ResizeRequest) -> None:
    """Extra site rules; raise :class:`~xce_resize_plugin.errors.PolicyRejected` to refuse.

    :param job: the job.
    :param request: the request as received, before any change.

    Every implementation is called; any exception rejects the request (its message is
    the site's). Nothing changes on rejection.

    Implemented by: sites.
    """


@hookspec(firstresult=True)
def xce_resize_host_lost(job: JobInfo, lost_task_ids: Sequence[int]) -> str | None:
    """What to do with a job a failed host took tasks from, when it cannot shrink.

    :param job: the job as it was before the failure.
    :param lost_task_ids: the ids of its tasks that were on the failed host.

    Called for a job that is not resizable, lost task 0, or would be left with fewer
    than ``min_tasks``. A ``"requeue"`` for a job already requeued ``[resize]
    max_requeue`` times (``job.requeues``) is refused: the job ends ``EXIT``, with a
    warning in the log. firstresult: ``"exit"`` ends the job
    (``EXIT``, reason host failure), ``"requeue"`` puts it back in the queue to start
    again from scratch; ``None`` defers. Default: ``"exit"``. Any other answer, or an
    exception, is logged naming the hook and the job ends ``EXIT``: a failure is
    settled whatever the hook does.

    Implemented by: sites; built-in default in ``default_policies``.
    """


@hookspec
def xce_resize_committed(job: JobInfo, change: ResizeRecord) -> None:
    """Notification after every committed allocation change.

    :param job: the job, with its new allocation.
    :param change: the resize record written for it.

    Called once the change is committed: an implementation that raises is logged
    (naming it, the job and the change) and changes nothing; the other
    implementations are told all the same.

    Implemented by: sites (e.g. to inform an external accounting system).
    """


# --- reclaim (policy) ---------------------------------------------------------------


@hookspec(firstresult=True)
def xce_resize_select_reclaim(
    head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
) -> Selection | None:
    """Choose which tasks running jobs give back so that the blocked queue head starts now.

    :param head: the head: its job, the tasks it needs, its ``ptile``, the slots per
        host that count for it (free now or being freed), and ``head.short(freed)``, the
        tasks still missing once ``freed`` (host -> slots) are free too.
    :param candidates: the running resizable jobs above their ``min_tasks`` with no
        change in flight, each with its releasable tasks (never task 0, in id order:
        the newest last; a sequence, read from its end by the default) and how many it
        may give (``excess``).

    Called in the scheduler cycle when ``[resize] reclaim = "shrink"`` and the host
    reports a blocked head; not again while the head, the job states and the jobs
    already asked stay as they were (the answer would be the same: it should depend on
    the arguments only). firstresult: return job id -> task ids to release, or
    ``None`` to let a later implementation decide. The plugin refuses an answer that
    takes task 0, a task the job does not have, or more than a job's ``excess``, that
    is not a mapping of job ids to task ids (ints, in any iterable), or an exception
    (:class:`~xce_resize_plugin.errors.PolicyRejected` naming the hook, logged:
    nothing is asked for that head, the cycle goes on), and asks nothing when the chosen tasks
    would not start the head. Default: the largest excess over ``min_tasks`` first,
    newest tasks first, only tasks whose slots count for the head, no more than it
    needs.

    Implemented by: sites; built-in default in ``default_policies``.
    """
