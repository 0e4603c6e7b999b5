"""The live controller's metrics, in the Prometheus text format (``GET /metrics``).

One :class:`ControllerMetrics` per controller, with a registry of its own (a process
may run several controllers: the tests do). What it counts is fed from where it
happens, each event at the cost of a counter or a histogram update:

- HTTP requests, from the REST layer's middleware
  (:class:`~xce_resize_plugin.rest.http.RequestContext`): route, method, status and
  duration;
- resize requests and their outcomes, from every ``xce_resize_request`` hook call,
  and notification runs, from the notification runner's answers (it is a
  :class:`~xce_resize_plugin.controllers.observer.LiveObserver`);
- resize phases and how changes end, from the plugin's transitions, and the journal's
  durable writes (it is the controller's
  :class:`~xce_resize_plugin.host.ResizeObserver`, ``resize_observer``).

What is a state rather than an event — slots by host state and per user, pending grows,
changes in flight — is read from the controller when scraped (:class:`StateCollector`),
never updated on every change. docs/operations.md lists every metric with a sample.

``GET /metrics`` (:func:`metrics_route`) answers an administrator's token or the
``[controller] metrics_token``. This module imports prometheus-client (the ``live``
extra): the controller imports it only when it serves metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client import generate_latest as render_metrics
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.process_collector import ProcessCollector
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from xce_resize_plugin.controllers.live.host_routes import HOST_SCHEMAS, fencing
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.observer import LiveObserver
from xce_resize_plugin.controllers.runners import NotificationRequest, NotificationResult
from xce_resize_plugin.core.facts import Committed, Fact
from xce_resize_plugin.core.models import (
    CancelRequest,
    GrowRequest,
    Phase,
    ReleaseRequest,
    ResizeState,
)
from xce_resize_plugin.errors import PermissionDenied, ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest.http import ApiRoute, endpoint
from xce_resize_plugin.rest.operation import Operation

__all__ = ["METRICS", "ControllerMetrics", "StateCollector", "metrics_route"]

METRICS = Operation(
    "metrics",
    "GET",
    "/metrics",
    "The controller's metrics (Prometheus text format)",
    "For an administrator's token or the [controller] metrics_token; the metrics are "
    "listed in docs/operations.md.",
    errors=(401, 403),
)

#: The phases of a change in flight, and the one of a pending grow.
IN_FLIGHT = (
    Phase.GROW_NOTIFYING,
    Phase.GROW_STARTING,
    Phase.SHRINK_NOTIFYING,
    Phase.SHRINK_DRAINING,
    Phase.SHRINK_STOPPING,
)
_BUSY = frozenset((Phase.GROW_PENDING, *IN_FLIGHT))
_KINDS: Mapping[type, str] = {
    GrowRequest: "grow",
    ReleaseRequest: "release",
    CancelRequest: "cancel",
}
# A client chooses the method: only these become label values (the rest "other").
_METHODS = frozenset(("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"))

# Bucket bounds (seconds) for what lasts milliseconds (HTTP default buckets), a
# journal write (an fsync: sub-millisecond to tens of milliseconds), a notification
# command (up to its timeout) and a resize phase (a grow may pend for hours).
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
NOTIFY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
PHASE_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)


class ControllerMetrics(LiveObserver):
    """The metrics of one live controller; :meth:`attach` them before the controller
    opens (see the module docstring)."""

    def __init__(self, ctl: LiveController) -> None:
        self._ctl = ctl
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "xce_http_requests", "HTTP requests answered", ("route", "method", "status"), registry=r
        )
        self.http_seconds = Histogram(
            "xce_http_request_duration_seconds",
            "Time to answer an HTTP request",
            ("route", "method"),
            registry=r,
        )
        self.resize_requests = Counter(
            "xce_resize_requests",
            "Resize requests (xce_resize_request) by kind and outcome (OK or the error code)",
            ("kind", "code"),
            registry=r,
        )
        self.changes = Counter(
            "xce_resize_changes",
            "Allocation changes that ended, by kind and outcome",
            ("kind", "outcome"),
            registry=r,
        )
        self.phase_seconds = Histogram(
            "xce_resize_phase_duration_seconds",
            "Time a job spent in a resize phase, observed when it leaves the phase",
            ("phase",),
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.notifications = Counter(
            "xce_resize_notifications",
            "Notification command runs by result (ok, exit, signal, timeout, error)",
            ("result",),
            registry=r,
        )
        self.notification_seconds = Histogram(
            "xce_resize_notification_duration_seconds",
            "Run time of notification commands that ran",
            buckets=NOTIFY_BUCKETS,
            registry=r,
        )
        self.commit_seconds = Histogram(
            "xce_journal_commit_duration_seconds",
            "Durable write transactions of the resize journal (write and fsync)",
            buckets=COMMIT_BUCKETS,
            registry=r,
        )
        self.fsyncs = Counter("xce_journal_fsyncs", "Durable journal writes (fsyncs)", registry=r)
        self.committed = Counter(
            "xce_journal_committed_entries",
            "Transitions written to the journal (several share an fsync)",
            registry=r,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()
        #: Jobs with a pending grow or a change in flight: their phase and since when.
        self._busy: dict[str, tuple[Phase, float]] = {}
        r.register(StateCollector(ctl, self))
        ProcessCollector(registry=r)

    def attach(self) -> None:
        """Watch the controller: its hook calls and notifications, the plugin's work."""
        self._ctl.resize_observer = self
        self._ctl.add_observer(self)

    def busy_phases(self) -> list[Phase]:
        """The phase of every job with a pending grow or a change in flight."""
        with self._lock:
            return [phase for phase, _ in self._busy.values()]

    # -- HTTP (RequestObserver) ---------------------------------------------------------

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        if method not in _METHODS:
            method = "other"
        self._child(self.http_requests, route, method, str(status)).inc()
        self._child(self.http_seconds, route, method).observe(seconds)

    def _child(self, metric: Counter | Histogram, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once: the lookup costs more than the
        update (several locks and a tuple), and it happens on every request."""
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    # -- the controller (LiveObserver) --------------------------------------------------

    def hook_returned(
        self, name: str, kwargs: Mapping[str, Any], error: BaseException | None
    ) -> None:
        if name != "xce_resize_request":
            return
        kind = _KINDS.get(type(kwargs.get("request")), "other")
        if error is None:
            code = "OK"
        elif isinstance(error, ResizeError) and len(error.code) <= 64:
            code = error.code
        else:
            code = "XCE_INTERNAL"
        self._child(self.resize_requests, kind, code).inc()

    def notification_answered(
        self, request: NotificationRequest, result: NotificationResult
    ) -> None:
        outcome = notification_result(result)
        self._child(self.notifications, outcome).inc()
        if result.status is not None or outcome == "timeout":
            self.notification_seconds.observe(result.elapsed)

    # -- the plugin (ResizeObserver) ----------------------------------------------------

    def resize_transition(
        self, before: ResizeState | None, after: ResizeState, facts: Sequence[Fact]
    ) -> None:
        old = Phase.IDLE if before is None else before.phase
        new = after.phase
        if old is not new or before is None:
            at = facts[-1].at if facts else phase_since(after)
            with self._lock:
                entered = self._busy.pop(after.job_id, None)
                if new in _BUSY:
                    self._busy[after.job_id] = (new, at)
            if before is not None and old in _BUSY:
                since = entered[1] if entered is not None else phase_since(before)
                self._child(self.phase_seconds, old.value).observe(max(0.0, at - since))
        change = None if before is None else before.change
        if change is not None and after.change is None:
            if any(type(fact) is Committed for fact in facts):
                outcome = "committed"
            else:
                outcome = "job_ended" if new is Phase.ENDED else "failed"
            self._child(self.changes, change.kind.value, outcome).inc()

    def journal_committed(self, seconds: float, entries: int) -> None:
        self.commit_seconds.observe(seconds)
        self.fsyncs.inc()
        self.committed.inc(entries)


def notification_result(result: NotificationResult) -> str:
    """``ok``, ``exit`` (a non-zero status), ``signal``, ``timeout``, or ``error`` (it
    could not run or its agent was lost): the label of a notification run."""
    if result.status == 0:
        return "ok"
    if result.status is not None:
        return "signal" if result.reason.startswith("signal") else "exit"
    return "timeout" if result.reason == "timeout" else "error"


def phase_since(state: ResizeState) -> float:
    """When ``state`` entered its phase, as far as the state tells (a state loaded at
    start: the grow's request, or the change's start)."""
    if state.phase is Phase.GROW_PENDING and state.pending is not None:
        return state.pending.requested_at
    if state.change is not None:
        return state.change.since
    return state.started_at


class StateCollector:
    """What the controller holds when scraped: slots by host state (an agent that is
    ready: ``up``, else ``down``), slots per user, pending grows, changes in flight."""

    def __init__(self, ctl: LiveController, metrics: ControllerMetrics) -> None:
        self._ctl = ctl
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        ctl = self._ctl
        hosts = ctl.embedded.hosts_view()
        workers = ctl.fleet.view()
        users = ctl.embedded.users_view()
        yield from _slot_families(hosts, workers)
        in_use = GaugeMetricFamily(
            "xce_user_slots_used", "Slots a user's jobs hold", labels=["user"]
        )
        limit = GaugeMetricFamily(
            "xce_user_slots_limit", "A user's slot limit ([limits] user_slots)", labels=["user"]
        )
        for user, view in users.items():
            in_use.add_metric([user], view["slots_in_use"])
            if user in ctl.cfg.user_slots:
                limit.add_metric([user], ctl.cfg.user_slots[user])
        yield in_use
        yield limit
        phases = self._metrics.busy_phases()
        pending = GaugeMetricFamily("xce_resize_pending_grows", "Grows waiting for slots")
        pending.add_metric([], phases.count(Phase.GROW_PENDING))
        yield pending
        flight = GaugeMetricFamily(
            "xce_resize_changes_in_flight", "Allocation changes in flight", labels=["phase"]
        )
        for phase in IN_FLIGHT:
            flight.add_metric([phase.value], phases.count(phase))
        yield flight


def _slot_families(
    hosts: Mapping[str, Mapping[str, int]], workers: Mapping[str, Mapping[str, Any]]
) -> Iterable[Metric]:
    sums = {state: [0, 0, 0, 0] for state in ("up", "down")}  # hosts, slots, used, free
    for host, view in hosts.items():
        row = sums["up" if workers.get(host, {}).get("ready") else "down"]
        slots, used = view["slots"], view["used"]
        row[0] += 1
        row[1] += slots
        row[2] += used
        row[3] += max(0, slots - used)
    names = (
        ("xce_hosts", "Hosts by state of their worker agent"),
        ("xce_slots_capacity", "Slots of the hosts (total), by host state"),
        ("xce_slots_used", "Slots held by jobs, by host state"),
        ("xce_slots_free", "Slots no job holds, by host state"),
    )
    for i, (name, text) in enumerate(names):
        family = GaugeMetricFamily(name, text, labels=["host_state"])
        for state, row in sums.items():
            family.add_metric([state], row[i])
        yield family


def metrics_route(ctl: LiveController, metrics: ControllerMetrics) -> ApiRoute:
    """``GET /metrics``: for administrators and the ``[controller] metrics_token``; any
    other user's token is refused (403), no or an unknown token too (401)."""
    scrape = ctl.cfg.metrics_token

    def authenticate(token: str | None) -> Principal | None:
        if scrape is not None and token is not None and scrape.matches(token):
            return Principal(scrape.user, admin=True)
        return ctl.authenticate(token)

    async def serve(request: Request, principal: Principal) -> Response:
        if not principal.admin or principal.job_id is not None:
            raise PermissionDenied(
                f"{principal.name} may not read the metrics (administrators and the "
                "metrics token may)"
            )
        body = await run_in_threadpool(render_metrics, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return ApiRoute(METRICS, endpoint(METRICS, serve, authenticate, fencing(ctl)), HOST_SCHEMAS)
