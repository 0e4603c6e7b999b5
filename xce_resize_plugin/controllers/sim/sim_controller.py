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
:meth:`kill`, :meth:`at`, :meth:`run`, :meth:`advance`, :meth:`settle`,
:meth:`forget_finished` (finished jobs dropped after a while), the resize
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

**In layers.** The class is built on five layers, one module each (:mod:`.state`,
:mod:`.scheduling`, :mod:`.contract`, :mod:`.host_states`, :mod:`.views`; see
:mod:`.state`). This module adds the top one: construction and restart from the
store, the lifecycle, the driver's inputs and the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

import pluggy

from xce_resize_plugin.controllers.cluster import Cluster
from xce_resize_plugin.controllers.finished_jobs import FinishedJobs
from xce_resize_plugin.controllers.jobs import JobOptions, JobRecord, job_id_key, submit_keywords
from xce_resize_plugin.controllers.observer import Observer
from xce_resize_plugin.controllers.runners import (
    InRunner,
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
from xce_resize_plugin.controllers.sim.cluster_view import SimClusterView
from xce_resize_plugin.controllers.sim.events import EventQueue, Timeline
from xce_resize_plugin.controllers.sim.views import Views
from xce_resize_plugin.controllers.sim.work import JobWork
from xce_resize_plugin.controllers.store import LmdbStore, MemoryStore, NullStore, Store
from xce_resize_plugin.controllers.task_records import LIVE_STATES, TaskState
from xce_resize_plugin.controllers.violations import SettleLoopError, SubmissionRejected
from xce_resize_plugin.core.models import GrowHosts, JobState, LossOutcome
from xce_resize_plugin.host import Controller, HostHooks, Principal

if TYPE_CHECKING:
    from xce_resize_plugin.core.accounting import Usage
    from xce_resize_plugin.core.models import ResizeRequest
    from xce_resize_plugin.core.status import ResizeStatus

HostSpec = Mapping[str, int] | Sequence[tuple[str, int]]
TasksSpec = int | str | tuple[int, int]


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


class EmbeddedController(Views):
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
    :param history_kept: the most ended tasks' records and notification runs each
        job's record keeps, the newest, and of its allocation versions the first and
        the newest (at most 4: ``contract.VERSIONS_KEPT``; default
        ``None``: all of them, which simulations, scenarios and their checks read). A
        long-lived elastic job resized all day would otherwise have a record, and a
        store write per change, that grows with every resize (the live controller:
        docs/live-controller.md, "What a job's record keeps").
    :param tasks_forgotten: called with a job id and the task ids whose records
        ``history_kept`` dropped, so that a holder drops what it keeps of them too (the
        live controller: their launch records, the agents' entries).
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
        controller); until then the job runs on, its lost tasks exited and unheld. It
        returns the outcome that stands (``None``: the one asked), e.g. ``exit`` for a
        requeue of a job it is ending already (killed).
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
        history_kept: int | None = None,
        tasks_forgotten: Callable[[str, list[int]], None] | None = None,
        task_event_batches: bool = True,
        lock: AbstractContextManager[Any] | None = None,
        hook_controller: Controller | None = None,
        resume_tasks: bool = True,
        loss_ender: Callable[[str, LossOutcome], LossOutcome | None] | None = None,
    ) -> None:
        self._pm = plugin_manager
        self._loss_ender = loss_ender
        self._hooks = HostHooks(plugin_manager)
        self._host = hook_controller if hook_controller is not None else self
        self._lock = lock if lock is not None else threading.RLock()
        self._resume_tasks = resume_tasks
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
        if history_kept is not None and history_kept < 1:
            raise ValueError(f"history_kept must be at least 1, not {history_kept}")
        self.history_kept = history_kept
        self._tasks_forgotten = tasks_forgotten
        self._no_observers()
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
        self.tokens = dict(tokens or {})
        self._hook_depth = 0
        self._started = False
        #: While the plugin starts: slots its resume asserted on failed hosts.
        self._resumed_losses = None
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
        self._config = MappingProxyType(dict(config))
        self._cluster = Cluster(hosts, user_slots)
        self._restore_host_states(saved)

        self._clock = clock if clock is not None else SimClock()
        if "clock" in saved and saved["clock"] > self._clock.now():
            self._clock.advance_to(float(saved["clock"]))
        self._next_id = int(saved.get("next_job_id", 101))
        self._runner = task_runner if task_runner is not None else SimTaskRunner(faults)
        self._runner.bind(self)
        self._start_many, self._stop_many = start_many_of(self._runner), stop_many_of(self._runner)
        self._notifier = (
            notification_runner
            if notification_runner is not None
            else SubprocessNotificationRunner()
        )

        self._jobs = {}
        self._forgotten = set()
        self._finished = FinishedJobs()
        self._deleted = set()
        self._work = {}
        self._end_gen = {}
        self._init_schedule()
        self._future = {}
        self._timeline = Timeline()
        self._events = EventQueue()
        self._changes = 0
        self._instant = 0
        self._round = 0
        self._problems = []
        self._rejections = []
        self._dirty = set()
        self._meta_dirty = True
        self._saved_clock = self._clock.now()
        self._closed = False  # _flush() below checks it
        if snapshot is not None:
            self._restore(snapshot.jobs)
        self._flush()

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
            elif job.end_reported and job.end_time is not None:
                self._finished.add(job.end_time, job.id, job.user)  # dropped in its time
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
                self._closed = True
                try:
                    self._flush()
                finally:
                    # Released even when the last write failed (fenced by a newer
                    # controller, a full disk): the environment is this process's.
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

    def forget_finished(
        self,
        before: float,
        limit: int | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> list[JobRecord]:
        """Drop finished jobs whose end was at ``before`` or earlier, and reported
        (``xce_job_end`` returned), earliest first; return their records.

        A holder that purges finished jobs after a while calls it (the live controller:
        ``[controller] finished_job_keep``); it costs in proportion to what it drops.
        At most ``limit`` jobs are dropped, and none that ``keep`` names (a later call
        drops them). A dropped job is gone from every view (:meth:`job`, :meth:`jobs`,
        :meth:`get_job`), its record is deleted from the store with the next write
        (:meth:`flush`: the caller's, so that what it drops with the jobs goes in the
        same transaction), and its id is never given again, also after a restart (a
        number: the saved next id moves past it).
        """
        with self._lock:
            self._top_level("forget_finished")
            return self._drop_due(before, limit, keep)

    def forget_finished_over(
        self,
        most: int,
        limit: int | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> list[JobRecord]:
        """Drop the finished jobs, ended and reported, of every user who has more than
        ``most`` of them, each user's earliest ended first, until ``most`` are left;
        return their records.

        A holder that bounds what one user's finished jobs may hold calls it (the live
        controller: ``[controller] finished_job_max``); it costs in proportion to what
        it drops and to the users over the bound. ``limit``, ``keep`` and what a
        dropped job becomes are as for :meth:`forget_finished`.
        """
        if most < 0:
            raise ValueError(f"forget_finished_over: most must be >= 0, not {most}")
        with self._lock:
            self._top_level("forget_finished_over")
            return self._drop_over(most, limit, keep)

    def _no_observers(self) -> None:
        """The observer lists, empty (:meth:`add_observer` fills them)."""
        self._observers = []
        self._on_submit = []
        self._on_start = []
        self._on_commit = []
        self._on_ending = []
        self._on_end = []
        self._on_requeue = []
        self._on_task = []
        self._on_answer = []
        self._on_cycles = []
        self._on_cycled = []
        self._on_settled: list[Callable[[EmbeddedController], None]] = []
        self._on_host = []

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
                ("job_requeued", self._on_requeue),
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
            if rec is None or rec.state not in LIVE_STATES:
                raise ValueError(f"job {job_id} task {task_id} is not running")
            self.task_exited(job_id, task_id, status, reason)
            self._flush()

    @property
    def faults(self) -> TaskFaults:
        """The simulated task runner's fault injection (start failures, stop delays)."""
        if not isinstance(self._runner, SimTaskRunner):
            raise TypeError("fault injection needs the simulated task runner")
        return self._runner.faults

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
            self._loop(until, None)
            if until is not None and until > self.now():
                self._advance_clock(until)
                self._instant += 1
                self._settle_observed()

    def run_before(self, time: float, *, first: bool) -> None:
        """:meth:`run` paused before ``time``: every instant earlier than ``time`` is
        processed and settled, and the clock stays at the last of them. ``first`` says
        whether this is the run's first call (it settles the starting instant, as
        :meth:`run` does); a later call goes on where the previous one stopped, without
        a settle :meth:`run` would not have made, so a run made of pauses is the same
        run (the time-parallel simulation compares states there, .segments)."""
        with self._lock:
            self._top_level("run_before")
            if first:
                self._settle_observed()
            self._loop(None, time)

    def _loop(self, until: float | None, before: float | None) -> None:
        timeline = self._timeline
        while True:
            t = timeline.next_time()
            if t is None or (until is not None and t > until):
                break
            if before is not None and t >= before:
                break
            self._advance_clock(t)
            self._instant += 1
            for fn in timeline.pop_at(t):
                fn()
            self._flush()
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

    def flush(self) -> None:
        """Write what changed to the store now (the reporter methods leave that to
        their caller, so that a batch of reports is one write)."""
        with self._lock:
            self._flush()
