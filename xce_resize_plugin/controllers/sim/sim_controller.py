"""The embedded controller: the host side of the plugin contract, on a clock it is given.

:class:`EmbeddedController` satisfies :class:`~xce_resize_plugin.host.Controller` and
calls the host hooks (through :class:`~xce_resize_plugin.host.HostHooks`) the way XCE
does (docs/host-integration.md):

- ``xce_controller_start`` once its own state is loaded (constructor or :meth:`start`);
- ``xce_job_validate`` before a job is accepted (an exception rejects it, no change);
- per scheduling cycle, its own FCFS + EASY pass over the pending jobs, **then**
  ``xce_sched_cycle`` with the free slots left, then ``xce_dispatch_cycle``;
- ``xce_task_events`` / ``xce_notify_done`` for what the plugin started, delivered as
  queued events after the plugin's hook returned, never from inside a call the plugin
  made; task events queued together go in one batch (``xce_task_event`` one at a time
  with ``task_event_batches=False``);
- ``xce_job_end`` after a job's committed allocation has been freed, its tasks stopped
  and its state set; then the job must hold no slot (a checked invariant).

Time is simulated: a discrete event loop (:meth:`run`) moves the clock from instant to
instant; at each instant :meth:`settle` repeats the cycles and delivers events until
nothing changes. Every call that changes state bumps a change counter, which is how
"nothing changes" is detected, and writes the changed records to the store, so a new
controller on the same ``state_dir`` finds jobs, slots, task states and the clock.

What the driver (a test, the demo, the scenario runner) uses: :meth:`submit`,
:meth:`kill`, :meth:`at`, :meth:`run`, :meth:`advance`, :meth:`settle`, the resize
forwarding methods (:meth:`request_resize`, :meth:`resize_status`,
:meth:`acct_usage`), the views (:meth:`jobs`, :meth:`job`, :meth:`hosts_view`,
:meth:`users_view`, :meth:`notifications`, :meth:`check_invariants`) and fault
injection (:attr:`faults`, :meth:`inject_task_exit`), and the host states
(:meth:`host_down`, :meth:`host_up`, :meth:`host_close`, :meth:`host_open`,
:meth:`host_views`).

**One controller, two clocks.** The same class is the live controller's machinery
(:mod:`..live.live_controller` holds one; it never subclasses it). What differs is
injected: the clock, the task and notification runners, the store, the lock taken
around every public entry point (one re-entrant lock shared with the host that holds
this controller), the object handed to the hooks as ``controller`` (the holder, which
forwards the Controller protocol here), and observers (:mod:`..observer`) for what the
holder needs to see: job starts and ends, task reports, notification outcomes,
scheduler cycles. A holder reads job records through :meth:`record` and
:meth:`records`, and writes through the public methods only.
"""

from __future__ import annotations

import bisect
import logging
import math
import operator
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar

import pluggy

from xce_resize_plugin.controllers.cluster import Cluster, HostState
from xce_resize_plugin.controllers.hosts import HOST_FAILURE, HostDrain, HostFailure, HostView
from xce_resize_plugin.controllers.jobs import (
    JobOptions,
    JobRecord,
    JobView,
    NotificationLog,
    TaskRecord,
    TaskState,
    TaskStates,
    VersionRecord,
    job_id_key,
    submit_keywords,
)
from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.controllers.pending_queue import PendingQueue
from xce_resize_plugin.controllers.runners import (
    InRunner,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    SettableClock,
    SimClock,
    SimTaskRunner,
    SubprocessNotificationRunner,
    TaskFaults,
    TaskRunner,
    start_many_of,
    stop_many_of,
)
from xce_resize_plugin.controllers.scheduler import (
    PendingJob,
    Reservation,
    RunningJob,
    easy_pass,
    empty_capacity,
)
from xce_resize_plugin.controllers.sim.cluster_view import SimClusterView, offered_total
from xce_resize_plugin.controllers.sim.events import EventQueue, NotifyDone, Timeline
from xce_resize_plugin.controllers.sim.work import JobWork
from xce_resize_plugin.controllers.store import LmdbStore, MemoryStore, NullStore, Store
from xce_resize_plugin.controllers.violations import (
    ContractViolation,
    EmbeddedError,
    HostStateError,
    InvariantViolation,
    SettleLoopError,
    SubmissionRejected,
    UnknownHost,
    UnknownJob,
)
from xce_resize_plugin.core.allocations import as_kept
from xce_resize_plugin.core.models import (
    GrowHosts,
    JobInfo,
    JobState,
    LossOutcome,
    ReleaseRequest,
    Task,
)
from xce_resize_plugin.core.reclaim import QueueHead
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Controller, HostHooks, Principal, TaskEvent

if TYPE_CHECKING:
    from xce_resize_plugin.core.accounting import Usage
    from xce_resize_plugin.core.models import ResizeRequest
    from xce_resize_plugin.core.status import ResizeStatus

log = logging.getLogger(__name__)

HostSpec = Mapping[str, int] | Sequence[tuple[str, int]]
TasksSpec = int | str | tuple[int, int]

#: Task states whose process may still be alive.
_LIVE = (TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING)
_STOPPABLE = (TaskState.STARTING, TaskState.RUNNING)


_third = operator.itemgetter(2)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _exit_all(records: MutableMapping[int, TaskRecord], now: float, reason: str) -> None:
    """:func:`_exit_tasks` for all of a job's task records (those never made at once:
    see :class:`~xce_resize_plugin.controllers.jobs.TaskStates`)."""
    if isinstance(records, TaskStates):
        _exit_tasks(records.exit_live(now, reason, _LIVE), now, reason)
    else:
        _exit_tasks(records.values(), now, reason)


def _exit_tasks(records: Iterable[TaskRecord], now: float, reason: str) -> None:
    """Mark the live ones of these task records exited now (their processes are gone)."""
    for rec in records:
        if rec.state in _LIVE:
            rec.state = TaskState.EXITED
            rec.since = now
            rec.reason = reason
            rec.stop_since = rec.grace = None


def _lost(job: JobRecord, task_id: int) -> bool:
    """Whether the task went with a failed host: a job that a host failure ends keeps
    it in its allocation, unheld, while its processes elsewhere are stopped (see
    ``loss_ender``)."""
    rec = job.task_states.get(task_id)
    return rec is not None and rec.state is TaskState.EXITED and rec.reason == HOST_FAILURE


def parse_tasks(spec: TasksSpec) -> tuple[int, int]:
    """``-n`` as bsub takes it: ``4`` -> (4, 4), ``"2,8"`` / ``(2, 8)`` -> (2, 8)."""
    if isinstance(spec, bool):
        raise SubmissionRejected(f"bad task count {spec!r}")
    if isinstance(spec, int):
        return spec, spec
    if isinstance(spec, tuple):
        lo, hi = spec
        return int(lo), int(hi)
    parts = str(spec).split(",")
    try:
        if len(parts) == 1:
            n = int(parts[0])
            return n, n
        if len(parts) == 2:
            return int(parts[0]), int(parts[1])
    except ValueError:
        pass
    raise SubmissionRejected(f"bad task count {spec!r} (expected N or MIN,MAX)")


def _open_store(
    store: Literal["lmdb", "memory", "none"] | Store, state_dir: Path, durable: bool
) -> Store:
    """The ``store`` argument as a store (see :class:`EmbeddedController`)."""
    if store == "lmdb":
        return LmdbStore(state_dir / "embedded", durable=durable)
    if store == "memory":
        return MemoryStore()
    if store == "none":
        return NullStore()
    if isinstance(store, str):
        raise ValueError(f"unknown store {store!r} (lmdb, memory or none)")
    return store


def _task_bounds(n: TasksSpec | None, pairs: tuple[tuple[str, int], ...] | None) -> tuple[int, int]:
    """``-n`` as ``(min, max)``; without it 1, or the size of ``alloc``."""
    if n is None:
        n = sum(c for _, c in pairs) if pairs else 1
    return parse_tasks(n)


def _alloc_pairs(
    alloc: Mapping[str, int] | Sequence[tuple[str, int]] | None,
) -> tuple[tuple[str, int], ...] | None:
    """``submit(alloc=...)`` as ``((host, tasks), ...)`` in allocation order."""
    if alloc is None:
        return None
    return tuple(
        (str(h), int(c)) for h, c in (alloc.items() if isinstance(alloc, Mapping) else alloc)
    )


#: What a blocked head is told of the cluster: free slots per host, the hosts out of
#: service, the resizable running jobs above their minimum and the slots they hold
#: above it (``QueueHead``'s fields).
_HeadSlots = tuple[Mapping[str, int], frozenset[str], tuple[str, ...], int]
#: The blocked head's description kept with what it was made of: the ledger's part, the
#: job's queue view, the reservation's job and shadow time with the free total.
_KeptHead = tuple[_HeadSlots, PendingJob, tuple[str, float, int], QueueHead]


def _nothing() -> None:
    """A timeline entry that only makes the controller cycle at its instant."""


