"""What the plugin needs from its host: the controller and cluster protocols.

XCE (or the embedded controller) passes an object satisfying :class:`Controller` to
every host hook. Every method that changes something is idempotent per task id, because
after a failover the plugin re-issues the effects of in-flight changes (docs/failover.md).

Threads: the plugin's REST routes run in request-handler threads and call
``authenticate``, ``get_job``, ``now`` and ``slot_headroom`` there, and the request,
status, usage and authorize hooks (which call the same methods). A host that serves the
routes must make these safe to call concurrently with its scheduler loop — the live
embedded controller takes one lock around its state.

:class:`HostHooks` is the host's side of the hook calls: one typed forwarding method per
host hook of :mod:`xce_resize_plugin.hookspecs`, so that every call site is checked.

A host may also watch the plugin's work (for metrics): a controller object with a
``resize_observer`` attribute holding a :class:`ResizeObserver` is told of every resize
transition and every durable journal write. Without it the plugin does no such work.
Likewise a controller with a ``durable_wait()`` method may let other hook calls run
while a resize request waits for its fsync (:func:`durable_wait`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol, TypeAlias, cast, runtime_checkable

import pluggy

from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.events import JobEvent
from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.core.models import (
    JobInfo,
    LossOutcome,
    Principal,
    ResizeRequest,
    ResizeState,
    Task,
    TaskEvent,
)
from xce_resize_plugin.core.reclaim import QueueHead
from xce_resize_plugin.core.status import ResizeStatus

__all__ = [
    "ClusterView",
    "Controller",
    "Environment",
    "HostHooks",
    "Principal",
    "QueueHead",
    "ResizeObserver",
    "TaskEvent",
    "durable_wait",
    "resize_observer_of",
]

#: Variables the plugin hands to started tasks and notification commands (``XCE_*``,
#: ``LSB_*``); the host adds them to the job's own environment.
Environment: TypeAlias = Mapping[str, str]


@runtime_checkable
class Controller(Protocol):
    """The host controller as the plugin sees it (docs/host-integration.md)."""

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The manager the host calls the hooks through; the plugin calls policies on it."""

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``[resize]`` section of the controller configuration."""

    @property
    def state_dir(self) -> Path:
        """A local directory the plugin owns for its journal (``state_dir/resize``)."""

    def now(self) -> float:
        """The controller clock in seconds (simulated or wall)."""

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal a bearer token stands for (a user's token, or a job's own
        ``XCE_JOB_TOKEN`` with ``job_id`` set), or ``None`` when it is unknown/absent."""

    def get_job(self, job_id: str) -> JobInfo | None:
        """The job's current view, or ``None`` when the host does not know it."""

    def slot_headroom(self, user: str) -> int | None:
        """Slots ``user`` may still take under limits and quotas (``None``: unlimited)."""

    def reserve_slots(self, job_id: str, tasks: Sequence[Task]) -> None:
        """Charge the job for these tasks' slots (limits, quotas, host usage) from now."""

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        """Stop charging the job for these tasks' slots; unknown ids are ignored."""

    def launch_tasks(self, job_id: str, tasks: Sequence[Task], env: Environment) -> None:
        """Start these tasks (already reserved); report through ``xce_task_event``.

        A task id that was launched before is not launched again.
        """

    def stop_tasks(self, job_id: str, task_ids: Sequence[int], grace: float) -> None:
        """SIGTERM, ``grace`` seconds, SIGKILL; report ``exited`` through ``xce_task_event``."""

    def run_notification(
        self, job_id: str, attempt: int, host: str, command: str, env: Environment, timeout: float
    ) -> None:
        """Run ``command`` on ``host`` as the job owner; report via ``xce_notify_done``."""

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        """The job's allocation is now ``tasks``: update its record, env and hostfile."""


@runtime_checkable
class ClusterView(Protocol):
    """The scheduler cycle's free-slot view handed to ``xce_sched_cycle``."""

    def free_slots(self) -> Mapping[str, int]:
        """Free slots per host, in the cluster's host order, as of this cycle."""

    # -- reclaim (docs/host-integration.md, "The blocked queue head") ----------------

    def blocked_head(self) -> QueueHead | None:
        """The job at the head of the queue that the host's pass of this cycle could not
        start for lack of slots (the one its reservation is for), in counts: the tasks
        it needs, its ``ptile``, its expected start, the free slots it may use and the
        running resizable jobs. ``None`` when no job is blocked so (or the host offers
        no reclaim). The plugin reads it only with ``[resize] reclaim = "shrink"``."""


