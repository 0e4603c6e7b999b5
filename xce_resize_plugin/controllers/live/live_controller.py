"""The live controller: the embedded controller on the wall clock, with real processes.

:class:`LiveController` holds an
:class:`~xce_resize_plugin.controllers.sim.sim_controller.EmbeddedController`
(:attr:`LiveController.embedded`: same scheduler, ledger, hook order and invariants)
and gives it what differs:

- a wall clock, and a loop thread that runs scheduler and dispatch cycles (``settle``)
  whenever something happened (a request, a worker event) and at least every
  :data:`TICK` seconds, and drops the finished jobs kept ``finished_job_keep`` seconds;
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

**In layers.** The class is built on eight layers, one module each (:mod:`.live_state`,
:mod:`.task_commands`, :mod:`.protocol`, :mod:`.job_ends`, :mod:`.generations`,
:mod:`.agents`, :mod:`.hook_monitor`, :mod:`.host_api`; see :mod:`.live_state`). This
module adds the top one: construction, open and shutdown, recovery, and the loop.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time

import pluggy

from xce_resize_plugin.controllers.live.cgroups import DEFAULT_PIDS_MAX
from xce_resize_plugin.controllers.live.controller_lock import ControllerLock
from xce_resize_plugin.controllers.live.host_api import HostApi
from xce_resize_plugin.controllers.live.job_tokens import FINGERPRINT_KEY, JobTokens
from xce_resize_plugin.controllers.live.live_state import (
    CRASH_ENV,
    CRASH_POINTS,
    FENCE_CHECK,
    STORAGE_RETRY,
    TICK,
)
from xce_resize_plugin.controllers.live.live_store import Lease, LiveStore
from xce_resize_plugin.controllers.live.path_check import unsafe_path_entries
from xce_resize_plugin.controllers.live.scratch_trash import TrashRemover
from xce_resize_plugin.controllers.live.settings import (
    LiveConfig,
    first_unprivileged_port,
    takeable_port,
)
from xce_resize_plugin.controllers.live.state_check import JOURNAL_DIR, check_journal, cross_check
from xce_resize_plugin.controllers.live.storage_faults import storage_failure
from xce_resize_plugin.controllers.live.tasks import WorkerFleet
from xce_resize_plugin.controllers.live.wall_clock import WallClock
from xce_resize_plugin.controllers.observer import LiveObserver, Observer
from xce_resize_plugin.controllers.runners import DEFAULT_PATH
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.host import HostHooks
from xce_resize_plugin.journal.lmdb_env import PRIVATE_DIR, private_dir, restrict_mode

log = logging.getLogger(__name__)


def _worker_options(cfg: LiveConfig) -> list[str]:
    """The ``[worker]`` settings on the agents' command line, those that are not the
    defaults only: an agent of an earlier version (its Python's installed copy of the
    package) still starts for a configuration that does not use them."""
    options = []
    if cfg.containment != "auto":
        options.append(f"--containment={cfg.containment}")
    if cfg.task_pids_max != DEFAULT_PIDS_MAX:
        options.append(f"--task-pids-max={cfg.task_pids_max}")
    return options


class LiveController(HostApi):
    """See the module docstring. Construct, then :meth:`open`; :meth:`shutdown` at the end.

    :param plugin_manager: the manager (with the resize plugin registered).
    :param cfg: the checked configuration.
    """

    def __init__(self, plugin_manager: pluggy.PluginManager, cfg: LiveConfig) -> None:
        self.cfg = cfg
        self.lock = ControllerLock()
        self._calls = threading.local()
        self.fenced = None
        self.on_fenced = None
        self._pm = plugin_manager
        self._hooks = HostHooks(plugin_manager)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._loop_thread = None
        self._loop_ident = None
        self._ending = {}
        self._notifying = {}
        self._broken = {}
        self._down_pending = set()
        self._opened = False
        self._observers = []
        self.failing = None
        self._failure_seen = None
        self._writable = threading.Event()
        self._writable.set()
        self._stale = False
        self.resize_observer = None
        self._crash_at = os.environ.get(CRASH_ENV) or None
        if self._crash_at is not None and self._crash_at not in CRASH_POINTS:
            raise ValueError(f"{CRASH_ENV}={self._crash_at}: not one of {', '.join(CRASH_POINTS)}")
        self.euid = os.geteuid()
        self.wall_clock = WallClock()
        self._trash = TrashRemover()
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
                worker_options=_worker_options(cfg),
            )
            self.live_store.before_commit = self._before_commit
            self.live_store.after_commit = self.fleet.release
            with self.lock:
                self._lease = Lease(self.live_store)
                self.embedded = self._new_embedded(self._lease)
                self._resume_stops()
        except BaseException:
            self.live_store.close()
            raise
        self._read_side()
        # What an earlier controller moved aside and did not remove (it stopped first).
        self._trash.sweep(cfg.state_dir / "jobs")
        self._undo_monitor = plugin_manager.add_hookcall_monitoring(
            self._before_hook, self._after_hook
        )

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
        warning = takeable_port(self.cfg, self.euid, first_unprivileged_port())
        if warning is not None:
            log.warning("%s", warning)
        for unsafe in unsafe_path_entries(DEFAULT_PATH):
            log.warning("the PATH of other users' jobs: %s", unsafe)
        for path in (state, *state.parents):
            mode = path.stat().st_mode
            if not mode & stat.S_IXOTH:
                where = f"{self.cfg.path}: " if self.cfg.path else ""
                raise ConfigError(
                    f"{where}controller.state_dir: {path} (mode {stat.S_IMODE(mode):04o}) "
                    "cannot be searched by other users, and jobs run as their owners: they "
                    "could not read their hostfiles (give it o+x, or use another directory)"
                )

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

    # -- when the state cannot be written ----------------------------------------------

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
                        self._drop_finished()
                    if now - last_check >= FENCE_CHECK:
                        last_check = now
                        self.live_store.check_epoch()
                        self.fleet.reap()
            except (Exception, SystemExit) as exc:
                # SystemExit too: raised in this thread (a site's code calling
                # sys.exit()), it would end the loop without a word while the server
                # goes on answering; it is a bug of the cycle, logged, as any other.
                if self._on_error(exc):
                    return

    # -- hook calls hold the controller lock (see the module docstring) -------------------


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
        next_id = store.get("next_job_id")
        next_job_id = next_id if isinstance(next_id, int) and next_id > 0 else 101
        cross_check(store.load(), journal_dir, store.data_file, next_job_id)
        tokens = JobTokens.load(cfg.state_dir, store.get(FINGERPRINT_KEY))
        store.start()
        if store.get(FINGERPRINT_KEY) is None:
            store.put(FINGERPRINT_KEY, tokens.fingerprint)
    except BaseException:
        store.close()
        raise
    return store, tokens
