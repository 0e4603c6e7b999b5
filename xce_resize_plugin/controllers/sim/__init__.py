"""The embedded controller: the host side of the plugin contract (docs/host-integration.md).

A small, faithful XCE controller for the demo, the tests, what-if scenarios and trace
simulation: ordered hosts with slots, FCFS + EASY backfill, a discrete event loop in
simulated time, its own state in LMDB, and the host hooks called in XCE's order. The
plugin is reached only through the hooks; nothing in the plugin depends on this
package. The live controller (:mod:`..live.live_controller`) holds one of these, with
its own clock, runners, store and lock injected.

Modules: :mod:`.sim_controller` (:class:`EmbeddedController`, built in layers:
:mod:`.state`, :mod:`.scheduling`, :mod:`.contract`, :mod:`.host_states`,
:mod:`.views`), :mod:`.cluster_view` (the cluster as the plugin sees it), :mod:`.events`
(timeline and plugin event queue), :mod:`.work` (work-based run times),
:mod:`.speedup` (speedup models); shared with the live controller, in
:mod:`xce_resize_plugin.controllers`: :mod:`~..cluster` (hosts, slots, limits),
:mod:`~..jobs` (job records and views), :mod:`~..scheduler` (FCFS + EASY),
:mod:`~..runners` (clock, task and notification runners), :mod:`~..store` (LMDB /
memory), :mod:`~..observer` (what a driver may watch).
"""

from xce_resize_plugin.controllers.cluster import Cluster
from xce_resize_plugin.controllers.jobs import JobView, NotificationLog, VersionRecord
from xce_resize_plugin.controllers.runners import (
    Clock,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    ScriptedNotificationRunner,
    SettableClock,
    SimClock,
    SimTaskRunner,
    SubprocessNotificationRunner,
    TaskFaults,
    TaskReporter,
    TaskRunner,
)
from xce_resize_plugin.controllers.scheduler import Reservation
from xce_resize_plugin.controllers.sim.cluster_view import SimClusterView
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController, parse_tasks
from xce_resize_plugin.controllers.store import LmdbStore, MemoryStore, NullStore, Store
from xce_resize_plugin.controllers.task_records import TaskState
from xce_resize_plugin.controllers.violations import (
    ContractViolation,
    EmbeddedError,
    InvariantViolation,
    SettleLoopError,
    StoreError,
    SubmissionRejected,
    UnknownJob,
)

__all__ = [
    "Clock",
    "Cluster",
    "ContractViolation",
    "EmbeddedController",
    "EmbeddedError",
    "InvariantViolation",
    "JobView",
    "LmdbStore",
    "MemoryStore",
    "NotificationLog",
    "NotificationRequest",
    "NotificationResult",
    "NotificationRunner",
    "NullStore",
    "Reservation",
    "ScriptedNotificationRunner",
    "SettableClock",
    "SettleLoopError",
    "SimClock",
    "SimClusterView",
    "SimTaskRunner",
    "Store",
    "StoreError",
    "SubmissionRejected",
    "SubprocessNotificationRunner",
    "TaskFaults",
    "TaskReporter",
    "TaskRunner",
    "TaskState",
    "UnknownJob",
    "VersionRecord",
    "parse_tasks",
]