class ResizeObserver(Protocol):
    """What a host may watch of the plugin's work, e.g. to export metrics. Optional: a
    controller offers one as its ``resize_observer`` attribute (see the module
    docstring). Both methods are called on the plugin's hot paths and must be cheap;
    they must not call back into the controller or the plugin."""

    def resize_transition(
        self, before: ResizeState | None, after: ResizeState, facts: Sequence[Fact]
    ) -> None:
        """A job's resize state went from ``before`` to ``after`` through ``facts``, as
        decided (under the plugin's lock, in decision order). At start, each job the
        journal holds live is passed once as ``(None, state, ())``."""

    def journal_committed(self, seconds: float, entries: int) -> None:
        """A durable journal write (one fsync) took ``seconds`` and held ``entries``
        transitions (group commit). Called from the thread that wrote it: the journal's
        writer thread, or a lone request's own thread; never for two writes at once."""


def resize_observer_of(controller: Controller) -> ResizeObserver | None:
    """The controller's :class:`ResizeObserver`, or ``None`` when it offers none."""
    observer = getattr(controller, "resize_observer", None)
    return cast("ResizeObserver | None", observer)


# -- optional: other hook calls while a request waits for its fsync ---------------------


def durable_wait(controller: Controller) -> AbstractContextManager[object]:
    """What the plugin wraps around a resize request's wait for its journal write: the
    controller's ``durable_wait()`` context when it offers one, else nothing.

    A host that holds its own lock around every hook call (the live controller) offers
    it to release that lock while the request's fsync runs, so that concurrent
    requests share one fsync (group commit) instead of taking turns. The plugin enters
    it only when the request's decision is made and queued for the journal, holding no
    lock of its own, and answers only after it exits; the request's facts have no host
    effects. docs/architecture.md, "Concurrency", says what the host must keep.
    """
    method = getattr(controller, "durable_wait", None)
    if method is None:
        return nullcontext()
    return cast("AbstractContextManager[object]", method())


# -- optional: a dispatch cycle at a given time (a drain's deadline) -------------------


def wake_at(controller: Controller, time: float) -> None:
    """Ask the host for a dispatch cycle at ``time`` (a drain's deadline), if it offers
    ``wake_at``. A host that runs its cycles on a clock tick (the live controller, XCE)
    needs nothing: the next cycle after the deadline ends the drain. A host in simulated
    time (the embedded controller) offers it, since its clock jumps from event to event.
    """
    method = getattr(controller, "wake_at", None)
    if method is not None:
        method(time)


#: pluggy's own hook executor, which a hook-call monitor replaces on its manager.
_PLAIN_EXEC = getattr(pluggy.PluginManager("xce-probe"), "_inner_hookexec", None)


def _sole(
    pm: pluggy.PluginManager, caller: pluggy.HookCaller, argnames: tuple[str, ...]
) -> Callable[..., object] | None:
    """The function of ``caller``'s only implementation, when calling it directly with
    ``argnames``, positionally, is exactly what pluggy would do; else ``None``.

    That is: no hook-call monitor on the manager, one implementation, not a wrapper, and
    taking exactly these arguments. pluggy then only calls it and returns or raises
    what it does; its general path costs about 1 µs a call, and a simulation makes
    several million (docs/performance.md). Checked at every call, so a plugin or a
    monitor added at any time is honoured; attributes pluggy might rename only turn
    the shortcut off.
    """
    try:
        if _PLAIN_EXEC is None or pm._inner_hookexec is not _PLAIN_EXEC:
            return None
        impls = caller._hookimpls
    except AttributeError:
        return None
    if len(impls) != 1:
        return None
    impl = impls[0]
    if impl.hookwrapper or impl.wrapper or impl.kwargnames or impl.argnames != argnames:
        return None
    return impl.function


def _call(pm: pluggy.PluginManager, caller: Any, names: tuple[str, ...], *args: object) -> None:
    """Call a hook with ``args`` named ``names`` (a hook whose result the host does not
    use): its only plain implementation directly when that is the same call
    (:func:`_sole`), else through ``pm.hook``."""
    fn = _sole(pm, caller, names)
    if fn is not None:
        fn(*args)
    else:
        caller(**dict(zip(names, args, strict=True)))


_CYCLE = ("controller", "cluster")
_CONTROLLER = ("controller",)
_JOB = ("controller", "job")
_JOB_ID = ("controller", "job_id")
_EVENTS = ("controller", "events")


