"""The live controller's state, and the steps every part of it takes.

:class:`~.live_controller.LiveController` is built in layers, each a class in its own
module that adds one concern to the ones below it (docs/architecture.md, "The live
controller in layers"):

1. :class:`LiveState` (this module): what the controller holds, its constants, job
   lookups and visibility, job directories, the crash points;
2. :class:`~.task_commands.TaskCommands`: the embedded controller's task and
   notification runners as commands to the agents, and the tasks' environment;
3. :class:`~.protocol.ControllerProtocol`: the Controller protocol the plugin calls,
   forwarded to the embedded controller with tokens, hostfiles and crash points;
4. :class:`~.job_ends.JobEnds`: a job's end, its other tasks stopped first;
5. :class:`~.generations.Generations`: fencing, and going back to the disk when the
   state cannot be written;
6. :class:`~.agents.Agents`: the agents' events, reconciliation, lost and returning
   hosts;
7. :class:`~.hook_monitor.HookMonitor`: every hook call under the lock, and durable
   waits that hand it over;
8. :class:`~.host_api.HostApi`: what the host REST routes call (submissions, kills,
   host commands, job key-values, views);
9. :class:`~.live_controller.LiveController`: construction, open and shutdown, and the
   loop.

A layer calls only what it or a layer below defines. The attributes are declared here,
once, and set by the constructor.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pluggy

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live.controller_lock import ControllerLock
from xce_resize_plugin.controllers.live.job_tokens import JobTokens
from xce_resize_plugin.controllers.live.live_store import Lease, LiveStore
from xce_resize_plugin.controllers.live.proc import (
    OWN_JOB_DIR,
    SHARED_JOB_DIR,
    Account,
    parse_account,
)
from xce_resize_plugin.controllers.live.scratch_trash import TrashRemover
from xce_resize_plugin.controllers.live.settings import LiveConfig
from xce_resize_plugin.controllers.live.storage_faults import StateNotWritable
from xce_resize_plugin.controllers.live.submission import job_account
from xce_resize_plugin.controllers.live.tasks import WorkerFleet
from xce_resize_plugin.controllers.live.wall_clock import WallClock
from xce_resize_plugin.controllers.observer import LiveObserver
from xce_resize_plugin.controllers.runners import NotificationDone
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.violations import UnknownJob
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.errors import ControllerStopping, NoJob
from xce_resize_plugin.host import HostHooks, Principal, ResizeObserver

log = logging.getLogger(__name__)

#: The loop runs at least this often (seconds), and at once when woken.
TICK = 0.1
#: How often the loop checks that no newer controller took the state directory.
FENCE_CHECK = 0.5
#: Seconds between attempts to write again while the state cannot be written.
STORAGE_RETRY = 1.0
#: Hooks the controller still calls while the state cannot be written.
LIFECYCLE_HOOKS = frozenset({"xce_controller_start", "xce_controller_stop"})
#: Fault injection for the failover tests: ``XCE_LIVE_CRASH=POINT`` makes the
#: controller SIGKILL itself at that point (the first time it is reached). Points:
#: ``after-request`` (a resize request is durable, its answer not sent yet),
#: ``after-reserve``, ``after-launch``, ``after-stop``, ``after-notify``,
#: ``after-commit`` (the controller method returned). Never set it in production.
CRASH_ENV = "XCE_LIVE_CRASH"
#: The files of a job's directory the job reads (hostfiles, task file): its owner's
#: alone (:meth:`LiveState._file_owner`), read-only.
JOB_FILE_MODE = 0o400
CRASH_POINTS = (
    "after-request",
    "after-reserve",
    "after-launch",
    "after-stop",
    "after-notify",
    "after-commit",
)


class LiveState:
    """What the live controller holds, and the steps every layer takes (see the
    module docstring). Not used on its own."""

    cfg: LiveConfig
    #: The one re-entrant lock around all controller state (the embedded controller's
    #: too).
    lock: ControllerLock
    #: Per thread: the hook calls in progress, outermost first (see durable_wait).
    _calls: threading.local
    #: Why a newer controller took the state directory (``None``: none did).
    fenced: BaseException | None
    on_fenced: Callable[[], None] | None
    _pm: pluggy.PluginManager
    _hooks: HostHooks
    _wake: threading.Event
    _stopping: threading.Event
    _loop_thread: threading.Thread | None
    _loop_ident: int | None
    #: Jobs whose other tasks are being stopped before they end: the state and reason.
    _ending: dict[str, tuple[JobState, str]]
    #: Notifications sent to an agent, by job and attempt: host, request, callback.
    _notifying: dict[tuple[str, int], tuple[str, dict[str, Any], NotificationDone]]
    #: Jobs that cannot run, and why (no command recorded, a launch of a task they
    #: started with that could not be made): ended, EXIT, by ``_finish_endings``.
    _broken: dict[str, str]
    #: Hosts whose agent was lost before the plugin started: failed once it has
    #: (``_settle_hosts``).
    _down_pending: set[str]
    _opened: bool
    _observers: list[LiveObserver]
    #: Why the state cannot be written (``None``: it can): see ``storage_failed``.
    failing: BaseException | None
    _failure_seen: BaseException | None
    _writable: threading.Event
    #: The in-memory view is not what is on disk (a reload from it failed): nothing is
    #: shown until one succeeds.
    _stale: bool
    #: What the plugin tells of its work (metrics); set before ``open``.
    resize_observer: ResizeObserver | None
    _crash_at: str | None
    #: The user this controller and its agents run as (0: jobs run as their owners).
    euid: int
    #: One clock for every generation: never earlier than a time it gave (wall_clock.py).
    wall_clock: WallClock
    live_store: LiveStore
    _tokens: JobTokens
    fleet: WorkerFleet
    _lease: Lease
    #: The controller machinery (scheduler, ledger, hook order, invariants), on the
    #: wall clock, with this controller's lock, runners and store. Built again from the
    #: store after a failed write (``_reload``).
    embedded: EmbeddedController
    _undo_monitor: Callable[[], None]
    #: Removes ended jobs' scratch directories outside the lock (:mod:`.scratch_trash`).
    _trash: TrashRemover

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

    def _job(self, job_id: str) -> JobRecord:
        job = self.embedded.record(job_id)
        if job is None:
            raise UnknownJob(f"no job {job_id}")
        return job

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

    def job_dir(self, job_id: str) -> Path:
        """Where a job's logs, hostfiles and (by default) working directory are."""
        return self.cfg.state_dir / "jobs" / job_id

    def _make_job_dir(self, job_id: str, account: Account) -> None:
        """The job's directory: the controller's (the agents write logs and hostfiles
        into it: a directory the job could change would let it redirect them), mode
        :data:`SHARED_JOB_DIR` for a job of another user, :data:`OWN_JOB_DIR` for one
        of the controller's user."""
        jdir = self.job_dir(job_id)
        mode = OWN_JOB_DIR if account.uid == self.euid else SHARED_JOB_DIR
        jdir.mkdir(mode=mode, exist_ok=True)
        # By name: only the controller writes in jobs/, so nobody else put anything there.
        st = os.stat(jdir)
        owned = (st.st_uid, st.st_gid) == (0, 0) or self.euid != 0
        if owned and stat.S_IMODE(st.st_mode) == mode:
            return  # as made: called at every start and commit
        if self.euid == 0:
            # A directory an earlier version made (0750, the owner's group): the files
            # root wrote there for that group (hostfile.vN, 0644) are closed first, since
            # anyone may pass through the directory from now on and their names are known.
            _close_to_others(jdir)
            os.chown(jdir, 0, 0)
        os.chmod(jdir, mode)

    def _file_owner(self, account: Account | None) -> Account | None:
        """Whom a file the job reads is given to: its owner, when the job runs as
        another user (only root can give it); ``None``, the controller's own, when the
        job runs as the controller's user or its owner is not known."""
        if account is None or account.uid == self.euid or self.euid != 0:
            return None
        return account

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


def _close_to_others(jdir: Path) -> None:
    """Take the group's and others' bits off the regular files root owns in ``jdir``
    (root's own directory, which no job can write in: its entries cannot change under
    this walk). The job's own files (logs, scratch) are its owner's, 0600 and 0700
    already, and are left alone."""
    with os.scandir(jdir) as entries:
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            if st.st_uid == 0 and st.st_mode & 0o077:
                os.chmod(entry.path, stat.S_IMODE(st.st_mode) & 0o700)