class EmbeddedController:
    """A small, faithful XCE controller in simulated time (see the module docstring).

    :param plugin_manager: the manager the hooks are called through (with or without
        the resize plugin registered; with none, hooks return ``None``/``[]``).
    :param state_dir: the controller's state directory: its own state in
        ``state_dir/embedded``, the plugin's journal in ``state_dir/resize``.
    :param hosts: host name -> slots, in host order. May be omitted when restarting on
        an existing ``state_dir`` (the saved hosts are used).
    :param config: the ``[resize]`` section handed to the plugin.
    :param user_slots: per-user slot limits (``[limits] user_slots``).
    :param store: ``"lmdb"`` (default), ``"memory"``, ``"none"`` (no persistence, for
        long traces), or a :class:`Store` object (pass the same :class:`MemoryStore` to
        a new controller to restart from it).
    :param durable: fsync every LMDB write (set ``False`` for long simulations).
    :param clock: the simulated clock (default: a new :class:`SimClock` at 0, or the
        saved time on restart).
    :param task_runner: default :class:`SimTaskRunner` with ``faults``.
    :param notification_runner: default :class:`SubprocessNotificationRunner`.
    :param faults: fault injection for the default task runner.
    :param strict: raise :class:`InvariantViolation` when a job still holds slots after
        ``xce_job_end`` (tests); otherwise the slots are reclaimed and the problem is
        kept for :meth:`check_invariants` (production).
    :param protect_reservation: offer the plugin only slots the blocked queue head does
        not need (see :class:`SimClusterView`); default ``False``: all free slots.
    :param settle_cap: cycles per instant before :class:`SettleLoopError`.
    :param autostart: call :meth:`start` from the constructor.
    :param tokens: bearer token -> :class:`Principal` for :meth:`authenticate` (user
        tokens and job tokens alike; the simulated controller issues none itself).
    :param lean_cycles: end an instant after a cycle in which only the host's own pass
        changed something (see :meth:`settle`); default ``False``: one more cycle, as
        XCE does. Trace simulations set it: it halves the hook calls per instant.
    :param keep_finished: keep finished jobs' records (default). ``False`` drops a job's
        record once its end was reported (and observers told), so that a trace of
        hundreds of thousands of jobs does not keep them all: :meth:`job`,
        :meth:`get_job` and :meth:`jobs` then no longer know it. Their ids stay taken.
    :param task_event_batches: deliver the task events queued together in one
        ``xce_task_events`` call (default), or each in its own ``xce_task_event`` call
        (``False``), as a host that gets them one at a time would.
    :param lock: the lock taken around every public entry point (default: a new
        re-entrant lock). A host that holds this controller and serves other threads
        passes its own re-entrant lock, the one it takes around its own state.
    :param hook_controller: the object the hooks get as ``controller`` (default: this
        controller). A host that holds this controller passes itself; it must forward the
        Controller protocol here.
    :param resume_tasks: on restart, resume the task processes the saved records
        describe (default): stops in progress are handed to the task runner again, and
        launches a crash interrupted (tasks saved STARTING) are reported as failed.
        ``False`` leaves both to the host holding this controller, which can find out
        what became of them (the live controller asks its agents).
    :param loss_ender: who ends a job that a host failure ends (``EXIT``) or requeues,
        called with the job id and the outcome instead of ending it at once (default:
        at once). A host whose jobs have processes on other hosts passes its own: it
        stops them first, then calls :meth:`kill` or :meth:`requeue` (the live
        controller); until then the job runs on, its lost tasks exited and unheld.
    """

    def __init__(
        self,
        plugin_manager: pluggy.PluginManager,
        state_dir: str | Path,
        hosts: HostSpec | None = None,
        *,
        config: Mapping[str, Any] | None = None,
        user_slots: Mapping[str, int] | None = None,
        store: Literal["lmdb", "memory", "none"] | Store = "lmdb",
        durable: bool = True,
        clock: SettableClock | None = None,
        task_runner: TaskRunner | None = None,
        notification_runner: NotificationRunner | None = None,
        faults: TaskFaults | None = None,
        strict: bool = False,
        protect_reservation: bool = False,
        settle_cap: int = 1000,
        autostart: bool = True,
        tokens: Mapping[str, Principal] | None = None,
        keep_finished: bool = True,
        lean_cycles: bool = False,
        task_event_batches: bool = True,
        lock: AbstractContextManager[Any] | None = None,
        hook_controller: Controller | None = None,
        resume_tasks: bool = True,
        loss_ender: Callable[[str, LossOutcome], None] | None = None,
    ) -> None:
        self._pm = plugin_manager
        self._loss_ender = loss_ender
        self._hooks = HostHooks(plugin_manager)
        self._host: Controller = hook_controller if hook_controller is not None else self
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.RLock()
        self._resume_tasks = resume_tasks
        # A report made inside a call to the task runner answers it ("sync").
        self._in_runner = InRunner()
        self.task_event_batches = task_event_batches
        self._state_dir = Path(state_dir)
        self._state_dir.mkdir(parents=True, exist_ok=True)
        self._work_dir = self._state_dir / "embedded-work"
        self._store = _open_store(store, self._state_dir, durable)
        # Nothing to save: skip building records for a store that drops them (a trace
        # simulation would spend a good part of its time there).
        self._persist = not isinstance(self._store, NullStore)
        self.keep_finished = keep_finished
        self.lean_cycles = lean_cycles
        self._observers: list[Observer] = []
        self._on_submit: list[Callable[[str, float], None]] = []
        self._on_start: list[Callable[[str, float, Sequence[Task]], None]] = []
        self._on_commit: list[Callable[[str, float, Sequence[Task], int], None]] = []
        self._on_ending: list[Callable[[str, float, JobState, str], None]] = []
        self._on_end: list[Callable[[FinishedJob], None]] = []
        self._on_task: list[Callable[[TaskEvent, bool], None]] = []
        self._on_answer: list[Callable[[NotificationRequest, NotificationResult], None]] = []
        self._on_cycles: list[Callable[[float], None]] = []
        self._on_cycled: list[Callable[[float, bool], None]] = []
        self._on_settled: list[Callable[[EmbeddedController], None]] = []
        self._on_host: list[Callable[[str, float, str, bool, Principal | None], None]] = []
        try:
            self._setup(hosts, config, user_slots, clock, task_runner, notification_runner, faults)
        except BaseException:
            # Do not leave the environment open: py-lmdb refuses a second handle in
            # this process, so a corrected retry would fail for the wrong reason.
            self._store.close()
            raise
        self.strict = strict
        self.protect_reservation = protect_reservation
        self.settle_cap = settle_cap
        self.tokens: dict[str, Principal] = dict(tokens or {})
        self._hook_depth = 0
        self._started = False
        #: While the plugin starts: slots its resume asserted on failed hosts.
        self._resumed_losses: dict[str, dict[str, set[int]]] | None = None
        self._closed = False
        if autostart:
            self.start()

    def _setup(
        self,
        hosts: HostSpec | None,
        config: Mapping[str, Any] | None,
        user_slots: Mapping[str, int] | None,
        clock: SettableClock | None,
        task_runner: TaskRunner | None,
        notification_runner: NotificationRunner | None,
        faults: TaskFaults | None,
    ) -> None:
        """Load the saved state and build everything on it (constructor, part two)."""
        snapshot = self._store.load()
        saved: Mapping[str, Any] = snapshot.meta if snapshot else {}

        if hosts is None:
            if "hosts" not in saved:
                raise ValueError("hosts are required for a new state directory")
            hosts = [(str(h), int(n)) for h, n in saved["hosts"]]
        if user_slots is None:
            user_slots = dict(saved.get("user_slots", {}))
        if config is None:
            config = dict(saved.get("config", {}))
        self._config: Mapping[str, Any] = MappingProxyType(dict(config))
        self._cluster = Cluster(hosts, user_slots)
        self._restore_host_states(saved)

        self._clock: SettableClock = clock if clock is not None else SimClock()
        if "clock" in saved and saved["clock"] > self._clock.now():
            self._clock.advance_to(float(saved["clock"]))
        self._next_id = int(saved.get("next_job_id", 101))
        self._runner: TaskRunner = task_runner if task_runner is not None else SimTaskRunner(faults)
        self._runner.bind(self)
        self._start_many, self._stop_many = start_many_of(self._runner), stop_many_of(self._runner)
        self._notifier: NotificationRunner = (
            notification_runner
            if notification_runner is not None
            else SubprocessNotificationRunner()
        )

        self._jobs: dict[str, JobRecord] = {}
        # Ids of finished jobs whose records were dropped (keep_finished=False).
        self._forgotten: set[str] = set()
        self._work: dict[str, JobWork] = {}
        # Per running job, the generation of its scheduled end: a job whose end moved
        # (work-based run time) leaves a stale timeline entry that must do nothing.
        self._end_gen: dict[str, int] = {}
        self._capacity: dict[int | None, int] = {}
        self._init_schedule()
        self._future: dict[str, JobRecord] = {}
        self._timeline = Timeline()
        self._events = EventQueue()
        self._changes = 0
        self._instant = 0
        self._round = 0
        self._problems: list[str] = []
        self._rejections: list[tuple[float, str, str]] = []
        self._dirty: set[str] = set()
        self._meta_dirty = True
        self._saved_clock = self._clock.now()
        self._closed = False  # _flush() below checks it
        if snapshot is not None:
            self._restore(snapshot.jobs)
        self._flush()

    def _init_schedule(self) -> None:
        """The scheduler's views of the queue and the running jobs, and what the last
        pass left (constructor, part three)."""
        self._pending_views: dict[str, PendingJob] = {}
        # The queue: the pending views by submit time, then job id, read by a pass as
        # they are, and a deep queue by blocks (.pending_queue).
        self._queue_views: PendingQueue[PendingJob] = PendingQueue()
        self._running: dict[str, JobRecord] = {}
        self._running_views: dict[str, RunningJob] = {}
        # The same views ordered by planned end, kept sorted as jobs start, change and
        # end, so that computing the head's reservation needs no sort (jobs without a
        # planned end never release anything and are left out).
        self._by_end: list[tuple[float, str, RunningJob]] = []
        self._views_epoch = 0
        self._res_known: tuple[Reservation, int, int, float] | None = None
        self._head_kept: tuple[int, _HeadSlots] | None = None
        self._queue_head_kept: _KeptHead | None = None
        self._queue_epoch = 0
        self._last_pass: tuple[int, int, float] | None = None
        self._reservation: Reservation | None = None
        self._taken_at_pass = 0

    # =================================================================================
    # the Controller protocol (what the plugin sees)
    # =================================================================================

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

    def authenticate(self, token: str | None) -> Principal | None:
        return self.tokens.get(token) if token else None

    def get_job(self, job_id: str) -> JobInfo | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else job.info()

    def slot_headroom(self, user: str) -> int | None:
        with self._lock:
            return self._cluster.headroom(user)

    def reserve_slots(self, job_id: str, tasks: Sequence[Task]) -> None:
        with self._lock:
            job = self._job(job_id)
            if job.state is not JobState.RUN:
                raise ContractViolation(
                    f"reserve_slots: job {job_id} is {job.state.value}, not RUN"
                )
            wanted = list(tasks)
            if self._resumed_losses is not None:
                wanted = self._lost_before_restart(job_id, wanted)
            if self._cluster.reserve(job_id, wanted):
                self._changed(job_id)
            self._flush()

    def _lost_before_restart(self, job_id: str, tasks: list[Task]) -> list[Task]:
        """The plugin's resume asserts again the slots a job holds; those on a failed
        host were lost in a host failure a crash left unsettled: they are kept for
        :meth:`_resettle_down_hosts` to settle (the plugin is told it lost them), not
        charged on a host that has no slots to give. The others are returned."""
        down = self._cluster.failed_hosts()
        if not down:
            return tasks
        failed = set(down)
        losses = self._resumed_losses
        assert losses is not None
        for task in tasks:
            if task.host in failed:
                losses.setdefault(task.host, {}).setdefault(job_id, set()).add(task.id)
        return [t for t in tasks if t.host not in failed]

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        with self._lock:
            self._job(job_id)
            if self._cluster.free(job_id, list(task_ids)):
                self._changed(job_id)
            self._flush()

    def launch_tasks(self, job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        with self._lock:
            job = self._job(job_id)
            held = self._cluster.held_view(job_id)
            # The tasks to start go to the runner together (it may report them as one
            # start), sent before anything else is answered, in the order given.
            batch: list[Task] = []
            for task in tasks:
                rec = job.task_states.get(task.id)
                if rec is not None:
                    self._start_batch(job_id, batch, env)
                    if rec.host != task.host:
                        raise ContractViolation(
                            f"launch_tasks: job {job_id} task {task.id} is on {rec.host}, "
                            f"not {task.host}"
                        )
                    self._rereport(job_id, task.id, rec)
                    continue
                if job.state is not JobState.RUN:
                    self._start_batch(job_id, batch, env)
                    job.task_states[task.id] = TaskRecord(
                        task.host, TaskState.FAILED, self.now(), reason="job not running"
                    )
                    self._changed(job_id)
                    self._events.put(
                        TaskEvent(job_id, task.id, "start_failed", None, "job not running")
                    )
                    continue
                if held.get(task.id) != task.host:
                    self._start_batch(job_id, batch, env)
                    raise ContractViolation(
                        f"launch_tasks: job {job_id} task {task.id} on {task.host} is not reserved"
                    )
                job.task_states[task.id] = TaskRecord(task.host, TaskState.STARTING, self.now())
                self._changed(job_id)
                batch.append(task)
            self._start_batch(job_id, batch, env)
            self._flush()

    def _start_batch(self, job_id: str, batch: list[Task], env: Mapping[str, str]) -> None:
        """Send the tasks gathered so far to the runner (and empty the list)."""
        if batch:
            with self._in_runner:
                self._start_many(job_id, tuple(batch), env)
            batch.clear()

    def stop_tasks(self, job_id: str, task_ids: Sequence[int], grace: float) -> None:
        with self._lock:
            job = self._job(job_id)
            # A release stops thousands of tasks of a large job at one instant: what
            # does not change from task to task is looked up once.
            get, now, stop_many, put = (
                job.task_states.get,
                self.now(),
                self._stop_many,
                self._events.put,
            )
            stopping = False
            # The tasks to stop go to the runner together (it may report them as one
            # exit); a task already gone is answered in its place in the order given.
            batch: list[int] = []
            with self._in_runner:
                for tid in task_ids:
                    rec = get(tid)
                    if rec is not None and rec.state in _STOPPABLE:
                        rec.state = TaskState.STOPPING
                        rec.stop_since = now
                        rec.grace = grace
                        stopping = True
                        batch.append(tid)
                        continue
                    if rec is not None and rec.state is TaskState.STOPPING:
                        continue  # its exit will be reported
                    if batch:
                        stop_many(job_id, batch, grace, now)
                        batch = []
                    if rec is None:
                        put(TaskEvent(job_id, tid, "exited", None, "no such task"))
                    else:
                        put(TaskEvent(job_id, tid, "exited", rec.status, rec.reason))
                if batch:
                    stop_many(job_id, batch, grace, now)
            if stopping:
                self._changed(job_id)
            self._flush()

    def run_notification(
        self,
        job_id: str,
        attempt: int,
        host: str,
        command: str,
        env: Mapping[str, str],
        timeout: float,
    ) -> None:
        with self._lock:
            job = self._job(job_id)
            self._changed(job_id)  # notification started
            request = NotificationRequest(
                job_id, attempt, host, command, dict(env), timeout, self._work_dir / job_id
            )
            if job.finished:
                self._notification_done(
                    request, self.now(), NotificationResult(None, "job finished")
                )
            else:
                self._notifier.run(
                    request, partial(self._notification_answered, request, self.now())
                )
            self._flush()

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        with self._lock:
            job = self._job(job_id)
            # A list in id order does not change (its contract): kept as it is, so that
            # the host's own list (a slice of it) is compared run by run below.
            new = as_kept(tasks)
            if job.state is not JobState.RUN:
                # A commit re-issued after the job ended changes nothing any more.
                log.info("commit_allocation v%s for %s job %s ignored", version, job.state, job_id)
                return
            if version <= job.version:
                if version == job.version and new != job.tasks:
                    raise ContractViolation(
                        f"commit_allocation: job {job_id} version {version} committed "
                        "twice with different tasks"
                    )
                return  # a re-issue after a failover
            if not new:
                raise ContractViolation(f"commit_allocation: job {job_id}: empty allocation")
            listed = self._cluster.as_held(job_id, new)
            if listed is not None:
                new = listed  # equal, and read as runs from now on
            elif (task := self._cluster.not_held(job_id, new)) is not None:
                raise ContractViolation(
                    f"commit_allocation: job {job_id} task {task.id} on {task.host} is not reserved"
                )
            resized = len(new) != len(job.tasks)
            job.tasks = new
            job.version = version
            job.versions.append(VersionRecord(version, self.now(), new))
            self._changed(job_id)
            work = self._work.get(job_id)
            if work is not None and resized:
                # A work-based job runs at another speed from now on: its end moves.
                self._schedule_end(job, work.resize(self.now(), len(new)))
                self._update_running_view(job)
            for fn in self._on_commit:
                fn(job_id, self.now(), new, version)
            self._flush()

    # =================================================================================
    # TaskReporter (what the task runner calls back on)
    # =================================================================================

    def at(self, time: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` at simulated ``time`` (not before now) from the event loop.

        Callbacks are inputs of the driver and are not saved: after a restart they
        must be registered again.
        """
        with self._lock:
            if time < self.now():
                raise ValueError(f"at({time}): the clock is already at {self.now()}")
            self._timeline.at(time, fn)

    def wake_at(self, time: float) -> None:
        """A cycle at simulated ``time`` (a drain's deadline; ``host.wake_at``): the
        clock jumps from event to event, so the plugin asks for the instant its
        dispatch must see. Re-asked by the plugin after a restart (its resume)."""
        with self._lock:
            if time > self.now():
                self._timeline.at(time, _nothing)

    def task_started(self, job_id: str, task_id: int) -> None:
        self.tasks_started(job_id, (task_id,))

    def tasks_started(self, job_id: str, task_ids: Sequence[int]) -> None:
        with self._lock:
            get = self._records_if_running(job_id)
            if get is None:
                return
            now = self.now()
            started: list[int] = []
            for tid in task_ids:
                rec = get(tid)
                if rec is None or rec.state is not TaskState.STARTING:
                    continue  # (STARTING is live: anything else is a stale report)
                rec.state = TaskState.RUNNING
                rec.since = now
                started.append(tid)
            if started:
                self._changed(job_id)
                # One run of alike starts (core/task_events.py), not an event per task.
                self._reported(TaskEventRun(job_id, tuple(started), "started"))

    def task_start_failed(self, job_id: str, task_id: int, reason: str) -> None:
        with self._lock:
            rec = self._live_task(job_id, task_id)
            if rec is None or rec.state is not TaskState.STARTING:
                return
            rec.state = TaskState.FAILED
            rec.since = self.now()
            rec.reason = reason
            self._changed(job_id)
            self._reported(TaskEvent(job_id, task_id, "start_failed", None, reason))

    def task_exited(self, job_id: str, task_id: int, status: int | None, reason: str) -> None:
        self.tasks_exited(job_id, (task_id,), status, reason)

    def tasks_exited(
        self, job_id: str, task_ids: Sequence[int], status: int | None, reason: str
    ) -> None:
        with self._lock:
            get = self._records_if_running(job_id)
            if get is None:
                return
            now = self.now()
            # The exits are reported as runs of tasks alike (core/task_events.py): the
            # tasks a release stopped together are one run, not an event each.
            alike: list[int] = []
            was_stopped = False
            for tid in task_ids:
                rec = get(tid)
                if rec is None or rec.state not in _LIVE:
                    continue  # no process that may still be alive: a stale report
                # Whether the host had asked it to stop (a release, the job's end): a
                # release_exited job drops only tasks that ended on their own.
                stopped = rec.state is TaskState.STOPPING
                rec.state = TaskState.EXITED
                rec.since = now
                rec.status = status
                rec.reason = reason
                rec.stop_since = rec.grace = None
                if alike and stopped is not was_stopped:
                    self._reported(
                        TaskEventRun(job_id, tuple(alike), "exited", status, reason, was_stopped)
                    )
                    alike = []
                elif not alike:
                    self._changed(job_id)
                alike.append(tid)
                was_stopped = stopped
            if alike:
                self._reported(
                    TaskEventRun(job_id, tuple(alike), "exited", status, reason, was_stopped)
                )

    def _records_if_running(self, job_id: str) -> Callable[[int], TaskRecord | None] | None:
        """How to look up the job's task records, ``None`` once the job has ended (its
        end took its tasks down: a report about them is stale)."""
        job = self._jobs.get(job_id)
        if job is None or job.finished:
            return None
        return job.task_states.get

    def _live_task(self, job_id: str, task_id: int) -> TaskRecord | None:
        """The task's record if its process may still be alive (reports about tasks the
        job's end already took down are stale and dropped)."""
        job = self._jobs.get(job_id)
        if job is None or job.finished:
            return None
        rec = job.task_states.get(task_id)
        return rec if rec is not None and rec.state in _LIVE else None

    def _rereport(self, job_id: str, task_id: int, rec: TaskRecord) -> None:
        """Tell the plugin again what became of a task it launches a second time."""
        if rec.state in (TaskState.RUNNING, TaskState.STOPPING):
            self._events.put(TaskEvent(job_id, task_id, "started"))
        elif rec.state is TaskState.EXITED:
            self._events.put(TaskEvent(job_id, task_id, "exited", rec.status, rec.reason))
        elif rec.state is TaskState.FAILED:
            self._events.put(TaskEvent(job_id, task_id, "start_failed", None, rec.reason))
        # STARTING: the runner's report is still to come.

    def _runner_stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        with self._in_runner:
            self._runner.stop(job_id, task_id, grace, since)

    def _reported(self, event: TaskEvent | TaskEventRun) -> None:
        """Queue a runner's report for the plugin, and tell the observers (each event
        of a run in turn)."""
        self._events.put(event)
        if self._on_task:
            sync = bool(self._in_runner)
            for one in event if isinstance(event, TaskEventRun) else (event,):
                for fn in self._on_task:
                    fn(one, sync)

    def _notification_answered(
        self, request: NotificationRequest, started: float, result: NotificationResult
    ) -> None:
        """The notification runner's answer: observers first, then the bookkeeping."""
        for fn in self._on_answer:
            fn(request, result)
        self._notification_done(request, started, result)

    def _notification_done(
        self, request: NotificationRequest, started: float, result: NotificationResult
    ) -> None:
        job = self._jobs[request.job_id]
        job.notifications.append(
            NotificationLog(
                request.job_id,
                request.attempt,
                request.host,
                request.command,
                started,
                result.status,
                result.reason,
                result.stdout,
                result.stderr,
                result.elapsed,
            )
        )
        self._changed(request.job_id)
        self._events.put(NotifyDone(request.job_id, request.attempt, result.status, result.reason))

    # =================================================================================
    # lifecycle
    # =================================================================================

    def start(self) -> None:
        """Call ``xce_controller_start``, then report job ends a crash left unreported."""
        with self._lock:
            if self._started:
                return
            self._top_level("start")
            self._started = True
            resumed: dict[str, dict[str, set[int]]] = {}
            self._resumed_losses = resumed  # filled while the plugin resumes its jobs
            try:
                self._hook(self._hooks.controller_start, self._host)
            finally:
                self._resumed_losses = None
            for job in self._ordered_jobs():
                if job.finished and not job.end_reported:
                    self._report_end(job)
            # Starts first: the plugin must know a job before it hears of its lost tasks.
            self._report_running_starts()
            self._resettle_down_hosts(resumed)
            self._flush()

    def stop(self) -> None:
        """A clean stop: ``xce_controller_stop``, then close the store."""
        with self._lock:
            self._top_level("stop")
            if self._started:
                self._hook(self._hooks.controller_stop, self._host)
                self._started = False
            self.close()

    def close(self) -> None:
        """Release the store without calling any hook (what a crash leaves behind)."""
        with self._lock:
            if not self._closed:
                self._flush()
                self._closed = True
                self._store.close()

    # =================================================================================
    # driver inputs
    # =================================================================================

    def submit_job(self, user: str, n: TasksSpec, options: JobOptions, **extra: Any) -> str:
        """:meth:`submit` with the job's options from one object (``extra``: the other
        keywords of :meth:`submit`, e.g. ``runtime``, ``env``, ``job_id``)."""
        return self.submit(user, n, **submit_keywords(options), **extra)

    def submit(
        self,
        user: str,
        n: TasksSpec | None = None,
        *,
        runtime: float | None = None,
        estimate: float | None = None,
        ptile: int | None = None,
        resizable: bool = False,
        autoresize: bool = False,
        grow_hosts: GrowHosts | str = GrowHosts.PREFER_EXISTING,
        notify_cmd: str | None = None,
        env: Mapping[str, str] | None = None,
        alloc: Mapping[str, int] | Sequence[tuple[str, int]] | None = None,
        job_id: str | None = None,
        submit_time: float | None = None,
        start_tasks: int | None = None,
        initial_tasks: int | None = None,
        work: JobWork | None = None,
        release_exited: bool = False,
        grace: float = 0.0,
    ) -> str:
        """Submit a job; return its id.

        :param n: ``-n``: ``4``, ``"2,8"`` or ``(2, 8)``; default 1 (or ``alloc``'s size).
        :param runtime: simulated seconds from start to DONE (``None``: until killed).
        :param estimate: the user's runtime estimate, used by backfilling if given.
        :param autoresize: LSF's ``bsub -ar``: the plugin grows the job toward
            ``max_tasks`` whenever slots free up; implies ``resizable``.
        :param alloc: start at arrival on exactly these hosts (``{host: tasks}`` in
            allocation order), bypassing the queue; rejected if it does not fit.
        :param job_id: the id (default: the next free number from 101).
        :param submit_time: arrival time (default now). A later time schedules the
            arrival: validation happens then, and a rejection is recorded in
            :attr:`rejections` instead of raised.
        :param start_tasks: the most tasks the scheduler starts the job with while
            other jobs wait (default ``max_tasks``); slots nobody waits for may take the
            start up to ``max_tasks`` (see :class:`~.scheduler.PendingJob`), and a
            resizable job may grow there later. Trace simulations start a malleable job
            at its recorded size this way.
        :param initial_tasks: the most tasks the job starts with, even when more are
            free (``xce-resize submit --initial``); between ``min`` and ``max``.
        :param work: a :class:`~.work.JobWork` deciding the job's end from the sizes it
            runs at (:mod:`.work`; without it: ``runtime``). Not saved in the store.
        :param grace: the job's default drain time for its releases (``--grace``).

        Raises :class:`SubmissionRejected` (the host's checks) or whatever
        ``xce_job_validate`` raised; nothing changes then.
        """
        with self._lock:
            self._top_level("submit")
            now = self.now()
            arrival = now if submit_time is None else float(submit_time)
            if arrival < now:
                raise SubmissionRejected(f"submit time {arrival} is before now ({now})")
            pairs = _alloc_pairs(alloc)
            min_tasks, max_tasks = _task_bounds(n, pairs)
            record = JobRecord(
                id=self._claim_id(job_id),
                user=user,
                min_tasks=min_tasks,
                max_tasks=max_tasks,
                submit_time=arrival,
                runtime=runtime,
                estimate=estimate,
                ptile=ptile,
                # Autoresizable implies resizable (bsub -ar).
                resizable=resizable or autoresize,
                autoresize=autoresize,
                grow_hosts=GrowHosts(grow_hosts),
                notify_cmd=notify_cmd,
                env=dict(env or {}),
                alloc=pairs,
                start_tasks=start_tasks,
                initial_tasks=initial_tasks,
                release_exited=release_exited,
                grace=float(grace),
            )
            self._admit(record, work, now)
            return record.id

    def kill(self, job_id: str, reason: str = "killed") -> bool:
        """End a job as EXIT (``bkill``); ``False`` if it had already finished.

        The job's slots are freed and ``xce_job_end`` is called at once; like every
        input, the scheduler uses the freed slots at the next :meth:`settle` /
        :meth:`run`. A job whose arrival is still scheduled is simply not submitted.
        """
        with self._lock:
            self._top_level("kill")
            if self._future.pop(job_id, None) is not None:
                return True
            job = self._job(job_id)
            if job.finished:
                return False
            self._end_job(job, JobState.EXIT, reason)
            return True

    def finish(self, job_id: str, reason: str = "done") -> bool:
        """End a running job as DONE now, as if its last task had exited normally;
        ``False`` if it had already finished.

        For drivers whose jobs end on outside events rather than a runtime (replaying a
        recorded run). A job still pending ends too, without having run.
        """
        with self._lock:
            self._top_level("finish")
            job = self._job(job_id)
            if job.finished:
                return False
            self._end_job(job, JobState.DONE, reason)
            return True

    def add_observer(self, observer: Observer) -> None:
        """Watch job starts, commits and ends, and act at each settled instant.

        Only the callbacks the observer overrides are called (see :mod:`.observer`).
        """
        with self._lock:
            self._observers.append(observer)
            targets: tuple[tuple[str, list[Any]], ...] = (
                ("job_submitted", self._on_submit),
                ("job_started", self._on_start),
                ("allocation_committed", self._on_commit),
                ("job_ending", self._on_ending),
                ("job_ended", self._on_end),
                ("task_reported", self._on_task),
                ("notification_answered", self._on_answer),
                ("cycles_started", self._on_cycles),
                ("cycles_ended", self._on_cycled),
                ("settled", self._on_settled),
                ("host_changed", self._on_host),
            )
            for name, target in targets:
                if getattr(type(observer), name) is not getattr(Observer, name):
                    target.append(getattr(observer, name))

    def inject_task_exit(
        self, job_id: str, task_id: int, status: int | None = 1, reason: str = "task failed"
    ) -> None:
        """Fault injection: a task's process dies on its own (reported as ``exited``;
        its slot stays charged, as on a real host, until someone frees it)."""
        with self._lock:
            self._top_level("inject_task_exit")
            job = self._job(job_id)
            rec = job.task_states.get(task_id)
            if rec is None or rec.state not in _LIVE:
                raise ValueError(f"job {job_id} task {task_id} is not running")
            self.task_exited(job_id, task_id, status, reason)
            self._flush()

    @property
    def faults(self) -> TaskFaults:
        """The simulated task runner's fault injection (start failures, stop delays)."""
        if not isinstance(self._runner, SimTaskRunner):
            raise TypeError("fault injection needs the simulated task runner")
        return self._runner.faults

    # =================================================================================
    # hosts: states, failures, drains (docs/admin-guide.md, "Host states")
    # =================================================================================

    def host_views(self) -> list[HostView]:
        """Every host, in host order: state, slots, used, and the jobs on it."""
        with self._lock:
            return [self.host_view(name) for name in self._cluster.hosts]

    def host_view(self, name: str) -> HostView:
        """One host's view; :class:`UnknownHost` for a name the cluster does not have."""
        with self._lock:
            state = self._host_state(name)
            on = self._cluster.jobs_on(name)
            jobs = {j: on[j] for j in sorted(on, key=job_id_key)}
            slots = self._cluster.hosts[name]
            return HostView(name, state, slots, self._cluster.used(name), jobs)

    def host_down(self, name: str) -> HostFailure:
        """The host failed (an injected failure, or a live host whose agent was lost).

        The host becomes ``unavail``: nothing is placed on it until :meth:`host_up`.
        Every task on it is gone: marked exited and its slot freed now; then the plugin
        says per job (``xce_host_failed``) whether the job shrank, ends ``EXIT`` (reason
        ``host failure``) or is requeued, and the controller does so. Raises
        :class:`UnknownHost`, or :class:`HostStateError` for a host already down;
        nothing changes then.
        """
        with self._lock:
            self._top_level("host_down")
            if self._host_state(name) is HostState.UNAVAIL:
                raise HostStateError(f"host {name} is already unavail")
            now = self.now()
            self._host_event(name, "down")
            self._cluster.set_down(name, True)
            self._hosts_changed()
            lost = self._lose_tasks(name, now)
            answers = self._hook(self._hooks.host_failed, self._host, name, lost) or {}
            outcomes: dict[str, LossOutcome] = {}
            for job_id in lost:
                outcomes[job_id] = self._settle_loss(self._jobs[job_id], name, answers.get(job_id))
            self._flush()
            return HostFailure(name, now, lost, outcomes)

    def host_up(self, name: str) -> None:
        """A failed host is back: it takes tasks again (closed again if it was closed
        before it failed). :class:`HostStateError` if it is not down."""
        with self._lock:
            self._top_level("host_up")
            if self._host_state(name) is not HostState.UNAVAIL:
                raise HostStateError(f"host {name} is {self._host_state(name).value}, not unavail")
            self._host_event(name, "up")
            self._cluster.set_down(name, False)
            self._hosts_changed()
            self._flush()

    def host_close(
        self, name: str, evacuate: bool = False, principal: Principal | None = None
    ) -> HostDrain:
        """Close the host to new tasks; the tasks on it go on (a drain).

        With ``evacuate``, every running resizable job with tasks there whose task 0 is
        elsewhere and that keeps at least ``min_tasks`` without them is asked to release
        them through the normal release path (``xce_resize_request`` as ``principal``,
        default an administrator): the notification command may veto it. A job with a
        pending grow or a change in flight is not asked. The others finish there.
        A down host may be closed (it comes back closed). :class:`HostStateError` if it
        is closed already; nothing changes then.
        """
        with self._lock:
            self._top_level("host_close")
            self._host_state(name)
            if self._cluster.is_closed(name):
                raise HostStateError(f"host {name} is already closed")
            who = principal if principal is not None else Principal("xce-admin", admin=True)
            self._host_event(name, "closed", evacuate, who if evacuate else None)
            self._cluster.set_closed(name, True)
            self._hosts_changed()
            drain = HostDrain(name, self.now())
            if evacuate:
                drain = self._evacuate(name, who)
            self._flush()
            return drain

    def host_open(self, name: str) -> None:
        """Open a closed host to new tasks again. :class:`HostStateError` if it is not
        closed."""
        with self._lock:
            self._top_level("host_open")
            self._host_state(name)
            if not self._cluster.is_closed(name):
                raise HostStateError(f"host {name} is not closed")
            self._host_event(name, "open")
            self._cluster.set_closed(name, False)
            self._hosts_changed()
            self._flush()

    def _host_event(
        self, name: str, state: str, evacuate: bool = False, principal: Principal | None = None
    ) -> None:
        """Tell the observers (a recording) of an accepted host command, before its
        effects, so that a replay applies it at the same point."""
        for observe in self._on_host:
            observe(name, self.now(), state, evacuate, principal)

    def _host_state(self, name: str) -> HostState:
        try:
            return self._cluster.host_state(name)
        except KeyError:
            raise UnknownHost(f"no host {name!r}") from None

    def _closed_hosts(self) -> set[str]:
        return {h for h in self._cluster.hosts if self._cluster.is_closed(h)}

    def _hosts_changed(self) -> None:
        self._changes += 1
        self._views_epoch += 1  # running jobs' slots on the host no longer count
        self._meta_dirty = True

    def _lose_tasks(self, name: str, now: float) -> dict[str, tuple[int, ...]]:
        """Every task on the failed host: its process is gone and its slot free now."""
        cluster = self._cluster
        lost: dict[str, tuple[int, ...]] = {}
        for job_id in sorted(cluster.jobs_on(name), key=job_id_key):
            ids = tuple(cluster.held_on(job_id, name))
            lost[job_id] = ids
            states = self._jobs[job_id].task_states
            _exit_tasks((states[t] for t in ids if t in states), now, HOST_FAILURE)
            cluster.free(job_id, ids)
            self._changed(job_id)
        return lost

    def _resettle_down_hosts(self, resumed: Mapping[str, Mapping[str, set[int]]]) -> None:
        """After a restart: a host failure the crash interrupted is settled again for
        the jobs that still have committed tasks on a failed host, or whose slots there
        the plugin's resume asserted (``resumed``: host -> job -> task ids; see
        :meth:`_lost_before_restart`). ``xce_host_failed`` is idempotent for the jobs the
        plugin had already settled."""
        cluster = self._cluster
        for name in cluster.failed_hosts():
            asserted = resumed.get(name, {})
            lost = {
                job.id: tuple(
                    sorted(
                        {t.id for t in job.tasks if t.host == name} | asserted.get(job.id, set())
                    )
                )
                for job in self._ordered_jobs()
                if job.state is JobState.RUN
                and (job.id in asserted or any(t.host == name for t in job.tasks))
            }
            if not lost:
                continue
            for job_id, ids in lost.items():
                cluster.free(job_id, ids)
            answers = self._hook(self._hooks.host_failed, self._host, name, lost) or {}
            for job_id in lost:
                self._settle_loss(self._jobs[job_id], name, answers.get(job_id))

    def _settle_loss(self, job: JobRecord, host: str, answer: LossOutcome | None) -> LossOutcome:
        """Act on the plugin's answer for one job of a host failure."""
        if job.finished:
            return LossOutcome.EXIT
        kept = answer in (LossOutcome.SHRUNK, LossOutcome.KEPT)
        if kept and any(t.host == host for t in job.tasks):
            # The plugin kept tasks the host took with it: the job cannot go on.
            self._problems.append(f"job {job.id}: answered {answer} but kept tasks on {host}")
            kept = False
        if kept:
            assert answer is not None
            self._update_running_view(job)
            return answer
        outcome = LossOutcome.REQUEUE if answer is LossOutcome.REQUEUE else LossOutcome.EXIT
        if self._loss_ender is not None:
            self._loss_ender(job.id, outcome)
        elif outcome is LossOutcome.REQUEUE:
            self._requeue_job(job)
        else:
            self._end_job(job, JobState.EXIT, HOST_FAILURE)
        return outcome

    def requeue(self, job_id: str) -> bool:
        """Put a running job back in the queue after a host failure the plugin answered
        ``requeue`` (for a :class:`loss_ender <EmbeddedController>` that stopped its
        processes first); ``False`` if it is not running."""
        with self._lock:
            self._top_level("requeue")
            job = self._job(job_id)
            if job.state is not JobState.RUN:
                return False
            for fn in self._on_ending:
                fn(job.id, self.now(), JobState.PEND, HOST_FAILURE)
            self._requeue_job(job)
            self._flush()
            return True

    def _requeue_job(self, job: JobRecord) -> None:
        """Put a running job back in the queue (its place: its submit time); it starts
        again from scratch. No ``xce_job_end``: the plugin ended the run's state."""
        _exit_all(job.task_states, self.now(), "requeued")
        self._cluster.free_job(job.id)
        self._running.pop(job.id, None)
        self._drop_running_view(job.id)
        self._end_gen[job.id] = self._end_gen.get(job.id, 0) + 1  # its end is void
        job.state = JobState.PEND
        job.start_time = None
        job.tasks = ()
        job.version = 0
        job.requeued = True
        self._enqueue(job)
        self._changed(job.id)

    def _evacuate(self, name: str, principal: Principal) -> HostDrain:
        """Ask the resizable jobs on the closed host ``name`` to release their tasks there."""
        asked: dict[str, tuple[int, ...]] = {}
        stays: dict[str, str] = {}
        for job_id in sorted(self._cluster.jobs_on(name), key=job_id_key):
            job = self._jobs[job_id]
            there = tuple(t.id for t in job.tasks if t.host == name)
            why = self._why_stays(job, name, len(there))
            if why is None:
                request = ReleaseRequest(hosts={name: None})
                try:
                    self._hook(self._hooks.resize_request, self._host, principal, job_id, request)
                except ResizeError as exc:
                    why = f"release refused: {exc.text}"
            if why is None:
                asked[job_id] = there
            else:
                stays[job_id] = why
        self._changes += 1
        return HostDrain(name, self.now(), asked, stays)

    def _why_stays(self, job: JobRecord, name: str, there: int) -> str | None:
        """Why a job on a closed host is not asked to release its tasks there (``None``:
        it is asked)."""
        if job.state is not JobState.RUN or not job.resizable:
            return "not resizable: finishes there"
        if not there:
            return "only a change in flight there"
        if job.tasks[0].host == name:
            return "task 0 is there: finishes there"
        if len(job.tasks) - there < job.min_tasks:
            return f"would go below min_tasks {job.min_tasks}: finishes there"
        return None

    # -- the resize command paths (what REST / bresize reach in XCE) ------------------

    def request_resize(
        self, principal: Principal, job_id: str, request: ResizeRequest
    ) -> ResizeStatus | None:
        """Forward a grow, release or cancel to ``xce_resize_request``."""
        with self._lock:
            self._top_level("request_resize")
            # A request changes the plugin's state even when the host sees no call back (a
            # grow pends until the next scheduler cycle): count it, so that a driver acting
            # at a settled instant gets the cycles that place it.
            self._changes += 1
            return self._hook(self._hooks.resize_request, self._host, principal, job_id, request)

    def resize_status(self, job_id: str) -> ResizeStatus | None:
        """``xce_resize_status`` for a job."""
        with self._lock:
            self._top_level("resize_status")
            return self._hook(self._hooks.resize_status, self._host, job_id)

    def acct_usage(self, job_id: str) -> Usage | None:
        """``xce_acct_usage`` for a job up to now (the plugin's ``Usage``)."""
        with self._lock:
            self._top_level("acct_usage")
            return self._hook(self._hooks.acct_usage, self._host, job_id, self.now())

    # =================================================================================
    # time
    # =================================================================================

    def settle(self) -> None:
        """Cycle until nothing changes at this instant.

        One cycle: the host's FCFS + EASY pass, ``xce_sched_cycle``,
        ``xce_dispatch_cycle``, then delivery of the queued plugin events. A cycle that
        changed nothing ends the instant. With :attr:`lean_cycles`, so does a cycle in
        which only the host's pass changed something: the plugin's hooks have already
        seen the state after that pass and left it alone, and the pass itself would
        decide nothing new (the next one is skipped as unchanged), so another cycle
        would repeat the same calls on the same state. :attr:`settle_cap` cycles raise
        :class:`SettleLoopError` (a plugin that keeps changing something).

        Observers see ``cycles_started`` before the first cycle and ``cycles_ended``
        after the last (not when a cycle raised).
        """
        with self._lock:
            self._top_level("settle")
            t = self.now()
            for fn in self._on_cycles:
                fn(t)
            before = self._changes
            self._cycle_until_settled()
            for fn2 in self._on_cycled:
                fn2(t, self._changes != before)

    def _cycle_until_settled(self) -> None:
        for _ in range(self.settle_cap):
            before = self._changes
            self._host_pass()
            after_pass = self._changes
            self._hook(
                self._hooks.sched_cycle,
                self._host,
                SimClusterView(
                    self._cluster,
                    self._reservation if self.protect_reservation else None,
                    self._taken_at_pass,
                    head=self.queue_head,
                ),
            )
            self._hook(self._hooks.dispatch_cycle, self._host)
            self._deliver()
            if self._changes == before:
                return
            if self.lean_cycles and self._changes == after_pass and self._pass_current():
                return
        raise SettleLoopError(
            f"t={self.now()}: still changing after {self.settle_cap} cycles "
            f"({len(self._events)} events queued)"
        )

    def run(self, until: float | None = None) -> None:
        """The discrete event loop: settle now, then jump from instant to instant
        (arrivals, job ends, task exits, :meth:`at` callbacks), settling after each,
        up to ``until`` inclusive (the clock ends at ``until``) or until nothing is
        scheduled any more (``until=None``)."""
        with self._lock:
            self._top_level("run")
            if until is not None and until < self.now():
                raise ValueError(f"run(until={until}): the clock is already at {self.now()}")
            self._settle_observed()
            timeline = self._timeline
            while True:
                t = timeline.next_time()
                if t is None or (until is not None and t > until):
                    break
                self._advance_clock(t)
                self._instant += 1
                for fn in timeline.pop_at(t):
                    fn()
                self._flush()
                self._settle_observed()
            if until is not None and until > self.now():
                self._advance_clock(until)
                self._instant += 1
                self._settle_observed()

    def _settle_observed(self) -> None:
        """Settle, then let observers act on the settled instant; settle again after
        anything they changed, until they change nothing."""
        self.settle()
        if not self._on_settled:
            return
        for round_ in range(self.settle_cap):
            self._round = round_
            before = self._changes
            for fn in self._on_settled:
                fn(self)
            if self._changes == before:
                return
            self.settle()
        raise SettleLoopError(
            f"t={self.now()}: observers still changing after {self.settle_cap} rounds"
        )

    def _pass_current(self) -> bool:
        """Whether the host's next pass would be skipped as unchanged."""
        if not self._queue_views:
            return True
        return self._last_pass == (self._cluster.free_epoch, self._queue_epoch, self.now())

    def advance(self, seconds: float) -> None:
        """:meth:`run` for ``seconds`` of simulated time."""
        self.run(until=self.now() + seconds)

    def _advance_clock(self, t: float) -> None:
        self._clock.advance_to(t)
        if self._persist:
            self._meta_dirty = True
            self._flush()

    # =================================================================================
    # views
    # =================================================================================

    def jobs(self) -> list[JobView]:
        """Every known job, in queue order (submit time, then job id)."""
        with self._lock:
            return [job.view(self._cluster.held(job.id)) for job in self._ordered_jobs()]

    def job(self, job_id: str) -> JobView:
        with self._lock:
            job = self._job(job_id)
            return job.view(self._cluster.held(job_id))

    def hosts_view(self) -> dict[str, dict[str, int]]:
        """``{host: {"slots": n, "used": m}}`` in host order."""
        with self._lock:
            return {
                host: {"slots": slots, "used": self._cluster.used(host)}
                for host, slots in self._cluster.hosts.items()
            }

    def users_view(self) -> dict[str, dict[str, int]]:
        """``{user: {"slots_in_use": n}}`` for users holding slots or with a limit."""
        with self._lock:
            in_use = self._cluster.users_in_use()
            users = sorted(set(in_use) | set(self._cluster.user_limits))
            return {u: {"slots_in_use": in_use.get(u, 0)} for u in users}

    def notifications(self, job_id: str | None = None) -> list[NotificationLog]:
        """Notification runs with their output: one job's, or all in job order."""
        with self._lock:
            if job_id is not None:
                return list(self._job(job_id).notifications)
            return [n for job in self._ordered_jobs() for n in job.notifications]

    @property
    def rejections(self) -> list[tuple[float, str, str]]:
        """``(time, job_id, reason)`` of scheduled arrivals that were rejected."""
        return list(self._rejections)

    @property
    def reservation(self) -> Reservation | None:
        """The blocked queue head's reservation as of the last scheduler pass."""
        return self._reservation

    @property
    def instant(self) -> int:
        """How many instants :meth:`run` has processed (0: none yet; the settle at
        the start of a run belongs to the instant before). Observers use it with
        :attr:`settle_round` to say exactly when something happened."""
        return self._instant

    @property
    def settle_round(self) -> int:
        """Which call of the observers' ``settled`` this is, within the instant."""
        return self._round

    @property
    def pending_count(self) -> int:
        """Jobs waiting in the queue, now."""
        return len(self._queue_views)

    @property
    def free_slot_count(self) -> int:
        """Slots free on all hosts together, now."""
        return self._cluster.free_total

    def offered_slot_count(self) -> int:
        """How many free slots the plugin's next scheduler cycle would be offered: all
        free slots, or with :attr:`protect_reservation` and a blocked queue head only
        those the head does not need at its shadow time (see :class:`SimClusterView`)."""
        res = self._reservation if self.protect_reservation else None
        return offered_total(self._cluster, res, self._taken_at_pass)

    @property
    def changes(self) -> int:
        """The change counter (bumped by every state-changing call)."""
        return self._changes

    @property
    def queued_events(self) -> int:
        """Plugin events waiting for delivery."""
        return len(self._events)

    @property
    def next_time(self) -> float | None:
        """The next scheduled instant (``None``: nothing scheduled)."""
        return self._timeline.next_time()

    def check_invariants(self) -> list[str]:
        """Problems found now, plus those recorded earlier (empty list: all good).

        Checked: no slot held and no live task on an ``unavail`` host; no host over its
        slots and the ledger's counters consistent (per host
        and per user); pending and finished jobs hold no slot; a running job's
        committed allocation is held, starts with task 0, stays within
        ``min_tasks..max_tasks`` and respects ``ptile`` (held slots per host); every
        live task process runs on a slot its job holds; finished jobs have no live
        task.
        """
        with self._lock:
            problems = list(self._problems)
            problems.extend(self._cluster.check())
            problems.extend(self._down_host_problems())
            for job in self._ordered_jobs():
                held = self._cluster.held(job.id)
                if job.state is not JobState.RUN:
                    if held:
                        problems.append(
                            f"job {job.id} is {job.state.value} but holds {len(held)} slot(s)"
                        )
                    live = [tid for tid, r in job.task_states.items() if r.state in _LIVE]
                    if live:
                        problems.append(f"job {job.id} is {job.state.value} with live tasks {live}")
                    continue
                if not job.tasks or job.tasks[0].id != 0:
                    problems.append(f"job {job.id}: allocation does not start with task 0")
                # A release_exited job runs on below its minimum when tasks exited
                # (docs/in-job-api.md, "Readiness and exits").
                low = len(job.tasks) < job.min_tasks and not job.release_exited
                if low or len(job.tasks) > job.max_tasks:
                    problems.append(
                        f"job {job.id}: {len(job.tasks)} tasks outside "
                        f"{job.min_tasks}..{job.max_tasks}"
                    )
                for task in job.tasks:
                    if held.get(task.id) != task.host and not _lost(job, task.id):
                        problems.append(f"job {job.id}: committed task {task.id} is not held")
                if job.ptile is not None:
                    for host, n in self._cluster.job_host_counts(job.id).items():
                        if n > job.ptile:
                            problems.append(
                                f"job {job.id}: {n} slots on {host} > ptile {job.ptile}"
                            )
                for tid, rec in job.task_states.items():
                    if rec.state in _LIVE and held.get(tid) != rec.host:
                        problems.append(
                            f"job {job.id}: task {tid} is {rec.state.value} without a held slot"
                        )
            return problems

    def _down_host_problems(self) -> list[str]:
        """A failed host holds no slot and runs no task (from the failure instant on)."""
        cluster = self._cluster
        down = [h for h in cluster.hosts if cluster.host_state(h) is HostState.UNAVAIL]
        out = [
            f"host {h} is unavail but {cluster.used(h)} slot(s) are held"
            for h in down
            if cluster.used(h)
        ]
        for job in self._running.values():
            for tid, rec in job.task_states.items():
                if rec.host in down and rec.state in _LIVE:
                    out.append(
                        f"job {job.id}: task {tid} is {rec.state.value} on unavail {rec.host}"
                    )
        return out

    # -- for a host that holds this controller (the live controller) and recorders -----

    def record(self, job_id: str) -> JobRecord | None:
        """The job's own record (``None``: unknown, or forgotten). Read it only: jobs
        change through this controller's methods, which keep the ledger, the queue and
        the store in step."""
        with self._lock:
            return self._jobs.get(job_id)

    def records(self) -> list[JobRecord]:
        """Every known job's record, in the order the controller took them (see
        :meth:`record`)."""
        with self._lock:
            return list(self._jobs.values())

    def flush(self) -> None:
        """Write what changed to the store now (the reporter methods leave that to
        their caller, so that a batch of reports is one write)."""
        with self._lock:
            self._flush()

    # =================================================================================
    # internals: jobs
    # =================================================================================

    def _job(self, job_id: str) -> JobRecord:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}")
        return job

    def _ordered_jobs(self) -> list[JobRecord]:
        return sorted(self._jobs.values(), key=lambda j: (j.submit_time, job_id_key(j.id)))

    def _allocate_id(self) -> str:
        while (
            str(self._next_id) in self._jobs
            or str(self._next_id) in self._future
            or str(self._next_id) in self._forgotten
        ):
            self._next_id += 1
        job_id = str(self._next_id)
        self._next_id += 1
        self._meta_dirty = True
        return job_id

    def _claim_id(self, job_id: str | None) -> str:
        """The new job's id: the one asked for if it is free, else the next number."""
        if job_id is None:
            return self._allocate_id()
        if job_id in self._jobs or job_id in self._future or job_id in self._forgotten:
            raise SubmissionRejected(f"job id {job_id} is already in use")
        return str(job_id)

    def _admit(self, record: JobRecord, work: JobWork | None, now: float) -> None:
        """Accept a submitted job now, or schedule its arrival at its submit time."""
        if work is not None:
            self._work[record.id] = work
        if record.submit_time > now:
            self._future[record.id] = record
            self._timeline.at(record.submit_time, partial(self._arrive, record.id))
        else:
            self._accept(record)

    def _arrive(self, job_id: str) -> None:
        record = self._future.pop(job_id, None)
        if record is None:
            return  # killed before it arrived
        try:
            self._accept(record)
        except Exception as exc:  # any validation error rejects, as for submit()
            self._rejections.append((self.now(), job_id, f"{type(exc).__name__}: {exc}"))
            log.info("job %s rejected at arrival: %s", job_id, exc)

    def _accept(self, record: JobRecord) -> None:
        """Validate and admit an arriving job (queue it, or start it on its ``alloc``)."""
        try:
            self._hook(self._hooks.job_validate, self._host, record.info())
            placement = self._host_checks(record)
        except BaseException:
            self._work.pop(record.id, None)  # rejected: it will never run
            raise
        self._jobs[record.id] = record
        self._cluster.register_job(record.id, record.user)
        self._changed(record.id)
        for fn in self._on_submit:
            fn(record.id, self.now())
        if placement is not None:
            self._start_job(record, placement)
        else:
            self._enqueue(record)
        self._flush()
        if placement is not None:
            self._report_start(record)

    def _host_checks(self, job: JobRecord) -> tuple[tuple[str, int], ...] | None:
        """The host's own submission checks; return the explicit placement if any."""
        if not job.user:
            raise SubmissionRejected("a job needs a user")
        if job.min_tasks < 1 or job.min_tasks > job.max_tasks:
            raise SubmissionRejected(f"bad task range {job.min_tasks},{job.max_tasks}")
        if job.ptile is not None and job.ptile < 1:
            raise SubmissionRejected(f"bad ptile {job.ptile}")
        for name, value in (("runtime", job.runtime), ("estimate", job.estimate)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise SubmissionRejected(f"bad {name} {value}")
        for name, size in (("start_tasks", job.start_tasks), ("initial", job.initial_tasks)):
            if size is not None and not job.min_tasks <= size <= job.max_tasks:
                raise SubmissionRejected(
                    f"{name} {size} outside the job's {job.min_tasks},{job.max_tasks}"
                )
        limit = self._cluster.user_limits.get(job.user)
        if not self._can_ever_fit(job.min_tasks, job.ptile, limit):
            raise SubmissionRejected(
                f"job {job.id} can never start: {job.min_tasks} task(s)"
                + (f" with ptile {job.ptile}" if job.ptile else "")
                + f" on {self._cluster.capacity} slot(s)"
                + (f" under user {job.user}'s limit of {limit}" if limit is not None else "")
            )
        if job.alloc is None:
            return None
        total = 0
        for host, count in job.alloc:
            if not self._cluster.has_host(host):
                raise SubmissionRejected(f"alloc: unknown host {host!r}")
            if not self._cluster.takes_tasks(host):
                state = self._cluster.host_state(host).value
                raise SubmissionRejected(f"alloc: host {host} is {state}: no new tasks")
            if count < 1:
                raise SubmissionRejected(f"alloc: bad task count {count} on {host}")
            if job.ptile is not None and count > job.ptile:
                raise SubmissionRejected(f"alloc: {count} tasks on {host} exceed ptile {job.ptile}")
            free = self._cluster.free_on(host)
            if count > free:
                raise SubmissionRejected(
                    f"alloc does not fit: {count} tasks on {host}, {free} free"
                )
            total += count
        if len({h for h, _ in job.alloc}) != len(job.alloc):
            raise SubmissionRejected("alloc: a host is listed twice")
        if not job.min_tasks <= total <= job.max_tasks:
            raise SubmissionRejected(
                f"alloc has {total} tasks, outside {job.min_tasks}..{job.max_tasks}"
            )
        headroom = self._cluster.headroom(job.user)
        if headroom is not None and total > headroom:
            raise SubmissionRejected(
                f"alloc does not fit: user {job.user} may take {headroom} more slot(s)"
            )
        return job.alloc

    def _can_ever_fit(self, min_tasks: int, ptile: int | None, limit: int | None) -> bool:
        """Whether the job could start on the empty cluster (else it would pend
        forever). The empty cluster's capacity is kept per ``ptile``: hosts never change
        while the controller runs, and a workload of jobs of thousands of sizes must
        not walk every host at each submission."""
        if limit is not None and limit < min_tasks:
            return False
        cap = self._capacity.get(ptile)
        if cap is None:
            cap = self._capacity[ptile] = empty_capacity(self._cluster.hosts, ptile)
        return cap >= min_tasks

    @staticmethod
    def _queue_key(job: JobRecord) -> tuple[float, tuple[int, int, str]]:
        return (job.submit_time, job_id_key(job.id))

    def _enqueue(self, job: JobRecord) -> None:
        view = self._pending_views[job.id] = self._pending_view(job)
        self._queue_views.add(self._queue_key(job), view)
        self._queue_epoch += 1

    def _dequeue(self, job: JobRecord) -> None:
        if self._queue_views.remove(self._queue_key(job), job.id):
            del self._pending_views[job.id]
            self._queue_epoch += 1

    def _start_job(self, job: JobRecord, placement: Sequence[tuple[str, int]]) -> None:
        """Start ``job``: tasks 0..n-1 in allocation order, charged and running now."""
        now = self.now()
        tasks = self._cluster.allocate(job.id, placement)
        self._dequeue(job)
        job.state = JobState.RUN
        job.start_time = now
        job.tasks = tasks
        job.version = 0
        job.versions = [VersionRecord(0, now, tasks)]
        job.task_states = TaskStates(tasks, TaskState.RUNNING, now)  # records on first use
        self._running[job.id] = job
        work = self._work.get(job.id)
        self._schedule_end(job, work.start(now, len(tasks)) if work is not None else None)
        self._update_running_view(job)
        self._changed(job.id)
        for fn in self._on_start:
            fn(job.id, now, tasks)

    def _schedule_end(self, job: JobRecord, end: float | None = None) -> None:
        """(Re)schedule the job's end: at ``end`` when its work model gave one, else
        at start + runtime. An earlier scheduled end of the job becomes a no-op."""
        if end is None and job.id not in self._work:
            end = job.planned_end()
        gen = self._end_gen.get(job.id, 0) + 1
        self._end_gen[job.id] = gen
        if end is not None:
            self._timeline.at(max(end, self.now()), partial(self._end_due, job.id, gen))

    def _end_due(self, job_id: str, gen: int = 0) -> None:
        job = self._jobs.get(job_id)
        if job is None or job.state is not JobState.RUN:
            return
        if gen and gen != self._end_gen.get(job_id):
            return  # the end moved (the job was resized since)
        self._end_job(job, JobState.DONE, "done")

    def _expected_end(self, job: JobRecord) -> float | None:
        """The end the scheduler plans a running job with."""
        work = self._work.get(job.id)
        return work.expected_end() if work is not None else job.expected_end()

    def _end_job(self, job: JobRecord, state: JobState, reason: str) -> None:
        """Free the committed allocation, stop the tasks, set the state, then tell the
        plugin (``xce_job_end``) and check that the job holds nothing any more."""
        now = self.now()
        for fn in self._on_ending:
            fn(job.id, now, state, reason)
        was_pending = job.state is JobState.PEND
        job.state = state
        job.end_time = now
        job.exit_reason = reason
        _exit_all(job.task_states, now, "job ended")
        if was_pending:
            self._dequeue(job)
        cluster = self._cluster
        if cluster.held_count(job.id) == len(job.tasks):
            # Nothing in flight (a grow would hold more, a shrink fewer, and only one
            # change is in flight at a time): exactly the committed tasks are held.
            cluster.release_all(job.id)
        else:
            cluster.free(job.id, [t.id for t in job.tasks])
        self._running.pop(job.id, None)
        self._drop_running_view(job.id)
        self._changed(job.id)
        self._flush()
        self._report_end(job)

    def _report_start(self, job: JobRecord) -> None:
        """``xce_job_start``, once the start is saved (a crash in between is made good
        by :meth:`_report_running_starts` at the next start)."""
        if job.state is JobState.RUN:
            self._hook(self._hooks.job_start, self._host, job.info())

    def _report_running_starts(self) -> None:
        """After ``xce_controller_start``: every running job's start again, for the
        plugin to pick up one whose report a crash lost (it ignores the others)."""
        for job in list(self._running.values()):
            self._report_start(job)

    def _report_end(self, job: JobRecord) -> None:
        self._hook(self._hooks.job_end, self._host, job.id)
        leftover = self._cluster.held(job.id)
        job.end_reported = True
        self._changed(job.id)
        if leftover:
            problem = (
                f"job {job.id} still held {len(leftover)} slot(s) after xce_job_end: "
                + ", ".join(f"{tid}@{host}" for tid, host in leftover.items())
            )
            self._problems.append(problem)
            # Reclaim them so the simulation goes on with a correct ledger; the leak is
            # on record for check_invariants().
            self._cluster.free_job(job.id)
            self._flush()
            if self.strict:
                raise InvariantViolation(problem)
            log.warning("%s", problem)
        self._flush()
        self._end_gen.pop(job.id, None)
        self._work.pop(job.id, None)
        if self._on_end and job.end_time is not None:
            finished = FinishedJob(
                job.id,
                job.user,
                job.state,
                job.min_tasks,
                job.max_tasks,
                job.submit_time,
                job.start_time,
                job.end_time,
                tuple(job.versions),
                job.exit_reason,
            )
            for fn in self._on_end:
                fn(finished)
        if not self.keep_finished:
            del self._jobs[job.id]
            self._cluster.forget_job(job.id)
            self._forgotten.add(job.id)

    # =================================================================================
    # internals: scheduling and delivery
    # =================================================================================

    def _host_pass(self) -> None:
        """The host's FCFS + EASY pass, skipped when neither the queue nor the free
        slots nor the clock changed since the last one (it would decide the same)."""
        if not self._queue_views:
            self._reservation = None
            return
        sig = (self._cluster.free_epoch, self._queue_epoch, self.now())
        if sig == self._last_pass:
            return
        now = self.now()
        cluster = self._cluster
        # On counts (see .scheduler): the pass costs in proportion to the queue it reads
        # and the hosts of the jobs it starts, not to the number of hosts.
        result = easy_pass(
            now,
            self._queue_views,
            map(_third, self._by_end),
            cluster.free_counts(),
            cluster.headroom,
            known=self._known_reservation(now),
        )
        for start in result.starts:
            self._start_job(self._jobs[start.job_id], start.placement)
        self._reservation = res = result.reservation
        # Slots taken from now on come out of the reservation's extra slots.
        self._taken_at_pass = cluster.taken_count
        self._last_pass = (cluster.free_epoch, self._queue_epoch, now)
        # A pass that started nothing leaves a reservation the next pass may reuse.
        self._res_known = (
            (res, cluster.change_epoch, self._views_epoch, now)
            if res is not None and not result.starts
            else None
        )
        self._flush()
        for start in result.starts:
            self._report_start(self._jobs[start.job_id])

    # -- reclaim: the blocked queue head as the plugin sees it ------------------------

    def queue_head(self) -> QueueHead | None:
        """The head the last pass could not start, in the terms of
        :meth:`~xce_resize_plugin.host.ClusterView.blocked_head`: every host counts for
        it, and the resizable jobs listed are the running ones above their minimum."""
        with self._lock:
            return self._queue_head()

    def _queue_head(self) -> QueueHead | None:
        res = self._reservation
        view = self._pending_views.get(res.job_id) if res is not None else None
        if res is None or view is None:
            return None
        parts = self._head_slots()
        total = self._cluster.free_total
        kept = self._queue_head_kept
        # The parts and the view are the same objects while unchanged: compared by
        # identity, as equal free-slot views of every host would cost a step per host.
        if (
            kept is not None
            and kept[0] is parts
            and kept[1] is view
            and kept[2] == (res.job_id, res.shadow, total)
        ):
            # The same object as at the last cycle: the plugin, which keeps its answer
            # while the head stays the same, compares it by identity first.
            return kept[3]
        free, unusable, resizable, excess = parts
        head = QueueHead(
            res.job_id,
            view.min_tasks,
            view.ptile,
            res.shadow,
            free,
            unusable,
            resizable,
            total,
            excess,
        )
        self._queue_head_kept = (parts, view, (res.job_id, res.shadow, total), head)
        return head

    def _head_slots(self) -> _HeadSlots:
        """The free slots, the hosts out of service, the resizable running jobs above
        their minimum and the slots they hold above it, as a head sees them. Each
        changes only with the ledger (a job starts, ends or is resized; a host closes,
        opens, fails or comes back: each bumps ``change_epoch``), and the plugin asks at
        every cycle while the head is blocked: they are kept until the ledger changes
        (the same objects, read-only)."""
        cluster = self._cluster
        kept = self._head_kept
        if kept is not None and kept[0] == cluster.change_epoch:
            return kept[1]
        held = cluster.held_count
        above = {
            j: n
            for j, job in self._running.items()
            if job.resizable and (n := held(j) - job.min_tasks) > 0
        }
        # Slots a reclaim frees on a closed or failed host do not count for the head.
        parts = (
            cluster.free_counts().snapshot(),
            cluster.out_of_service(),
            tuple(above),
            sum(above.values()),
        )
        self._head_kept = (cluster.change_epoch, parts)
        return parts

    def _known_reservation(self, now: float) -> Reservation | None:
        """The last pass's reservation if it is still exact: no slot taken or freed,
        no running job's planned end changed, and none reached since (an overdue job
        releases "now", which would move the shadow time)."""
        known = self._res_known
        if known is None:
            return None
        res, epoch, views, at = known
        if epoch != self._cluster.change_epoch or views != self._views_epoch:
            return None
        if not res.shadow > now:
            return None
        i = bisect.bisect_right(self._by_end, (at, "\U0010ffff"))
        if i < len(self._by_end) and self._by_end[i][0] <= now:
            return None
        return res

    def _update_running_view(self, job: JobRecord) -> None:
        """The scheduler's view of a running job: its planned end and (live) slots."""
        self._drop_running_view(job.id)
        self._views_epoch += 1
        cluster = self._cluster
        view = RunningJob(
            job.id,
            self._expected_end(job),
            cluster.job_hosts(job.id),
            partial(cluster.schedulable_count, job.id),
        )
        self._running_views[job.id] = view
        if view.end is not None:
            # Ends and ids never tie together (ids are unique): views are not compared.
            bisect.insort(self._by_end, (view.end, job.id, view))

    def _drop_running_view(self, job_id: str) -> None:
        old = self._running_views.pop(job_id, None)
        if old is not None and old.end is not None:
            i = bisect.bisect_left(self._by_end, (old.end, job_id))
            del self._by_end[i]

    def _pending_view(self, job: JobRecord) -> PendingJob:
        work = self._work.get(job.id)
        if job.initial_tasks is not None:
            # A cap the owner asked for: never filled up to max with idle slots.
            most, fill_to = job.initial_tasks, None
        elif job.start_tasks is not None:
            most, fill_to = job.start_tasks, job.max_tasks
        else:
            most, fill_to = job.max_tasks, None
        return PendingJob(
            job.id,
            job.user,
            job.min_tasks,
            most,
            job.ptile,
            job.duration,
            work.planned_duration if work is not None else None,
            fill_to,
        )

    def _deliver(self) -> None:
        events = self._events
        batch: list[TaskEvent | TaskEventRun] = []
        for event in events.drain():
            if isinstance(event, TaskEventRun):
                self._changes += len(event)  # (as many as its events one by one)
                batch.append(event)
                if events:
                    continue
                self._deliver_tasks(batch)
                batch = []
                continue
            self._changes += 1
            if isinstance(event, TaskEvent):
                batch.append(event)
                if events:
                    continue  # more queued: they may be task events of the same batch
                self._deliver_tasks(batch)
                batch = []
                continue
            if batch:
                self._deliver_tasks(batch)
                batch = []
            self._hook(
                self._hooks.notify_done,
                self._host,
                event.job_id,
                event.attempt,
                event.status,
                event.reason,
            )

    def _deliver_tasks(self, batch: list[TaskEvent | TaskEventRun]) -> None:
        events = TaskEvents(batch)
        if self.task_event_batches:
            self._hook(self._hooks.task_events, self._host, events)
        else:
            for event in events:
                self._hook(self._hooks.task_event, self._host, event)

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

    # =================================================================================
    # internals: persistence
    # =================================================================================

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

    def _flush(self) -> None:
        if self._closed or not self._persist:
            return
        if self.now() != self._saved_clock:
            self._meta_dirty = True
        if not self._dirty and not self._meta_dirty:
            return
        jobs = [
            (self._jobs[j], self._cluster.held(j)) for j in sorted(self._dirty) if j in self._jobs
        ]
        self._store.write(self._meta() if self._meta_dirty else None, jobs)
        self._dirty.clear()
        self._meta_dirty = False
        self._saved_clock = self.now()

    def _restore(self, saved: Iterable[tuple[JobRecord, dict[int, str]]]) -> None:
        """Rebuild the ledger, queue, running set and timeline from saved records."""
        records = sorted(saved, key=lambda item: (item[0].submit_time, job_id_key(item[0].id)))
        for job, held in records:
            self._jobs[job.id] = job
            self._cluster.restore(job.id, job.user, held)
            if job.state is JobState.PEND:
                self._enqueue(job)
            elif job.state is JobState.RUN:
                self._running[job.id] = job
                self._schedule_end(job)
                self._update_running_view(job)
        # Task processes do not wait for the controller: re-arm the exits of tasks that
        # were being stopped, and report launches the crash interrupted as failed.
        if not self._resume_tasks:
            return
        for job, _ in records:
            if job.finished:
                continue
            for tid, rec in job.task_states.items():
                if rec.state is TaskState.STOPPING and rec.stop_since is not None:
                    self._runner_stop(job.id, tid, rec.grace or 0.0, rec.stop_since)
                elif rec.state is TaskState.STARTING:
                    self.task_start_failed(job.id, tid, "controller restarted during launch")