class HostHooks:
    """The host hooks, called by a host (as tox 4 does around ``pm.hook``).

    One method per host hook of :mod:`xce_resize_plugin.hookspecs`, named without the
    ``xce_`` prefix, with the hook's parameters and its typed result, so that mypy checks
    every call a host makes. Each method forwards to ``pm.hook``: hook-call monitors
    (pluggy's ``add_hookcall_monitoring``, used for tracing, locking and recording) see
    the calls as before. The hooks called per job and per cycle call a hook's only
    plain implementation directly when that is the same call (:func:`_sole`).
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._pm = pm
        self._hook = hook = pm.hook
        self._sched = hook.xce_sched_cycle
        self._dispatch = hook.xce_dispatch_cycle
        self._validate = hook.xce_job_validate
        self._start = hook.xce_job_start
        self._end = hook.xce_job_end
        self._events = hook.xce_task_events

    # -- lifecycle ----------------------------------------------------------------------

    def controller_start(self, controller: Controller) -> None:
        self._hook.xce_controller_start(controller=controller)

    def controller_stop(self, controller: Controller) -> None:
        self._hook.xce_controller_stop(controller=controller)

    # -- submission ---------------------------------------------------------------------

    def job_validate(self, controller: Controller, job: JobInfo) -> None:
        _call(self._pm, self._validate, _JOB, controller, job)

    # -- requests -----------------------------------------------------------------------

    def resize_request(
        self, controller: Controller, principal: Principal, job_id: str, request: ResizeRequest
    ) -> ResizeStatus | None:
        return cast(
            "ResizeStatus | None",
            self._hook.xce_resize_request(
                controller=controller, principal=principal, job_id=job_id, request=request
            ),
        )

    def resize_status(self, controller: Controller, job_id: str) -> ResizeStatus | None:
        return cast(
            "ResizeStatus | None",
            self._hook.xce_resize_status(controller=controller, job_id=job_id),
        )

    def resize_events(
        self, controller: Controller, job_id: str, after: int | None
    ) -> Sequence[JobEvent] | None:
        return cast(
            "Sequence[JobEvent] | None",
            self._hook.xce_resize_events(controller=controller, job_id=job_id, after=after),
        )

    # -- scheduler and dispatch ---------------------------------------------------------

    def sched_cycle(self, controller: Controller, cluster: ClusterView) -> None:
        _call(self._pm, self._sched, _CYCLE, controller, cluster)

    def dispatch_cycle(self, controller: Controller) -> None:
        _call(self._pm, self._dispatch, _CONTROLLER, controller)

    # -- events -------------------------------------------------------------------------

    def task_event(self, controller: Controller, event: TaskEvent) -> None:
        self._hook.xce_task_event(controller=controller, event=event)

    def task_events(self, controller: Controller, events: Sequence[TaskEvent]) -> None:
        _call(self._pm, self._events, _EVENTS, controller, events)

    def notify_done(
        self, controller: Controller, job_id: str, attempt: int, status: int | None, reason: str
    ) -> None:
        self._hook.xce_notify_done(
            controller=controller, job_id=job_id, attempt=attempt, status=status, reason=reason
        )

    def job_start(self, controller: Controller, job: JobInfo) -> None:
        _call(self._pm, self._start, _JOB, controller, job)

    def job_end(self, controller: Controller, job_id: str) -> None:
        _call(self._pm, self._end, _JOB_ID, controller, job_id)

    def host_failed(
        self, controller: Controller, host: str, lost: Mapping[str, Sequence[int]]
    ) -> Mapping[str, LossOutcome] | None:
        return cast(
            "Mapping[str, LossOutcome] | None",
            self._hook.xce_host_failed(controller=controller, host=host, lost=lost),
        )

    # -- accounting and REST ------------------------------------------------------------

    def acct_usage(self, controller: Controller, job_id: str, now: float) -> Usage | None:
        return cast(
            "Usage | None", self._hook.xce_acct_usage(controller=controller, job_id=job_id, now=now)
        )

    def acct_job(self, controller: Controller, job_id: str) -> JobInfo | None:
        return cast("JobInfo | None", self._hook.xce_acct_job(controller=controller, job_id=job_id))

    def rest_routes(self, controller: Controller) -> list[Sequence[Any]]:
        """Every implementation's routes (not firstresult: one list per implementation)."""
        return cast("list[Sequence[Any]]", self._hook.xce_rest_routes(controller=controller))
