"""The hook implementations the host calls: thin, each delegates to the runtime.

Registered by the host through the entry point ``xce.plugins: resize``. The plugin keeps
one :class:`~xce_resize_plugin.runtime.Runtime` per controller object, made at
``xce_controller_start`` and dropped at ``xce_controller_stop``. Why a weak mapping
keyed by the controller rather than state on this module: a process may host several
controllers (tests, a simulation comparing two runs), and a crashed one that is simply
dropped must not keep its journal handle alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from xce_resize_plugin import hookimpl
from xce_resize_plugin.core import config, engine
from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.events import JobEvent
from xce_resize_plugin.core.models import JobInfo, LossOutcome, ResizeRequest
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import ClusterView, Controller, Principal, TaskEvent
from xce_resize_plugin.rest import routes as api
from xce_resize_plugin.runtime import Runtime

_RUNTIMES: weakref.WeakKeyDictionary[Any, Runtime] = weakref.WeakKeyDictionary()


class _LastLookup:
    """The last controller looked up and its runtime, both weakly (a dropped controller's
    runtime must not be kept). A process mostly serves one controller at a time, and a
    ``WeakKeyDictionary`` lookup makes a weak reference per call: a simulation makes
    millions of hook calls."""

    __slots__ = ("hit",)

    def __init__(self) -> None:
        self.hit: tuple[weakref.ref[Any], weakref.ref[Runtime]] | None = None


_LAST = _LastLookup()


class NotStartedError(ResizeError):
    """A hook was called before ``xce_controller_start`` for this controller."""

    code = "XCE_RESIZE_NOT_STARTED"
    message = "The resize plugin was not started for this controller"
    http_status = 503


def runtime_of(controller: Controller) -> Runtime:
    hit = _LAST.hit
    if hit is not None and hit[0]() is controller:
        runtime = hit[1]()
        if runtime is not None:
            return runtime
    try:
        runtime = _RUNTIMES[controller]
    except KeyError:
        raise NotStartedError("call xce_controller_start first") from None
    _LAST.hit = (weakref.ref(controller), weakref.ref(runtime))
    return runtime


def _forget(controller: Controller) -> Runtime | None:
    """Drop the controller's runtime (and the last lookup's, if it is this one)."""
    _LAST.hit = None
    return _RUNTIMES.pop(controller, None)


# lifecycle


@hookimpl
def xce_controller_start(controller: Controller) -> None:
    old = _forget(controller)
    if old is not None:
        old.stop()
    runtime = Runtime(controller)
    _RUNTIMES[controller] = runtime
    try:
        runtime.start()
    except BaseException:
        _forget(controller)
        runtime.stop()
        raise


@hookimpl
def xce_controller_stop(controller: Controller) -> None:
    runtime = _forget(controller)
    if runtime is not None:
        runtime.stop()


# submission


@hookimpl
def xce_job_validate(controller: Controller, job: JobInfo) -> None:
    engine.check_job_options(job)
    # The job's default drain time, within the site's maximum (docs/admin-guide.md).
    engine.check_grace(job.grace, _settings_of(controller), "grace")


def _settings_of(controller: Controller) -> engine.Settings:
    # Every submission is validated: the started runtime's parsed settings, not the
    # [resize] table parsed again (that cost a trace simulation about 5 %). Only a
    # controller that has not started the plugin yet has its table parsed here.
    runtime = _RUNTIMES.get(controller)
    return runtime.settings if runtime is not None else config.settings(controller.config)


# requests


@hookimpl
def xce_resize_request(
    controller: Controller, principal: Principal, job_id: str, request: ResizeRequest
) -> ResizeStatus | None:
    return runtime_of(controller).request(principal, job_id, request)


@hookimpl
def xce_resize_status(controller: Controller, job_id: str) -> ResizeStatus | None:
    return runtime_of(controller).status(job_id)


@hookimpl
def xce_resize_events(
    controller: Controller, job_id: str, after: int | None
) -> Sequence[JobEvent] | None:
    return runtime_of(controller).events(job_id, after)


# scheduler and dispatch


@hookimpl
def xce_sched_cycle(controller: Controller, cluster: ClusterView) -> None:
    runtime_of(controller).sched_cycle(cluster)


@hookimpl
def xce_dispatch_cycle(controller: Controller) -> None:
    runtime_of(controller).dispatch_cycle()


# events


@hookimpl
def xce_task_event(controller: Controller, event: TaskEvent) -> None:
    runtime_of(controller).task_events((event,))


@hookimpl
def xce_task_events(controller: Controller, events: Sequence[TaskEvent]) -> None:
    runtime_of(controller).task_events(events)


@hookimpl
def xce_notify_done(
    controller: Controller, job_id: str, attempt: int, status: int | None, reason: str
) -> None:
    runtime_of(controller).notify_done(job_id, attempt, status, reason)


@hookimpl
def xce_job_start(controller: Controller, job: JobInfo) -> None:
    runtime_of(controller).job_start(job)


@hookimpl
def xce_job_end(controller: Controller, job_id: str) -> None:
    runtime_of(controller).job_end(job_id)


@hookimpl
def xce_host_failed(
    controller: Controller, host: str, lost: Mapping[str, Sequence[int]]
) -> Mapping[str, LossOutcome] | None:
    return runtime_of(controller).host_failed(host, lost)


# accounting


@hookimpl
def xce_acct_usage(controller: Controller, job_id: str, now: float) -> Usage | None:
    return runtime_of(controller).usage(job_id, now)


@hookimpl
def xce_acct_job(controller: Controller, job_id: str) -> JobInfo | None:
    return runtime_of(controller).job_record(job_id)


# REST


@hookimpl
def xce_rest_routes(controller: Controller) -> Sequence[Any]:
    return api.routes(controller)
