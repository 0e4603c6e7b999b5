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

**Durability before action.** Commands to agents are queued in the fleet's outbox and
released only after the store write that records them (see :mod:`.tasks`), so a
restarted controller's records are never behind what the agents were told.

**Restart.** A new controller on the same state directory takes the next epoch (the old
one's writes fail, it stops), connects to the agents (starting missing ones),
reconciles every live task with what its agent reports, and only then calls
``xce_controller_start`` (docs/live-controller.md lists every case).

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

import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import pluggy
from pluggy import HookImpl

from xce_resize_plugin.controllers.jobs import JobRecord, TaskRecord, TaskState
from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.controllers.live.proc import atomic_write
from xce_resize_plugin.controllers.live.settings import LiveConfig
from xce_resize_plugin.controllers.live.submission import parse_submission
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
from xce_resize_plugin.controllers.violations import UnknownJob
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.models import JobState, Task, allocation_env
from xce_resize_plugin.errors import (
    FencedError,
    JobFinished,
    JournalError,
    NoJob,
    PermissionDenied,
    ResizeError,
)
from xce_resize_plugin.host import HostHooks, Principal, ResizeObserver

log = logging.getLogger(__name__)

#: The loop runs at least this often (seconds), and at once when woken.
TICK = 0.1
#: How often the loop checks that no newer controller took the state directory.
FENCE_CHECK = 0.5
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


class SubmitRejected(ResizeError):
    """The host refused a job submission (bad options, a job that could never start)."""

    code = "XCE_SUBMIT_REJECTED"
    message = "Job submission rejected"
    http_status = 400


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
        self.lock = threading.RLock()
        self.fenced: BaseException | None = None
        self.on_fenced: Callable[[], None] | None = None
        self._pm = plugin_manager
        self._hooks = HostHooks(plugin_manager)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._loop_ident: int | None = None
        self._ending: dict[str, tuple[JobState, str]] = {}
        self._job_tokens: dict[str, str] = {}
        self._notifying: dict[tuple[str, int], tuple[str, dict[str, Any], NotificationDone]] = {}
        self._broken: set[str] = set()
        self._opened = False
        self._observers: list[LiveObserver] = []
        #: What the plugin tells of its work (metrics); set before :meth:`open`.
        self.resize_observer: ResizeObserver | None = None
        self._crash_at = os.environ.get(CRASH_ENV) or None
        if self._crash_at is not None and self._crash_at not in CRASH_POINTS:
            raise ValueError(f"{CRASH_ENV}={self._crash_at}: not one of {', '.join(CRASH_POINTS)}")
        cfg.state_dir.mkdir(parents=True, exist_ok=True)
        self.live_store = LiveStore(cfg.state_dir / "controller")
        try:
            self.fleet = WorkerFleet(
                cfg.state_dir,
                [h for h, _ in cfg.hosts],
                self.live_store.epoch,
                manage=cfg.manage_workers,
                start_timeout=cfg.worker_timeout,
            )
            self.live_store.before_commit = self._before_commit
            self.live_store.after_commit = self.fleet.release
            with self.lock:
                #: The controller machinery (scheduler, ledger, hook order, invariants),
                #: on the wall clock, with this controller's lock, runners and store.
                self.embedded = EmbeddedController(
                    plugin_manager,
                    cfg.state_dir,
                    list(cfg.hosts),
                    config=cfg.resize,
                    user_slots=cfg.user_slots,
                    store=self.live_store,
                    clock=WallClock(),
                    task_runner=LiveTaskRunner(self._runner_start, self._runner_stop),
                    notification_runner=LiveNotificationRunner(self._runner_notify),
                    protect_reservation=True,
                    autostart=False,
                    lock=self.lock,
                    hook_controller=self,
                    resume_tasks=False,
                )
                self._resume_stops()
        except BaseException:
            self.live_store.close()
            raise
        for key in self.live_store.keys("job:"):
            spec = self.live_store.get(key)
            job_id = key[len("job:") :]
            if spec.get("token"):
                self._job_tokens[spec["token"]] = job_id
            ending = spec.get("ending")
            if ending and not spec.get("ended"):
                self._ending[job_id] = (JobState(ending[0]), str(ending[1]))
        self._undo_monitor = plugin_manager.add_hookcall_monitoring(
            self._before_hook, self._after_hook
        )

    # =================================================================================
    # lifecycle
    # =================================================================================

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
        """Connect to (or start) the agents, reconcile, start the plugin and the loop."""
        self.fleet.owner = self
        missing = self.fleet.connect_all(self.cfg.worker_timeout)
        if missing:
            log.warning("no agent yet for %s; their tasks wait", ", ".join(missing))
        with self.lock:
            for job in self.embedded.records():
                if job.state is JobState.RUN:
                    self._write_hostfile(job.id, job.tasks)
            self.embedded.start()
            self._opened = True
            for observer in self._observers:
                observer.controller_started()
        self.fleet.start_threads()
        self._loop_thread = threading.Thread(target=self._loop, name="controller-loop", daemon=True)
        self._loop_thread.start()

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
                if self.fenced is None:
                    self.embedded.stop()
                    # The plugin's journal is complete now (a recording writes its last
                    # facts, then the line that says the run ended cleanly).
                    clean = self._opened
                else:
                    # Fenced: no more writes; only release the plugin's journal handle.
                    try:
                        self._hooks.controller_stop(self)
                    except Exception:  # the journal may refuse, it is fenced too
                        log.debug("xce_controller_stop after fencing", exc_info=True)
            finally:
                try:
                    for observer in self._observers:
                        observer.controller_closed(clean)
                finally:
                    self.live_store.close()
                    self._undo_monitor()

    def fence(self, reason: BaseException) -> None:
        """A newer controller took over (or the state cannot be written): stop at once.

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
        if self.fenced is not None:
            raise ControllerStopping(f"fenced: {self.fenced}")
        if self._stopping.is_set():
            raise ControllerStopping("shutting down")

    def _loop(self) -> None:
        self._loop_ident = threading.get_ident()
        last_check = 0.0
        while not self._stopping.is_set():
            self._wake.wait(TICK)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                with self.lock:
                    self._finish_endings()
                    self.embedded.settle()
                    self._finish_endings()
                    now = time.monotonic()
                    if now - last_check >= FENCE_CHECK:
                        last_check = now
                        self.live_store.check_epoch()
                        self.fleet.reap()
            except (JournalError, ControllerStopping) as exc:
                # The plugin's journal or our state cannot be written any more (fenced
                # by a newer controller, or broken): a controller must not go on.
                self.fence(exc)
                return
            except Exception as exc:
                if isinstance(exc.__cause__, FencedError):
                    self.fence(exc.__cause__)
                    return
                log.exception("controller cycle failed")

    # -- hook calls hold the controller lock (see the module docstring) -------------------

    def _before_hook(self, hook_name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        self.lock.acquire()

    def _after_hook(
        self,
        outcome: pluggy.Result[Any],
        hook_name: str,
        impls: Sequence[HookImpl],
        kwargs: Mapping[str, Any],
    ) -> None:
        error = outcome.exception
        try:
            if self.fenced is None and not isinstance(error, FencedError):
                # Nothing of ours happened once a newer controller owns the journal.
                for observer in self._observers:
                    observer.hook_returned(hook_name, kwargs, error)
        finally:
            self.lock.release()
        if hook_name == "xce_resize_request" and error is None:
            self._crash("after-request")
        if threading.get_ident() != self._loop_ident:
            self._wake.set()  # e.g. a resize request: place it now, not at the next tick
        if isinstance(error, FencedError):
            self.fence(error)

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
        with self.lock:
            job_id = self._job_tokens.get(token)
            job = self.embedded.record(job_id) if job_id is not None else None
            if job is None or job.finished:
                return None
            return Principal(job.user, admin=False, job_id=job.id)

    # The plugin calls the methods below from inside its hooks, whose calls hold the
    # lock (the hook-call monitor): the crash points come before any other input.

    reserve_slots = _forward(EmbeddedController.reserve_slots, crash="after-reserve")
    free_slots = _forward(EmbeddedController.free_slots)
    launch_tasks = _forward(EmbeddedController.launch_tasks, crash="after-launch")
    stop_tasks = _forward(EmbeddedController.stop_tasks, crash="after-stop")
    run_notification = _forward(EmbeddedController.run_notification, crash="after-notify")

    def commit_allocation(self, job_id: str, tasks: Sequence[Task], version: int) -> None:
        with self.lock:
            before = self._job(job_id).version
            self.embedded.commit_allocation(job_id, tasks, version)
            job = self._job(job_id)
            if job.version != before:
                # Every committed change rewrites the hostfile, atomically.
                self._write_hostfile(job_id, job.tasks)
                self._crash("after-commit")

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
        with self.lock:
            self._check_open()
            job_id = self._new_job_id()
            token = secrets.token_urlsafe(32)
            key = f"job:{job_id}"
            self.live_store.put(
                key,
                {
                    "argv": list(sub.command),
                    "cwd": sub.cwd,
                    "token": token,
                    "launched": False,
                },
            )
            try:
                self.embedded.submit_job(principal.name, sub.tasks, sub, env=sub.env, job_id=job_id)
            except ResizeError:
                self.live_store.put(key, None)
                raise
            except Exception as exc:
                self.live_store.put(key, None)
                if isinstance(exc.__cause__, FencedError) or isinstance(exc, FencedError):
                    raise
                raise SubmitRejected(str(exc)) from exc
            self._job_tokens[token] = job_id
        self._wake.set()
        return {"id": job_id, "token": token, "job": self.job_json(job_id)}

    def kill_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``."""
        with self.lock:
            self._check_open()
            job = self._visible(principal, job_id)
            if job.finished:
                raise JobFinished(f"job {job_id} is {job.state.value}")
            self.kill(job_id, f"killed by {principal.name}")
        self._wake.set()
        return self.job_json(job_id)

    def _visible(self, principal: Principal, job_id: str) -> JobRecord:
        try:
            job = self._job(job_id)
        except UnknownJob:
            raise NoJob(f"job {job_id}") from None
        if not principal.may_act_on(job_id, job.user):
            raise PermissionDenied(f"{principal.name} may not act on job {job_id}")
        return job

    def job_view(self, principal: Principal, job_id: str) -> dict[str, Any]:
        with self.lock:
            self._visible(principal, job_id)
            return self.job_json(job_id)

    def jobs_view(self, principal: Principal) -> list[dict[str, Any]]:
        with self.lock:
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
        jdir = self.job_dir(job_id)
        command = {
            "op": "launch",
            "job": job_id,
            "task": task.id,
            "argv": spec["argv"],
            "env": self._task_env(job, spec, task, alloc_env),
            "cwd": spec.get("cwd") or str(jdir),
            "stdout": str(jdir / f"task-{task.id}.out"),
            "stderr": str(jdir / f"task-{task.id}.err"),
        }
        host = self.live_store.get(f"host:{task.host}") or {}
        self.live_store.put(
            f"task:{job_id}:{task.id}",
            {
                "host": task.host,
                "launch": command,
                "pid": None,
                # Which agent could have received it (see worker_up).
                "instance": host.get("instance"),
                "gen": host.get("gen", 0),
            },
        )
        self.fleet.send(task.host, command)

    def _task_env(
        self, job: JobRecord, spec: Mapping[str, Any], task: Task, alloc: Mapping[str, str]
    ) -> dict[str, str]:
        env = {k: os.environ[k] for k in ESSENTIAL_ENV if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.update(job.env)
        env.update(alloc)
        hostfile = str(self.job_dir(job.id) / "hostfile")
        env.update(
            {
                "XCE_JOB_ID": job.id,
                "LSB_JOBID": job.id,
                "XCE_TASK_ID": str(task.id),
                "XCE_HOSTNAME": task.host,
                "XCE_HOSTFILE": hostfile,
                "LSB_DJOB_HOSTFILE": hostfile,
                "LSB_DJOB_NUMPROC": str(len(alloc.get("LSB_HOSTS", "").split())),
                "LSB_RESIZABLE": "Y" if job.resizable else "N",
                "XCE_CONTROLLER_URL": self.cfg.controller_url,
                "XCE_JOB_TOKEN": str(spec["token"]),
            }
        )
        return env

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
        jdir = self.job_dir(request.job_id)
        env = dict(request.env)
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
                "XCE_JOB_TOKEN": str(spec.get("token", "")),
            }
        )
        command = {
            "op": "notify",
            "job": request.job_id,
            "attempt": request.attempt,
            "command": request.command,
            "env": env,
            "timeout": request.timeout,
            "cwd": str(jdir),
            "log": str(jdir / f"notify-{request.attempt}.log"),
        }
        self._notifying[(request.job_id, request.attempt)] = (request.host, command, done)
        self.fleet.send(request.host, command)

    def _write_hostfile(self, job_id: str, tasks: Sequence[Task]) -> None:
        """LSF's ``LSB_DJOB_HOSTFILE``: one line per task, the host's name."""
        atomic_write(self.job_dir(job_id) / "hostfile", "".join(f"{t.host}\n" for t in tasks))

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
        try:
            with self.lock:
                if self.fenced is not None:
                    return
                for event in events:
                    self._on_event(host, event)
                self.embedded.flush()
        except JournalError as exc:
            self.fence(exc)
        except Exception as exc:
            if isinstance(exc.__cause__, FencedError):
                self.fence(exc.__cause__)
            else:
                log.exception("events of %s could not be applied", host)
        self._wake.set()

    def worker_down(self, host: str, queued: Queued) -> None:
        """The host's agent is dead: its tasks are lost (see docs/live-controller.md)."""
        try:
            with self.lock:
                if self.fenced is not None:
                    return
                self._host_lost(host, queued, f"lost: the agent of {host} died")
                self.embedded.flush()
        except JournalError as exc:
            self.fence(exc)
        self._wake.set()

    def worker_up(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        """Reconcile this host's tasks with the agent's snapshot (see the module doc)."""
        try:
            with self.lock:
                if self.fenced is not None:
                    return
                self._reconcile(host, snapshot, queued)
                self.embedded.flush()
        except JournalError as exc:
            self.fence(exc)
        self._wake.set()

    def _reconcile(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        instance = str(snapshot["instance"])
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        if record.get("instance") not in (None, instance):
            # The agent was replaced while nobody watched: the old one's tasks are lost.
            self._host_lost(host, queued, f"lost: the agent of {host} was replaced")
            record = self.live_store.get(f"host:{host}") or record
        same = record.get("instance") == instance
        known = {(str(t["job"]), int(t["task"])): t for t in snapshot.get("tasks", [])}
        for job in self.embedded.records():
            if job.finished:
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
                    self.fleet.send(host, side["launch"])
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
            f"host:{host}", {"instance": instance, "gen": int(record.get("gen", 0)) + 1}
        )

    def _host_lost(self, host: str, queued: Queued, why: str) -> None:
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        for job in self.embedded.records():
            if job.finished:
                continue
            for tid, rec in list(job.task_states.items()):
                if rec.host == host and rec.state in LIVE and ("launch", job.id, tid) not in queued:
                    side = self.live_store.get(f"task:{job.id}:{tid}") or {}
                    if record.get("instance") is None and side.get("gen", -1) == record.get(
                        "gen", 0
                    ):
                        continue  # recorded while no agent was up: never sent anywhere
                    self._task_lost(job, tid, rec, why)
        for key, (nhost, _, done) in list(self._notifying.items()):
            if nhost == host and ("notify", *key) not in queued:
                del self._notifying[key]
                done(NotificationResult(None, why))
        if record.get("instance") is not None:
            self.live_store.put(f"host:{host}", {**record, "instance": None})

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
            self.embedded.flush()


def _counts(tasks: Sequence[Task]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t.host] = out.get(t.host, 0) + 1
    return out
