"""The live controller: the embedded controller on the wall clock, with real processes.

:class:`LiveController` holds an
:class:`~xce_resize_plugin.controllers.sim.sim_controller.EmbeddedController`
(:attr:`LiveController.embedded`: same scheduler, ledger, hook order and invariants)
and gives it what differs:

- a wall clock, and a loop thread that runs scheduler and dispatch cycles (``settle``)
  whenever something happened (a request, a worker event) and at least every
  :data:`TICK` seconds;
- tasks as real processes of per-host worker agents (:mod:`.worker`), reached through
  :mod:`.tasks`: the embedded controller's task and notification runners are this
  controller's commands to the agents, and the agents' events come back as its task
  reports; notification commands run by the first execution host's agent;
- its own state in LMDB with fencing and side records (:mod:`.live_store`);
- jobs with a command: a job ends when its task 0 process ends (DONE on status 0, EXIT
  otherwise); its other tasks are stopped first (SIGTERM, ``kill_grace``, SIGKILL) and
  its slots are freed only once they are gone. ``kill`` ends a job the same way.
- host failures: a host whose agent is lost (dead, replaced, or unheard for
  ``agent_timeout``), or that an administrator sets down, fails through the embedded
  controller's ``host_down``; a job that the failure ends or requeues is this
  controller's to end (``loss_ender``): its other tasks are stopped first. The host
  takes tasks again once its agent registers (:meth:`LiveController._host_back`).
- who a job runs as, decided at submission (:func:`.submission.job_account`): its
  owner's account when the controller runs as root, else the controller's user; the
  job's directory is the owner's to read, the rest of the state directory nobody's but
  the controller's (:meth:`LiveController._prepare_state_dir`).

The hooks get this controller as ``controller`` (the REST routes are built on it too):
it forwards the Controller protocol to the embedded controller, adding its own token
check, hostfiles and crash points. It reads job records only through the embedded
controller's :meth:`~.EmbeddedController.record` / :meth:`~.EmbeddedController.records`
and changes jobs only through its public methods.

**Locking.** One re-entrant lock (:attr:`LiveController.lock`) guards all controller
state. It is the embedded controller's lock too (injected), taken around each of its
entry points; this controller takes it around its own compound operations, and every
hook call made through the plugin manager takes it (a hook-call monitor), whichever
thread makes it: the REST handlers call the plugin's hooks from a thread pool, and the
plugin holds its own lock while it calls back into the controller, so taking the
controller lock first, always, is what keeps the two locks in one order (no deadlock).
The one exception: a resize request hands the lock over while its journal write's
fsync runs (:meth:`LiveController.durable_wait`), so that concurrent requests share
fsyncs; docs/architecture.md, "Concurrency", says why that keeps every guarantee.

**Durability before action.** Commands to agents are queued in the fleet's outbox and
released only after the store write that records them (see :mod:`.tasks`), so a
restarted controller's records are never behind what the agents were told.

**Restart.** A new controller on the same state directory takes the next epoch (the old
one's writes fail, it stops), connects to the agents (starting missing ones),
reconciles every live task with what its agent reports, and only then calls
``xce_controller_start`` (docs/live-controller.md lists every case).

**When the state cannot be written** (a full or failing disk: a write of the store, of
the plugin's journal or of a hostfile fails), the controller goes back to what is on
disk rather than go on with a memory that ran ahead of it: it drops the generation that
failed — the embedded controller (whose store lease is revoked, so nothing of it can
write any more), the commands waiting in the outbox, the plugin's runtime, the
observers — and builds the embedded controller again from the store
(:meth:`LiveController.storage_failed`). Changes are refused with 503 meanwhile, and
health says ``failing``. Every :data:`STORAGE_RETRY` seconds the loop starts again from
the disk as a restart would, in this process: reconcile with every agent, then
``xce_controller_start``; the first attempt that writes ends the failure
(docs/live-controller.md).

**Observers.** :meth:`LiveController.add_observer` takes an
:class:`~xce_resize_plugin.controllers.observer.Observer` (the embedded controller's
events: submissions, starts, task reports, notification answers, cycles, job ends) or
a :class:`~xce_resize_plugin.controllers.observer.LiveObserver`, which also sees this
controller's own: every hook call with its outcome (from any thread), jobs whose tasks
are being stopped before they end, the start and the close. The recording of a run
(``[controller] record``) is such an observer, attached by whoever builds the
controller (the ``xce-resize controller`` command): this module knows nothing of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import pluggy
from pluggy import HookImpl

from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.hosts import HOST_FAILURE, HostFailure
from xce_resize_plugin.controllers.jobs import JobRecord, TaskRecord, TaskState
from xce_resize_plugin.controllers.live import host_admin, job_kv
from xce_resize_plugin.controllers.live.controller_lock import ControllerLock
from xce_resize_plugin.controllers.live.job_tokens import (
    FINGERPRINT_KEY,
    SALT_FIELD,
    TOKEN_ENV,
    JobTokens,
)
from xce_resize_plugin.controllers.live.live_store import Lease, LiveStore
from xce_resize_plugin.controllers.live.proc import (
    Account,
    account_json,
    atomic_write,
    parse_account,
)
from xce_resize_plugin.controllers.live.settings import LiveConfig
from xce_resize_plugin.controllers.live.state_check import JOURNAL_DIR, check_journal, cross_check
from xce_resize_plugin.controllers.live.storage_faults import (
    StateNotWritable,
    fenced_cause,
    storage_failure,
)
from xce_resize_plugin.controllers.live.submission import (
    SubmitRejected,
    check_cwd,
    job_account,
    parse_submission,
)
from xce_resize_plugin.controllers.live.task_env import (
    identity_env,
    local_task_id,
    make_scratch,
    recorded_local_ids,
    remove_scratch,
    task_file,
)
from xce_resize_plugin.controllers.live.tasks import Queued, WorkerFleet
from xce_resize_plugin.controllers.observer import LiveObserver, Observer
from xce_resize_plugin.controllers.runners import (
    ESSENTIAL_ENV,
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    TaskReporter,
)
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.violations import HostStateError, StoreError, UnknownJob
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.models import JobState, LossOutcome, Task, allocation_env
from xce_resize_plugin.errors import (
    ConfigError,
    FencedError,
    JobFinished,
    NoJob,
    PermissionDenied,
    ResizeError,
)
from xce_resize_plugin.host import HostHooks, Principal, ResizeObserver
from xce_resize_plugin.journal.lmdb_env import PRIVATE_DIR, private_dir, restrict_mode

log = logging.getLogger(__name__)

#: The loop runs at least this often (seconds), and at once when woken.
TICK = 0.1
#: How often the loop checks that no newer controller took the state directory.
FENCE_CHECK = 0.5
#: Seconds between attempts to write again while the state cannot be written.
STORAGE_RETRY = 1.0
#: Hooks the controller still calls while the state cannot be written.
LIFECYCLE_HOOKS = frozenset({"xce_controller_start", "xce_controller_stop"})
#: Task states whose process may still be alive.
LIVE = (TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING)
#: Fault injection for the failover tests: ``XCE_LIVE_CRASH=POINT`` makes the
#: controller SIGKILL itself at that point (the first time it is reached). Points:
#: ``after-request`` (a resize request is durable, its answer not sent yet),
#: ``after-reserve``, ``after-launch``, ``after-stop``, ``after-notify``,
#: ``after-commit`` (the controller method returned). Never set it in production.
CRASH_ENV = "XCE_LIVE_CRASH"
CRASH_POINTS = (
    "after-request",
    "after-reserve",
    "after-launch",
    "after-stop",
    "after-notify",
    "after-commit",
)


class WallClock:
    """Real time (seconds since the epoch); ``advance_to`` is a no-op because wall
    time moves by itself (the embedded controller calls it only in simulated runs)."""

    def now(self) -> float:
        return time.time()

    def advance_to(self, time_: float) -> None:
        """Nothing to do: the wall clock is never moved."""


class ControllerStopping(ResizeError):
    """The controller is stopping or was fenced; nothing more is accepted."""

    code = "XCE_CONTROLLER_STOPPING"
    message = "The controller is stopping"
    http_status = 503


StartTask = Callable[[str, Task, Mapping[str, str]], None]
StopTask = Callable[[str, int, float, float], None]


class LiveTaskRunner:
    """The :class:`~xce_resize_plugin.controllers.runners.TaskRunner` of the live
    controller: ``start`` and ``stop`` are the controller's commands to the host's agent
    (the agents' events come back to the controller, which reports them)."""

    def __init__(self, start: StartTask, stop: StopTask) -> None:
        self._start = start
        self._stop = stop

    def bind(self, reporter: TaskReporter) -> None:
        """Nothing to keep: reports come back through the agents' events."""

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self._start(job_id, task, env)

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._stop(job_id, task_id, grace, since)


class LiveNotificationRunner:
    """Runs notification commands on the first execution host's agent; ``done`` is
    called (under the controller lock) when the agent reports the result."""

    def __init__(self, run: Callable[[NotificationRequest, NotificationDone], None]) -> None:
        self._run = run

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        self._run(request, done)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _forward(
    method: Callable[Concatenate[EmbeddedController, _P], _R], crash: str | None = None
) -> Callable[Concatenate[LiveController, _P], _R]:
    """A Controller protocol method of the live controller: the embedded controller's
    ``method``, then the crash point ``crash`` if one is given (see :data:`CRASH_ENV`).

    The signatures stay where the protocol and the embedded controller state them; mypy
    checks every forward against both.
    """
    if crash is not None and crash not in CRASH_POINTS:
        raise ValueError(f"unknown crash point {crash!r}")

    def forward(self: LiveController, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        result = method(self.embedded, *args, **kwargs)
        if crash is not None:
            self._crash(crash)
        return result

    forward.__name__ = method.__name__
    forward.__qualname__ = f"LiveController.{method.__name__}"
    forward.__doc__ = method.__doc__
    return forward


class LiveController:
    """See the module docstring. Construct, then :meth:`open`; :meth:`shutdown` at the end.

    :param plugin_manager: the manager (with the resize plugin registered).
    :param cfg: the checked configuration.
    """

    def __init__(self, plugin_manager: pluggy.PluginManager, cfg: LiveConfig) -> None:
        self.cfg = cfg
        self.lock = ControllerLock()
        # Per thread: the hook calls in progress, outermost first (see durable_wait).
        self._calls = threading.local()
        self.fenced: BaseException | None = None
        self.on_fenced: Callable[[], None] | None = None
        self._pm = plugin_manager
        self._hooks = HostHooks(plugin_manager)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._loop_ident: int | None = None
        self._ending: dict[str, tuple[JobState, str]] = {}
        self._notifying: dict[tuple[str, int], tuple[str, dict[str, Any], NotificationDone]] = {}
        self._broken: set[str] = set()
        #: Hosts whose agent was lost before the plugin started: failed once it has
        #: (:meth:`_settle_hosts`).
        self._down_pending: set[str] = set()
        self._opened = False
        self._observers: list[LiveObserver] = []
        #: Why the state cannot be written (``None``: it can): see :meth:`storage_failed`.
        self.failing: BaseException | None = None
        self._failure_seen: BaseException | None = None
        self._writable = threading.Event()
        self._writable.set()
        # The in-memory view is not what is on disk (a reload from it failed): nothing
        # is shown until one succeeds.
        self._stale = False
        #: What the plugin tells of its work (metrics); set before :meth:`open`.
        self.resize_observer: ResizeObserver | None = None
        self._crash_at = os.environ.get(CRASH_ENV) or None
        if self._crash_at is not None and self._crash_at not in CRASH_POINTS:
            raise ValueError(f"{CRASH_ENV}={self._crash_at}: not one of {', '.join(CRASH_POINTS)}")
        #: The user this controller and its agents run as (0: jobs run as their owners).
        self.euid = os.geteuid()
        self._prepare_state_dir()
        self.live_store, self._tokens = _open_state(cfg)
        try:
            self.fleet = WorkerFleet(
                cfg.state_dir,
                [h for h, _ in cfg.hosts],
                self.live_store.epoch,
                manage=cfg.manage_workers,
                start_timeout=cfg.worker_timeout,
                header_timeout=cfg.header_timeout,
                agent_timeout=cfg.agent_timeout,
            )
            self.live_store.before_commit = self._before_commit
            self.live_store.after_commit = self.fleet.release
            with self.lock:
                self._lease = Lease(self.live_store)
                #: The controller machinery (scheduler, ledger, hook order, invariants),
                #: on the wall clock, with this controller's lock, runners and store.
                #: Built again from the store after a failed write (:meth:`_reload`).
                self.embedded = self._new_embedded(self._lease)
                self._resume_stops()
        except BaseException:
            self.live_store.close()
            raise
        self._read_side()
        self._undo_monitor = plugin_manager.add_hookcall_monitoring(
            self._before_hook, self._after_hook
        )

    def _new_embedded(self, lease: Lease) -> EmbeddedController:
        """An embedded controller on what the store holds, writing through ``lease``."""
        cfg = self.cfg
        return EmbeddedController(
            self._pm,
            cfg.state_dir,
            list(cfg.hosts),
            config=cfg.resize,
            user_slots=cfg.user_slots,
            store=lease,
            clock=WallClock(),
            task_runner=LiveTaskRunner(self._runner_start, self._runner_stop),
            notification_runner=LiveNotificationRunner(self._runner_notify),
            protect_reservation=True,
            autostart=False,
            lock=self.lock,
            hook_controller=self,
            resume_tasks=False,
            loss_ender=self._loss_end,
        )

    def _read_side(self) -> None:
        """The job ends in progress, from the side records (job tokens are derived,
        not stored: :mod:`.job_tokens`)."""
        self._ending.clear()
        for key in self.live_store.keys("job:"):
            spec = self.live_store.get(key)
            job_id = key[len("job:") :]
            ending = spec.get("ending")
            if ending and not spec.get("ended"):
                self._ending[job_id] = (JobState(ending[0]), str(ending[1]))

    # =================================================================================
    # lifecycle
    # =================================================================================

    def _prepare_state_dir(self) -> None:
        """Jobs that run as their owners must reach their directories (``jobs/ID``), and
        nothing else: the stores hold every job's token, ``workers`` the agents'
        secret. A state directory other users cannot reach is a configuration error
        then, not a job that fails later."""
        state = self.cfg.state_dir
        # Private (0700) unless jobs run as their owners: they then traverse it to their
        # own directory under jobs/ (0711 lists nothing; the stores and the key stay 0700
        # and 0600 below it).
        as_owners = self.euid == 0 and not self.cfg.single_user
        try:
            state.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{state}: cannot create the directory: {exc}") from exc
        restrict_mode(state, 0o711 if as_owners else PRIVATE_DIR, error=StoreError)
        for name in ("controller", "resize", "workers"):
            private_dir(state / name, error=StoreError)
        (state / "jobs").mkdir(mode=0o711, exist_ok=True)
        os.chmod(state / "jobs", 0o711)
        if self.cfg.single_user:
            if self.euid == 0:
                log.warning("single_user = true and running as root: every job runs as root")
            return
        if self.euid != 0:
            return
        for path in (state, *state.parents):
            mode = path.stat().st_mode
            if not mode & stat.S_IXOTH:
                where = f"{self.cfg.path}: " if self.cfg.path else ""
                raise ConfigError(
                    f"{where}controller.state_dir: {path} (mode {stat.S_IMODE(mode):04o}) "
                    "cannot be searched by other users, and jobs run as their owners: they "
                    "could not read their hostfiles (give it o+x, or use another directory)"
                )

    def _resume_stops(self) -> None:
        """Restart: hand the stops in progress to the agents again. The embedded
        controller leaves task processes to this controller (``resume_tasks=False``):
        launches a crash interrupted stay STARTING until reconciliation with their
        agent decides (:meth:`worker_up`)."""
        for job in self.embedded.records():
            if job.finished:
                continue
            for tid, rec in job.task_states.items():
                if rec.state is TaskState.STOPPING and rec.stop_since is not None:
                    self._runner_stop(job.id, tid, rec.grace or 0.0, rec.stop_since)
        self.embedded.flush()

    def add_observer(self, observer: Observer) -> None:
        """Watch the embedded controller's events (:class:`~.observer.Observer`) and,
        for a :class:`~.observer.LiveObserver`, this controller's own. Add observers
        before :meth:`open` (a recording must see the run from its start)."""
        with self.lock:
            self.embedded.add_observer(observer)
            if isinstance(observer, LiveObserver):
                self._observers.append(observer)

    def open(self) -> None:
        """Connect to (or start) the agents, reconcile, start the plugin and the loop.

        An agent that refuses this controller's epoch (it has seen a newer controller,
        e.g. after the state directory was restored from a backup) fences it: then
        nothing else starts, and :attr:`fenced` says why.
        """
        self.fleet.owner = self
        missing = self.fleet.connect_all(self.cfg.worker_timeout)
        if self.fenced is not None:
            return
        if missing:
            log.warning("no agent yet for %s: unavail until it registers", ", ".join(missing))
        with self.lock:
            self._down_pending.update(missing)
            try:
                if self.failing is None:
                    self._start_plugin()
            except Exception as exc:
                if storage_failure(exc) is None:
                    raise
                self.storage_failed(exc)  # serve while failing: the loop recovers
            for observer in self._observers:  # none left if the state is not writable
                observer.controller_started()
        self.fleet.start_threads()
        self._loop_thread = threading.Thread(target=self._loop, name="controller-loop", daemon=True)
        self._loop_thread.start()

    def _start_plugin(self) -> None:
        """Hostfiles of the running jobs, then ``xce_controller_start``: the plugin
        resumes what its journal says is in flight (after reconciliation)."""
        for job in self.embedded.records():
            if job.state is JobState.RUN:
                self._write_hostfile(job.id, job.tasks)
        self.embedded.start()
        self._opened = True
        self._settle_hosts()

    def shutdown(self) -> None:
        """Stop the loop and the channels; a clean stop calls ``xce_controller_stop``.

        Agents and their tasks keep running: a new controller on the same state
        directory takes them over.
        """
        self._stopping.set()
        self._wake.set()
        if self._loop_thread is not None and self._loop_thread is not threading.current_thread():
            self._loop_thread.join(timeout=10)
        self.fleet.close()
        with self.lock:
            clean = False
            try:
                if self.fenced is None and self.failing is None:
                    self.embedded.stop()
                    # The plugin's journal is complete now (a recording writes its last
                    # facts, then the line that says the run ended cleanly).
                    clean = self._opened
                else:
                    # Fenced, or the state cannot be written: no more writes; only
                    # release the plugin's journal handle.
                    self._stop_plugin()
            finally:
                try:
                    for observer in self._observers:
                        observer.controller_closed(clean)
                finally:
                    self.live_store.close()
                    self._undo_monitor()

    def _stop_plugin(self) -> None:
        """``xce_controller_stop`` without writing: the plugin drops its runtime (and
        its journal handle), whatever state that runtime was in."""
        try:
            self._hooks.controller_stop(self)
        except Exception:  # the journal may refuse: fenced, or not writable
            log.debug("xce_controller_stop without writing", exc_info=True)

    def fence(self, reason: BaseException) -> None:
        """A newer controller took over: stop at once (exit status 3).

        May be called from any thread, with or without the lock; it only sets flags.
        """
        if self.fenced is not None:
            return
        self.fenced = reason
        log.critical("controller stops: %s", reason)
        self.fleet.closed = True
        self.fleet.discard()
        self._stopping.set()
        self._wake.set()
        if self.on_fenced is not None:
            self.on_fenced()

    # -- when the state cannot be written ----------------------------------------------

    def storage_failed(self, exc: BaseException) -> StateNotWritable:
        """A durable write failed (``exc``, or what caused it): go back to what is on
        disk; the refusal to answer. Any thread; idempotent for one failure.

        What had changed in memory since the last write — the failed write's records,
        the commands waiting for it in the outbox, the plugin's runtime — is dropped,
        and the embedded controller is built again from the store, so that what the
        controller shows and does is what is on disk: nothing started on slots whose
        release was not recorded, no task without a process. Changes are refused with
        :class:`StateNotWritable` (503) until the loop's :meth:`_recover` succeeds.
        """
        cause = storage_failure(exc) or exc
        with self.lock:
            if cause is not self._failure_seen:
                self._failure_seen = cause
                if self.failing is None:
                    log.error(
                        "the state cannot be written, changes refused until it can: %s", cause
                    )
                self.failing = cause
                self._writable.clear()
                self._drop_generation()
                self._reload()
            self._wake.set()
        return StateNotWritable(str(cause))

    def _drop_generation(self) -> None:
        """Nothing the current embedded controller and plugin runtime hold may be
        written or acted on any more (lock held)."""
        self._stale = True
        self._lease.revoked = True
        self.fleet.discard()
        self._notifying.clear()
        self._broken.clear()
        self._down_pending.clear()
        self._opened = False
        # A recording goes on only with the run it records: it ends as after a crash.
        observers, self._observers = self._observers, []
        for observer in observers:
            try:
                observer.controller_closed(False)
            except Exception:
                log.exception("observer failed to close")
        self._stop_plugin()

    def _reload(self) -> None:
        """Build the embedded controller again from the store (lock held). A failure
        to read leaves the view stale (:meth:`_check_view`) until the next attempt."""
        try:
            self.live_store.reload()
            lease = Lease(self.live_store)
            embedded = self._new_embedded(lease)
        except Exception as exc:
            if storage_failure(exc) is None:
                raise
            log.warning("the state could not be read back: %s", exc)
            return
        self._lease, self.embedded = lease, embedded
        self._read_side()
        self._stale = False

    def _recover(self) -> None:
        """The loop, while the state cannot be written: start again from the disk, as
        a restarted controller would, in this process — reload, hand stops in progress
        to the agents, reconcile with every agent, restart the plugin (its recovery
        resumes what its journal has in flight). Raises what fails (the next attempt
        starts over, :data:`STORAGE_RETRY` seconds later)."""
        with self.lock:
            self._drop_generation()
            self._reload()
            if self._stale:
                return
            failure = self._failure_seen
            self._resume_stops()
        # Without the lock: an agent's channel takes its own lock first (see .tasks).
        missing = self.fleet.connect_all(self.cfg.worker_timeout)
        with self.lock:
            if self.fenced is not None or self._failure_seen is not failure:
                return  # fenced, or failed again meanwhile: start over
            self._down_pending.update(missing)
            self._start_plugin()
            log.warning("the state can be written again (was: %s); serving", self.failing)
            self.failing = None
            self._writable.set()

    def _crash(self, point: str) -> None:
        """Fault injection (see :data:`CRASH_ENV`): die here as a crash would."""
        if self._crash_at == point:
            log.critical("%s=%s: killing the controller", CRASH_ENV, point)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def wake(self) -> None:
        """Run a cycle now (a request or an event arrived)."""
        self._wake.set()

    def _check_open(self) -> None:
        """Refuse a change: fenced or stopping (503), or the state cannot be written."""
        if self.fenced is not None:
            raise ControllerStopping(f"fenced: {self.fenced}")
        if self._stopping.is_set():
            raise ControllerStopping("shutting down")
        if self.failing is not None:
            raise StateNotWritable(str(self.failing))

    def _check_view(self) -> None:
        """Refuse to show a view that is not what is on disk (a reload failed)."""
        if self._stale:
            raise StateNotWritable(f"{self.failing}; the state could not be read back either")

    def _loop(self) -> None:
        self._loop_ident = threading.get_ident()
        last_check = next_try = 0.0
        while not self._stopping.is_set():
            self._wake.wait(TICK)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                now = time.monotonic()
                if self.failing is not None and now >= next_try:
                    next_try = now + STORAGE_RETRY
                    self._recover()
                with self.lock:
                    if self.failing is None:
                        self._finish_endings()
                        self.embedded.settle()
                        self._finish_endings()
                    if now - last_check >= FENCE_CHECK:
                        last_check = now
                        self.live_store.check_epoch()
                        self.fleet.reap()
            except Exception as exc:
                if self._on_error(exc):
                    return

    def _on_error(self, exc: BaseException, what: str = "controller cycle") -> bool:
        """What an exception of the loop or of an agent's channel means; ``True`` when
        the controller stops: fenced (by a newer controller's epoch, or stopping), a
        failed write (:meth:`storage_failed`), or a bug (logged; the controller goes on).
        """
        fenced = fenced_cause(exc)
        if fenced is not None or isinstance(exc, ControllerStopping):
            self.fence(fenced or exc)
            return True
        if storage_failure(exc) is not None:
            self.storage_failed(exc)
        else:
            log.error("%s failed", what, exc_info=exc)
        return False

    # -- hook calls hold the controller lock (see the module docstring) -------------------

    def _before_hook(self, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        self.lock.acquire()
        if (
            self.failing is not None
            and hook_name not in LIFECYCLE_HOOKS
            and threading.get_ident() != self._loop_ident
        ):
            # The plugin is stopped until the state can be written again (the resize
            # routes call hooks directly): refuse, with the reason.
            self.lock.release()
            raise StateNotWritable(str(self.failing))
        self._hook_calls().append((hook_name, kwargs))

    def _hook_calls(self) -> list[tuple[str, Mapping[str, Any]]]:
        calls: list[tuple[str, Mapping[str, Any]]] | None = getattr(self._calls, "stack", None)
        if calls is None:
            calls = self._calls.stack = []
        return calls

    def _after_hook(
        self,
        outcome: pluggy.Result[Any],
        hook_name: str,
        impls: Sequence[HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        calls = self._hook_calls()
        calls.pop()
        error = outcome.exception
        failure = storage_failure(error)
        try:
            if failure is not None:
                # E.g. the plugin's journal could not be written during a resize
                # request (no other catch of this controller's is on that path).
                self.storage_failed(failure)
            elif self.fenced is None and not isinstance(error, FencedError):
                # Nothing of ours happened once a newer controller owns the journal.
                for observer in self._observers:
                    observer.hook_returned(hook_name, kwargs, error)
        finally:
            self.lock.release()
        if hook_name == "xce_resize_request" and error is None:
            self._crash("after-request")
        # The outermost call wakes the loop (the hooks called inside it, e.g. the
        # policies a request asks, change nothing the loop would not see through it),
        # unless it is a request that woke it when it was decided (durable_wait).
        if not calls and not self._woke_at_decision() and threading.get_ident() != self._loop_ident:
            self._wake.set()  # e.g. a resize request: place it now, not at the next tick
        if isinstance(error, FencedError):
            self.fence(error)

    @contextlib.contextmanager
    def durable_wait(self) -> Iterator[None]:
        """The resize request hook in progress in this thread waits for its fsync: let
        other hook calls in meanwhile (:func:`xce_resize_plugin.host.durable_wait`).

        Only when the thread holds the lock just once, for that hook call alone (a
        caller holding it around more keeps it). The observers hear of the decision
        first (:meth:`~.observer.LiveObserver.hook_decided`), under the lock, in
        decision order. docs/architecture.md, "Concurrency", says why this keeps every
        guarantee.
        """
        calls = self._hook_calls()
        if len(calls) != 1 or not self.lock.held_once():
            yield
            return
        if self.fenced is None:
            name, kwargs = calls[0]
            for observer in self._observers:
                observer.hook_decided(name, kwargs)
        # The decision is the change a cycle acts on: wake the loop now, so that its
        # cycle runs during the fsync (with the lock handed over) rather than after,
        # once per request (docs/performance.md, "Durable REST throughput").
        self._calls.woken = True
        self._wake.set()
        with self.lock.handed_over():
            yield

    def _woke_at_decision(self) -> bool:
        """Whether this thread's request hook woke the loop when it was decided
        (:meth:`durable_wait`); asking clears it, for the next hook call."""
        woken: bool = getattr(self._calls, "woken", False)
        self._calls.woken = False
        return woken

    def health(self) -> tuple[dict[str, Any], int]:
        """``GET /v1/health``: the answer and its status (503 unless ``ok``)."""
        body: dict[str, Any] = {"status": "ok", "epoch": self.live_store.epoch}
        if self.fenced is not None:
            body.update(status="fenced", reason=str(self.fenced))
        elif self.failing is not None:
            body.update(status="failing", reason=f"the state cannot be written: {self.failing}")
        return body, 200 if body["status"] == "ok" else 503

    def job_count(self) -> int:
        """How many jobs the controller knows (any state), e.g. 0 on a new state dir."""
        return len(self.embedded.records())

    def _job(self, job_id: str) -> JobRecord:
        job = self.embedded.record(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}")
        return job

    # =================================================================================
    # the Controller protocol: the embedded controller's (under the shared lock), with
    # this controller's tokens, hostfiles and crash points
    # =================================================================================

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        return self._pm

    @property
    def config(self) -> Mapping[str, Any]:
        """The ``[resize]`` section (read-only)."""
        return self.embedded.config

    @property
    def state_dir(self) -> Path:
        return self.embedded.state_dir

    now = _forward(EmbeddedController.now)
    get_job = _forward(EmbeddedController.get_job)
    slot_headroom = _forward(EmbeddedController.slot_headroom)

    def authenticate(self, token: str | None) -> Principal | None:
        if not token:
            return None
        for entry in self.cfg.tokens:
            if entry.matches(token):
                return Principal(entry.user, admin=entry.user in self.cfg.admins)
        job_id = self._tokens.job_of(token)
        if job_id is None:
            return None
        with self.lock:
            job = self.embedded.record(job_id)
            salt = (self.live_store.get(f"job:{job_id}") or {}).get(SALT_FIELD)
            if job is None or job.finished or not isinstance(salt, str):
                return None
            if not self._tokens.matches(token, job_id, salt):
                return None
            return Principal(job.user, admin=False, job_id=job.id)

    # The plugin calls the methods below from inside its hooks, whose calls hold the
    # lock (the hook-call monitor): the crash points come before any other input.

    reserve_slots = _forward(EmbeddedController.reserve_slots, crash="after-reserve")
    launch_tasks = _forward(EmbeddedController.launch_tasks, crash="after-launch")
    stop_tasks = _forward(EmbeddedController.stop_tasks, crash="after-stop")
    run_notification = _forward(EmbeddedController.run_notification, crash="after-notify")

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        with self.lock:
            if self._failure_ends(job_id):
                log.info("job %s: v%s not committed: a host failure ends the job", job_id, version)
                return
            before = self._job(job_id).version
            self.embedded.commit_allocation(job_id, tasks, version)
            job = self._job(job_id)
            if job.version != before:
                # Every committed change rewrites the hostfile, atomically.
                self._write_hostfile(job_id, job.tasks)
                self._crash("after-commit")

    # -- a job that a host failure ends keeps its allocation until its end ----------------

    def free_slots(self, job_id: str, task_ids: Sequence[int]) -> None:
        with self.lock:
            if self._failure_ends(job_id):
                kept = {t.id for t in self._job(job_id).tasks}
                task_ids = [i for i in task_ids if i not in kept]
            self.embedded.free_slots(job_id, task_ids)

    def _failure_ends(self, job_id: str) -> bool:
        """Whether a host failure is ending (or requeueing) the job: its processes on
        the other hosts are being stopped, and its lost tasks, unheld, stay in its
        allocation until the end (:meth:`_loss_end`). A change of the job that
        completes meanwhile (a release whose tasks stopped, a grow whose tasks started)
        is not committed and frees no slot of the allocation: a commit would name the
        lost tasks, whose slots are gone (the embedded controller refuses it), and the
        end frees every slot the job holds anyway. The plugin learns of the end then."""
        ending = self._ending.get(job_id)
        return ending is not None and ending[1] == HOST_FAILURE

    # =================================================================================
    # driver methods
    # =================================================================================

    def kill(self, job_id: str, reason: str = "killed") -> bool:
        """End a job as EXIT: a pending one at once, a running one once its tasks have
        been stopped (SIGTERM, ``kill_grace``, SIGKILL). ``False`` if already finished."""
        with self.lock:
            job = self._job(job_id)
            if job.finished:
                return False
            if job.state is JobState.PEND:
                return self.embedded.kill(job_id, reason)
            self._begin_end(job_id, JobState.EXIT, reason)
            self.embedded.flush()
            return True

    def check_invariants(self) -> list[str]:
        return self.embedded.check_invariants()

    # -- the REST host routes' operations --------------------------------------------------

    def submit_job(self, principal: Principal, body: Any) -> dict[str, Any]:
        """``POST /v1/jobs``: check, record the command and a job token, submit."""
        if principal.job_id is not None:
            raise PermissionDenied("a job token cannot submit jobs")
        sub = parse_submission(body)
        account = job_account(principal.name, single_user=self.cfg.single_user, euid=self.euid)
        check_cwd(sub.cwd, account, self.euid)
        with self.lock:
            self._check_open()
            job_id = self._new_job_id()
            salt = self._tokens.new_salt()
            key = f"job:{job_id}"
            self.live_store.put(
                key,
                {
                    "argv": list(sub.command),
                    "cwd": sub.cwd,
                    SALT_FIELD: salt,
                    "launched": False,
                    "account": account_json(account),
                },
            )
            self._make_job_dir(job_id, account)
            try:
                self.embedded.submit_job(principal.name, sub.tasks, sub, env=sub.env, job_id=job_id)
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc  # not the submission's fault
                if fenced_cause(exc) is not None:
                    raise
                self.live_store.put(key, None)
                with contextlib.suppress(OSError):
                    self.job_dir(job_id).rmdir()  # nothing in it: the job never started
                if isinstance(exc, ResizeError):
                    raise
                raise SubmitRejected(str(exc)) from exc
        self._wake.set()
        token = self._tokens.token(job_id, salt)
        return {"id": job_id, "token": token, "job": self.job_json(job_id)}

    def kill_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``."""
        with self.lock:
            self._check_open()
            job = self._visible(principal, job_id)
            if job.finished:
                raise JobFinished(f"job {job_id} is {job.state.value}")
            try:
                self.kill(job_id, f"killed by {principal.name}")
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc
                raise
        self._wake.set()
        return self.job_json(job_id)

    def hosts_view(self, principal: Principal) -> list[dict[str, Any]]:
        """``GET /v1/hosts`` (:mod:`.host_admin`)."""
        with self.lock:
            self._check_view()
            owners = {job.id: job.user for job in self.embedded.records() if not job.finished}
            return host_admin.hosts_json(self.embedded.host_views(), principal, owners)

    def host_command(
        self, principal: Principal, name: str, action: str, body: Any
    ) -> dict[str, Any]:
        """``POST /v1/hosts/{name}/close|open|down|up``: an administrator drains a host or
        undoes it (with ``evacuate``, resizable jobs are asked to release their tasks
        there), or fences it by hand (:meth:`_host_down_by_hand`, :meth:`_host_up_by_hand`)."""
        evacuate = host_admin.check_command(principal, action, body)
        with self.lock:
            self._check_open()
            try:
                drain = failure = None
                if action == "close":
                    drain = self.embedded.host_close(name, evacuate, principal)
                elif action == "open":
                    self.embedded.host_open(name)
                elif action == "down":
                    failure = self._host_down_by_hand(name, principal)
                else:
                    self._host_up_by_hand(name)
                state = self.embedded.host_view(name).state.value
            except host_admin.HOST_ERRORS as exc:
                raise host_admin.translated(exc) from None
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc
                raise
        self._wake.set()
        log.info("host %s: %s by %s", name, action, principal.name)
        if action == "down":
            return host_admin.failure_json(name, state, failure)
        return host_admin.drain_json(name, state, drain if evacuate else None)

    # -- host failures (docs/live-controller.md, "Lost agents and failed hosts") -----------

    def _host_down_by_hand(self, name: str, principal: Principal) -> HostFailure | None:
        """``host down``: fail the host now, as if its agent were lost; its tasks are
        stopped at once if the agent answers (lost either way), and the host stays
        ``unavail`` until ``host up``, whatever its agent does."""
        if self.embedded.host_view(name).state is HostState.UNAVAIL:
            raise HostStateError(f"host {name} is already unavail")
        key = f"host:{name}"
        self.live_store.put(key, {**(self.live_store.get(key) or {"gen": 0}), "admin_down": True})
        return self._host_lost(name, f"lost: host {name} set down by {principal.name}", kill=True)

    def _host_up_by_hand(self, name: str) -> None:
        """``host up``: the host takes tasks again, at once if its agent is registered,
        else once it registers."""
        if self.embedded.host_view(name).state is not HostState.UNAVAIL:
            state = self.embedded.host_view(name).state.value
            raise HostStateError(f"host {name} is {state}, not unavail")
        key = f"host:{name}"
        record = dict(self.live_store.get(key) or {"gen": 0})
        record.pop("admin_down", None)
        self.live_store.put(key, record)
        if self.fleet.ready(name):
            self._host_back(name)

    def _host_lost(self, host: str, why: str, *, kill: bool = False) -> HostFailure | None:
        """The host failed (its agent died, was replaced, or went unheard for
        ``agent_timeout``; or ``host down``): a notification running there is answered
        as failed, the commands not yet sent there are dropped, and the embedded
        controller fails the host (``host_down``: its tasks lost, each job shrunk, ended
        or requeued through :meth:`_loss_end`). With ``kill``, the agent is told to
        kill the host's tasks (if it answers). Before the plugin has started, the
        failure waits for :meth:`_settle_hosts`."""
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        for key, (nhost, _, done) in list(self._notifying.items()):
            if nhost == host:
                del self._notifying[key]
                done(NotificationResult(None, why))
        live = [
            (job.id, tid)
            for job in self.embedded.records()
            if not job.finished
            for tid, rec in job.task_states.items()
            if rec.host == host and rec.state in LIVE
        ]
        self.fleet.drop(host)
        for job_id, tid in live if kill else ():
            self.fleet.send(
                host, {"op": "stop", "job": job_id, "task": tid, "grace": 0.0, "since": None}
            )
        if not kill and record.get("instance") is not None:
            self.live_store.put(f"host:{host}", {**record, "instance": None})
        if self.embedded.host_view(host).state is HostState.UNAVAIL:
            return None
        if not self._opened:
            if live:
                self._down_pending.add(host)
            return None
        log.warning("host %s failed (%s): %d task(s) lost", host, why, len(live))
        return self.embedded.host_down(host)

    def _host_back(self, host: str) -> None:
        """The host's agent is registered: a failed host takes tasks again (``closed``
        again if it was closed), unless an administrator set it down by hand."""
        record = self.live_store.get(f"host:{host}") or {}
        if record.get("admin_down") or host in self._down_pending:
            return
        if self.embedded.host_view(host).state is HostState.UNAVAIL:
            log.info("host %s is back: its agent is registered", host)
            self.embedded.host_up(host)

    def _settle_hosts(self) -> None:
        """Once the plugin has started: fail the hosts whose agent was lost meanwhile (or
        never answered), then take back every failed host whose agent is registered (a
        restart re-derives ``unavail`` from whether the agents answer)."""
        pending, self._down_pending = sorted(self._down_pending), set()
        for host in pending:
            if self.embedded.host_view(host).state is not HostState.UNAVAIL:
                log.warning("host %s failed: its agent did not answer at the start", host)
                self.embedded.host_down(host)
        for host, _ in self.cfg.hosts:
            if self.fleet.ready(host):
                self._host_back(host)

    def _loss_end(self, job_id: str, outcome: LossOutcome) -> None:
        """The embedded controller's ``loss_ender``: a job that a host failure ends or
        requeues has its processes on the other hosts stopped first (:meth:`_begin_end`;
        ``PEND`` stands for the requeue); its slots there are freed once they are gone.
        """
        state = JobState.PEND if outcome is LossOutcome.REQUEUE else JobState.EXIT
        self._begin_end(job_id, state, HOST_FAILURE)

    def kv_put(self, principal: Principal, job_id: str, key: str, body: Any) -> dict[str, Any]:
        """``PUT /v1/jobs/{id}/kv/{key}``: set a value, durably (:mod:`.job_kv`)."""
        job_kv.check_key(key)
        value = job_kv.parse_value(body)
        with self.lock:
            self._check_open()
            job = self._visible(principal, job_id)
            if job.finished:
                raise JobFinished(f"job {job_id} is {job.state.value}")
            name = job_kv.record_key(job_id, key)
            old = self.live_store.get(name)
            # The job's record lists its keys: counted and removed without a scan.
            spec = dict(self.live_store.get(f"job:{job_id}") or {})
            keys = list(spec.get("kv", []))
            job_kv.check_room(len(keys), old is not None)
            if old is None:
                spec["kv"] = [*keys, key]
                self.live_store.put(f"job:{job_id}", spec)
            record = {"value": value, "version": (old["version"] if old else 0) + 1}
            self.live_store.put(name, record)
            try:
                self.live_store.write(None, [])
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc
                raise
            return job_kv.answer(key, record)

    def kv_get(self, principal: Principal, job_id: str, key: str) -> dict[str, Any] | None:
        """``GET /v1/jobs/{id}/kv/{key}``: the value, or ``None`` when not set (yet)."""
        job_kv.check_key(key)
        with self.lock:
            self._check_view()
            self._visible(principal, job_id)
            record = self.live_store.get(job_kv.record_key(job_id, key))
            return None if record is None else job_kv.answer(key, record)

    def _visible(self, principal: Principal, job_id: str) -> JobRecord:
        """The job, if ``principal`` may see it. A job it may not see is answered as one
        that does not exist (LSBE_NO_JOB, 404): no answer tells which job ids exist."""
        try:
            job = self._job(job_id)
        except UnknownJob:
            raise NoJob(f"job {job_id}") from None
        if not principal.may_act_on(job_id, job.user):
            raise NoJob(f"job {job_id}")
        return job

    def job_view(self, principal: Principal, job_id: str) -> dict[str, Any]:
        with self.lock:
            self._check_view()
            self._visible(principal, job_id)
            return self.job_json(job_id)

    def jobs_view(self, principal: Principal) -> list[dict[str, Any]]:
        with self.lock:
            self._check_view()
            return [
                self.job_json(j.id)
                for j in self.embedded.jobs()
                if principal.may_act_on(j.id, j.user)
            ]

    def job_json(self, job_id: str) -> dict[str, Any]:
        """Everything about one job, JSON-ready (the ``Job`` schema)."""
        with self.lock:
            job = self._job(job_id)
            view = self.embedded.job(job_id)
            spec = self.live_store.get(f"job:{job_id}") or {}
            tasks = []
            for tid, rec in sorted(job.task_states.items()):
                side = self.live_store.get(f"task:{job_id}:{tid}") or {}
                tasks.append(
                    {
                        "id": tid,
                        "host": rec.host,
                        "state": rec.state.value,
                        "pid": side.get("pid"),
                        "status": rec.status,
                        "reason": rec.reason,
                    }
                )
            status = self._hooks.resize_status(self, job_id) if self._opened else None
            usage = self._hooks.acct_usage(self, job_id, self.now()) if self._opened else None
            charged = 0
            if usage is not None and usage.segments and job.state is JobState.RUN:
                charged = usage.segments[-1].slots
            ending = self._ending.get(job_id)
            return {
                "id": job.id,
                "user": job.user,
                "state": job.state.value,
                "command": list(spec.get("argv", [])),
                "cwd": spec.get("cwd"),
                "min_tasks": job.min_tasks,
                "max_tasks": job.max_tasks,
                "ptile": job.ptile,
                "resizable": job.resizable,
                "grow_hosts": job.grow_hosts.value,
                "notify_cmd": job.notify_cmd,
                "submit_time": job.submit_time,
                "start_time": job.start_time,
                "end_time": job.end_time,
                "exit_reason": job.exit_reason,
                "ending": None
                if ending is None
                else {"state": ending[0].value, "reason": ending[1]},
                "version": job.version,
                "hosts": {h: n for h, n in _counts(job.tasks).items()},
                "allocation": [{"id": t.id, "host": t.host} for t in job.tasks],
                "held": [{"id": t.id, "host": t.host} for t in view.held],
                "tasks": tasks,
                "resize": None if status is None else converters.status_json(status),
                "accounting": {
                    "slot_seconds": 0.0 if usage is None else float(usage.slot_seconds),
                    "charged_slots": charged,
                    "resize_records": 0 if usage is None else len(usage.records),
                },
                "logs": str(self.job_dir(job_id)),
                "hostfile": str(self.job_dir(job_id) / "hostfile"),
                "notifications": [
                    {
                        "attempt": n.attempt,
                        "host": n.host,
                        "command": n.command,
                        "time": n.time,
                        "status": n.status,
                        "reason": n.reason,
                        "stdout": n.stdout,
                        "stderr": n.stderr,
                        "elapsed": n.elapsed,
                    }
                    for n in job.notifications
                ],
            }

    def cluster_json(self) -> dict[str, Any]:
        """Hosts, users, agents and the invariant check (the ``Cluster`` schema)."""
        with self.lock:
            self._check_view()
            workers = self.fleet.view()
            return {
                "epoch": self.live_store.epoch,
                "hosts": {
                    h: {**v, "worker": workers.get(h, {})}
                    for h, v in self.embedded.hosts_view().items()
                },
                "users": {
                    u: {**v, "limit": self.cfg.user_slots.get(u)}
                    for u, v in self.embedded.users_view().items()
                },
                "problems": self.check_invariants(),
            }

    def job_dir(self, job_id: str) -> Path:
        """Where a job's logs, hostfiles and (by default) working directory are."""
        return self.cfg.state_dir / "jobs" / job_id

    def _make_job_dir(self, job_id: str, account: Account) -> None:
        """The job's directory: the controller's (the agents write logs and hostfiles
        into it: a directory the job could change would let it redirect them), readable
        by the job's group (its owner's primary group)."""
        jdir = self.job_dir(job_id)
        jdir.mkdir(mode=0o750, exist_ok=True)
        os.chmod(jdir, 0o750)
        if self.euid == 0:
            os.chown(jdir, 0, account.gid)

    def _account(self, job: JobRecord, spec: Mapping[str, Any]) -> Account:
        """Who the job runs as: decided at submission (a job recorded by an older
        version is decided now; ``SubmitRejected`` when it cannot run)."""
        if "account" in spec:
            return parse_account(spec["account"])
        return job_account(job.user, single_user=self.cfg.single_user, euid=self.euid)

    def _new_job_id(self) -> str:
        counter = int(self.live_store.get("next_job_id") or 101)
        while self.embedded.record(str(counter)) is not None:
            counter += 1
        self.live_store.put("next_job_id", counter + 1)
        return str(counter)

    # =================================================================================
    # task processes: commands to the agents
    # =================================================================================

    def _runner_start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        if job_id in self._ending:
            self.embedded.task_start_failed(job_id, task.id, "the job is ending")
            return
        self._send_launch(self._job(job_id), task, env)

    def _send_launch(self, job: JobRecord, task: Task, alloc_env: Mapping[str, str]) -> None:
        job_id = job.id
        spec = self.live_store.get(f"job:{job_id}")
        if spec is None:
            self.embedded.task_start_failed(job_id, task.id, "no command recorded for the job")
            return
        try:
            account = self._account(job, spec)
        except (SubmitRejected, ValueError) as exc:
            self.embedded.task_start_failed(job_id, task.id, str(exc))
            return
        jdir = self.job_dir(job_id)
        # The job's directory is not writable by a job that runs as another user than
        # the controller's: such a job starts in its owner's home.
        cwd = spec.get("cwd") or (str(jdir) if account.uid == self.euid else account.home)
        command = {
            "op": "launch",
            "job": job_id,
            "task": task.id,
            "argv": spec["argv"],
            "user": account_json(account),
            "env": self._task_env(job, spec, task, alloc_env, account),
            "cwd": cwd,
            "stdout": str(jdir / f"task-{task.id}.out"),
            "stderr": str(jdir / f"task-{task.id}.err"),
        }
        host = self.live_store.get(f"host:{task.host}") or {}
        env = {k: v for k, v in command["env"].items() if k != TOKEN_ENV}
        self.live_store.put(
            f"task:{job_id}:{task.id}",
            {
                "host": task.host,
                # Without the token (never stored): a resend derives it again.
                "launch": {**command, "env": env},
                "pid": None,
                # Which agent could have received it (see worker_up).
                "instance": host.get("instance"),
                "gen": host.get("gen", 0),
            },
        )
        self.fleet.send(task.host, command)

    def _task_env(
        self,
        job: JobRecord,
        spec: Mapping[str, Any],
        task: Task,
        alloc: Mapping[str, str],
        account: Account,
    ) -> dict[str, str]:
        env = {k: os.environ[k] for k in ESSENTIAL_ENV if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(_account_env(account))
        env.update(job.env)
        env.update(alloc)
        jdir = self.job_dir(job.id)
        hostfile = str(jdir / "hostfile")
        env.update(self._identity(job, task, alloc, make_scratch(jdir, account, self.euid == 0)))
        if "TMPDIR" in job.env:
            env["TMPDIR"] = job.env["TMPDIR"]  # the owner's explicit choice wins
        env.update(
            {
                "XCE_JOB_ID": job.id,
                "LSB_JOBID": job.id,
                "XCE_TASK_ID": str(task.id),
                "XCE_HOSTNAME": task.host,
                "XCE_HOSTFILE": hostfile,
                "LSB_DJOB_HOSTFILE": hostfile,
                "XCE_TASKFILE": str(jdir / "tasks"),
                "LSB_DJOB_NUMPROC": str(len(alloc.get("LSB_HOSTS", "").split())),
                "LSB_RESIZABLE": "Y" if job.resizable else "N",
                "XCE_CONTROLLER_URL": self.cfg.controller_url,
                TOKEN_ENV: self._job_token(job.id, spec),
            }
        )
        return env

    def _identity(
        self, job: JobRecord, task: Task, alloc: Mapping[str, str], scratch: Path
    ) -> dict[str, str]:
        """The task's identity variables (:mod:`.task_env`): its index among the job's
        live tasks on its host, taken from their recorded launches."""
        others = [
            self.live_store.get(f"task:{job.id}:{tid}")
            for tid, rec in job.task_states.items()
            if tid != task.id and rec.host == task.host and rec.state in LIVE
        ]
        head = job.tasks[0].host if job.tasks else task.host
        return identity_env(
            task,
            local_task_id(recorded_local_ids(others)),
            alloc.get("LSB_HOSTS", "").split(),
            (job.min_tasks, job.max_tasks),
            self.fleet.address(head),
            scratch,
        )

    def _job_token(self, job_id: str, spec: Mapping[str, Any]) -> str:
        """The job's token, derived again (it is never stored); "" without a salt."""
        salt = spec.get(SALT_FIELD)
        return self._tokens.token(job_id, salt) if isinstance(salt, str) else ""

    def _with_token(self, launch: Mapping[str, Any]) -> dict[str, Any]:
        """A recorded launch command, with the job token its record leaves out."""
        job_id = str(launch["job"])
        spec = self.live_store.get(f"job:{job_id}") or {}
        return {**launch, "env": {**launch["env"], TOKEN_ENV: self._job_token(job_id, spec)}}

    def _runner_stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        # Never answers inside the call (the agent reports the exit), so nothing to mark
        # as "sync" for the recording.
        key = f"task:{job_id}:{task_id}"
        side = self.live_store.get(key)
        rec = self._job(job_id).task_states.get(task_id)
        host = side["host"] if side else rec.host if rec else None
        if host is None:
            return
        command = {"op": "stop", "job": job_id, "task": task_id, "grace": grace, "since": since}
        if side is not None:
            side["stop"] = {"grace": grace, "since": since}
            self.live_store.put(key, side)
        self.fleet.send(host, command)

    def _runner_notify(self, request: NotificationRequest, done: NotificationDone) -> None:
        spec = self.live_store.get(f"job:{request.job_id}") or {}
        try:
            account = self._account(self._job(request.job_id), spec)
        except (SubmitRejected, ValueError) as exc:
            done(NotificationResult(None, f"cannot run: {exc}"))
            return
        jdir = self.job_dir(request.job_id)
        env = {**_account_env(account), **request.env}
        hosts = env.get("LSB_HOSTS", "").split()
        version = env.get("XCE_ALLOC_VERSION", "next")
        # The notification sees the allocation the change would commit: a hostfile of
        # its own (the job's hostfile changes only at the commit).
        hostfile = jdir / f"hostfile.v{version}"
        atomic_write(hostfile, "".join(f"{h}\n" for h in hosts))
        env.update(
            {
                "XCE_HOSTFILE": str(hostfile),
                "LSB_DJOB_HOSTFILE": str(hostfile),
                "LSB_DJOB_NUMPROC": str(len(hosts)),
                "XCE_HOSTNAME": request.host,
                "XCE_CONTROLLER_URL": self.cfg.controller_url,
                TOKEN_ENV: self._job_token(request.job_id, spec),
            }
        )
        command = {
            "op": "notify",
            "job": request.job_id,
            "attempt": request.attempt,
            "user": account_json(account),
            "command": request.command,
            "env": env,
            "timeout": request.timeout,
            "cwd": str(jdir),
            "log": str(jdir / f"notify-{request.attempt}.log"),
        }
        self._notifying[(request.job_id, request.attempt)] = (request.host, command, done)
        self.fleet.send(request.host, command)

    def _write_hostfile(self, job_id: str, tasks: Sequence[Task]) -> None:
        """LSF's ``LSB_DJOB_HOSTFILE``: one line per task, the host's name; and the task
        file beside it, ``ID HOST`` per task (``XCE_TASKFILE``)."""
        atomic_write(self.job_dir(job_id) / "hostfile", "".join(f"{t.host}\n" for t in tasks))
        atomic_write(self.job_dir(job_id) / "tasks", task_file(tasks))

    def _before_commit(self, jobs: list[JobRecord]) -> None:
        """Called by the store before it writes these job records: a job that has just
        started gets its tasks' launches recorded in the same transaction."""
        for job in jobs:
            if job.state is not JobState.RUN:
                continue
            spec = self.live_store.get(f"job:{job.id}")
            if spec is None:
                self._broken.add(job.id)
                continue
            if spec.get("launched"):
                continue
            spec["launched"] = True
            self.live_store.put(f"job:{job.id}", spec)
            tasks = job.versions[0].tasks if job.versions else job.tasks
            self._write_hostfile(job.id, tasks)
            env = allocation_env(tasks, 0, job.resizable)
            for task in tasks:
                self._send_launch(job, task, env)

    # =================================================================================
    # agent events and reconciliation (FleetOwner; called from the channel threads)
    # =================================================================================

    def worker_events(self, host: str, events: Sequence[Mapping[str, Any]]) -> None:
        # While the state cannot be written the agent's events wait here (applied
        # after the recovery's reconciliation, they change nothing it did not see).
        if not self._await_writable():
            return
        try:
            with self.lock:
                if self.fenced is not None or self.failing is not None:
                    return
                for event in events:
                    self._on_event(host, event)
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc, f"applying the events of {host}")
        self._wake.set()

    def worker_down(self, host: str, queued: Queued) -> None:
        """The host's agent is dead or unheard: the host fails (:meth:`_host_lost`)."""
        try:
            with self.lock:
                if self.fenced is not None or not self._reconciling():
                    return
                self._host_lost(host, f"lost: the agent of {host} died or went unheard")
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc)
        self._wake.set()

    def worker_up(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        """Reconcile this host's tasks with the agent's snapshot (see the module doc)."""
        try:
            with self.lock:
                if self.fenced is not None or not self._reconciling():
                    return
                self._reconcile(host, snapshot, queued)
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc)
        self._wake.set()

    def _await_writable(self) -> bool:
        """Wait while the state cannot be written; ``False`` once the controller stops."""
        while not self._writable.wait(TICK):
            if self._stopping.is_set():
                return False
        return True

    def _reconciling(self) -> bool:
        """Whether an agent's state may be reconciled now: always, except while the
        state cannot be written — then only by the recovery (:meth:`_recover`), which
        reconciles every agent with the state read back from the disk. (A channel
        calls this holding its own lock: it must not wait here.)"""
        return self.failing is None or threading.get_ident() == self._loop_ident

    def _reconcile(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        instance = str(snapshot["instance"])
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        if record.get("instance") not in (None, instance):
            # The agent was replaced while nobody watched: the host failed.
            self._host_lost(host, f"lost: the agent of {host} was replaced")
            record = self.live_store.get(f"host:{host}") or record
        same = record.get("instance") == instance
        known = {(str(t["job"]), int(t["task"])): t for t in snapshot.get("tasks", [])}
        # A host failing at the start loses its tasks then (_settle_hosts): the agent
        # stops what it still runs of them.
        failing = host in self._down_pending
        for job in self.embedded.records():
            if job.finished or failing:
                continue
            for tid, rec in list(job.task_states.items()):
                if rec.host != host or rec.state not in LIVE:
                    continue
                key = (job.id, tid)
                entry = known.pop(key, None)
                side = self.live_store.get(f"task:{job.id}:{tid}") or {}
                if entry is not None:
                    self._sync(host, job.id, tid, entry)
                    stop = side.get("stop")
                    if rec.state is TaskState.STOPPING and stop and entry["state"] == "running":
                        self.fleet.send(host, {"op": "stop", "job": job.id, "task": tid, **stop})
                    continue
                if ("launch", job.id, tid) in queued:
                    continue  # still to be sent: the agent will get it
                never_sent = same or (
                    record.get("instance") is None and side.get("gen", -1) == record.get("gen", 0)
                )
                if never_sent and side.get("launch"):
                    log.info("resending the launch of %s.%s to %s", job.id, tid, host)
                    self.fleet.send(host, self._with_token(side["launch"]))
                    if rec.state is TaskState.STOPPING and side.get("stop"):
                        self.fleet.send(
                            host, {"op": "stop", "job": job.id, "task": tid, **side["stop"]}
                        )
                    continue
                self._task_lost(job, tid, rec, f"lost: the agent of {host} does not know it")
        for (job_id, tid), entry in known.items():
            if entry.get("state") in ("running", "stopping"):
                log.warning("%s: stopping task %s.%s that no job owns", host, job_id, tid)
                self.fleet.send(
                    host, {"op": "stop", "job": job_id, "task": tid, "grace": 0.0, "since": None}
                )
        for key2, (nhost, command, done) in list(self._notifying.items()):
            if nhost != host or ("notify", *key2) in queued:
                continue
            if same:
                self.fleet.send(host, command)  # idempotent per (job, attempt) on the agent
            else:
                del self._notifying[key2]
                done(NotificationResult(None, f"lost: the agent of {host} was replaced"))
        self.live_store.put(
            f"host:{host}", {**record, "instance": instance, "gen": int(record.get("gen", 0)) + 1}
        )
        if self._opened:
            self._host_back(host)

    def _task_lost(self, job: JobRecord, tid: int, rec: TaskRecord, why: str) -> None:
        log.warning("job %s task %s on %s: %s", job.id, tid, rec.host, why)
        if rec.state is TaskState.STARTING:
            self.embedded.task_start_failed(job.id, tid, why)
        else:
            self.embedded.task_exited(job.id, tid, None, why)
        if tid == 0:
            self._begin_end(job.id, JobState.EXIT, f"task 0 {why}")

    def _sync(self, host: str, job_id: str, tid: int, entry: Mapping[str, Any]) -> None:
        """Replay an agent's view of a task as the events that lead to it."""
        state = entry.get("state")
        if state == "failed":
            self._on_event(
                host,
                {"kind": "start_failed", "job": job_id, "task": tid, "reason": entry["reason"]},
            )
            return
        self._on_event(host, {"kind": "started", "job": job_id, "task": tid, "pid": entry["pid"]})
        if state == "exited":
            self._on_event(
                host,
                {
                    "kind": "exited",
                    "job": job_id,
                    "task": tid,
                    "status": entry.get("status"),
                    "reason": entry.get("reason", ""),
                },
            )

    def _on_event(self, host: str, event: Mapping[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "notify_done":
            nkey = (str(event["job"]), int(event["attempt"]))
            pending = self._notifying.pop(nkey, None)
            if pending is None:
                log.info("late result of notification %s.%s ignored", *nkey)
                return
            pending[2](
                NotificationResult(
                    event.get("status"),
                    str(event.get("reason", "")),
                    str(event.get("stdout", "")),
                    str(event.get("stderr", "")),
                    float(event.get("elapsed", 0.0)),
                )
            )
            return
        job_id, tid = str(event["job"]), int(event["task"])
        job = self.embedded.record(job_id)
        rec = job.task_states.get(tid) if job is not None else None
        if job is None or rec is None or rec.host != host:
            log.debug("%s: event for unknown task %s.%s ignored", host, job_id, tid)
            return
        if kind == "started":
            key = f"task:{job_id}:{tid}"
            side = self.live_store.get(key)
            if side is not None and side.get("pid") != event.get("pid"):
                side["pid"] = event.get("pid")
                self.live_store.put(key, side)
            self.embedded.task_started(job_id, tid)
        elif kind == "start_failed":
            reason = str(event.get("reason", ""))
            if rec.state is TaskState.STARTING:
                self.embedded.task_start_failed(job_id, tid, reason)
            elif rec.state in LIVE:
                # A task the job started with (the controller counts those as running
                # from the start): it never ran.
                self.embedded.task_exited(job_id, tid, None, f"start failed: {reason}")
            if tid == 0:
                self._begin_end(job_id, JobState.EXIT, f"task 0 failed to start: {reason}")
        elif kind == "exited":
            status = event.get("status")
            reason = str(event.get("reason", ""))
            if rec.state is TaskState.STARTING:
                self.embedded.task_started(job_id, tid)
            self.embedded.task_exited(job_id, tid, status, reason)
            if tid == 0:
                if status == 0:
                    self._begin_end(job_id, JobState.DONE, "done")
                else:
                    self._begin_end(job_id, JobState.EXIT, f"task 0 ended: {reason}")

    # =================================================================================
    # job ends
    # =================================================================================

    def _begin_end(self, job_id: str, state: JobState, reason: str) -> None:
        """The job is over: stop its other tasks; :meth:`_finish_endings` ends it once
        none is left (slots are freed only after the processes are gone)."""
        if job_id in self._ending:
            return
        job = self.embedded.record(job_id)
        if job is None or job.state is not JobState.RUN:
            return
        self._ending[job_id] = (state, reason)
        key = f"job:{job_id}"
        spec = dict(self.live_store.get(key) or {})
        spec["ending"] = [state.value, reason]
        self.live_store.put(key, spec)
        live = [
            tid
            for tid, rec in job.task_states.items()
            if rec.state in (TaskState.STARTING, TaskState.RUNNING)
        ]
        for observer in self._observers:
            observer.job_over(job_id, state, reason, live, self.cfg.kill_grace)
        if live:
            self.stop_tasks(job_id, live, self.cfg.kill_grace)
        self._wake.set()

    def _finish_endings(self) -> None:
        for job_id in sorted(self._broken):
            self._broken.discard(job_id)
            self._begin_end(job_id, JobState.EXIT, "no command recorded for the job")
        for job_id in list(self._ending):
            job = self.embedded.record(job_id)
            if job is None or job.finished:
                self._ending.pop(job_id, None)
                continue
            if any(rec.state in LIVE for rec in job.task_states.values()):
                continue
            state, reason = self._ending.pop(job_id)
            hosts = sorted({rec.host for rec in job.task_states.values()})
            if state is JobState.PEND:
                self._requeue(job_id, hosts)
                continue
            # Over since its tasks are gone: the embedded controller frees its slots,
            # sets its state and calls xce_job_end.
            end = self.embedded.finish if state is JobState.DONE else self.embedded.kill
            end(job_id, reason)
            key = f"job:{job_id}"
            spec = dict(self.live_store.get(key) or {})
            spec["ended"] = True
            self.live_store.put(key, spec)
            for host in hosts:
                self.fleet.send(host, {"op": "forget", "job": job_id})
            remove_scratch(self.job_dir(job_id))
            for kv_key in spec.get("kv", []):
                self.live_store.put(job_kv.record_key(job_id, kv_key), None)  # with the end
            self.embedded.flush()

    def _requeue(self, job_id: str, hosts: Sequence[str]) -> None:
        """A job that a host failure requeued has no process left: back to the queue
        (the embedded controller frees its slots); it starts again from scratch, with a
        new launch of every task, and the key-value store of its first run dropped."""
        key = f"job:{job_id}"
        spec = dict(self.live_store.get(key) or {})
        for kv_key in spec.pop("kv", []):
            self.live_store.put(job_kv.record_key(job_id, kv_key), None)
        spec.pop("ending", None)
        spec["launched"] = False
        self.live_store.put(key, spec)  # written with the requeue, in one transaction
        self.embedded.requeue(job_id)
        for host in hosts:
            self.fleet.send(host, {"op": "forget", "job": job_id})
        remove_scratch(self.job_dir(job_id))
        self.embedded.flush()


def _open_state(cfg: LiveConfig) -> tuple[LiveStore, JobTokens]:
    """The checked state directory: the store (started: the epoch is taken) and the
    job token key, or the error that names what is wrong.

    The checks (:mod:`.state_check`) only read and come before the epoch, so a refused
    start changes nothing and leaves a controller still running on the directory be.
    """
    journal_dir = cfg.state_dir / JOURNAL_DIR
    if cfg.verify_journal:
        check_journal(journal_dir)
    store = LiveStore(cfg.state_dir / "controller", start=False)
    try:
        cross_check(store.load(), journal_dir, store.data_file)
        tokens = JobTokens.load(cfg.state_dir, store.get(FINGERPRINT_KEY))
        store.start()
        if store.get(FINGERPRINT_KEY) is None:
            store.put(FINGERPRINT_KEY, tokens.fingerprint)
    except BaseException:
        store.close()
        raise
    return store, tokens


def _account_env(account: Account) -> dict[str, str]:
    """What a login would set for the job's user (the controller's own are not the job's
    when it runs as its owner)."""
    return {"HOME": account.home, "USER": account.name, "LOGNAME": account.name}


def _counts(tasks: Sequence[Task]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t.host] = out.get(t.host, 0) + 1
    return out
