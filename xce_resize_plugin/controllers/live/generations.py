"""The live controller's generations: fencing, and back to the disk after a failed write.

The fifth layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
a newer controller on the state directory fences this one; a write that fails (a full
or failing disk) drops the generation that failed (the embedded controller, the outbox,
the plugin's runtime) and builds the embedded controller again from the store
(docs/live-controller.md).
"""

from __future__ import annotations

import logging

from xce_resize_plugin.controllers.live.job_ends import JobEnds
from xce_resize_plugin.controllers.live.live_store import Lease
from xce_resize_plugin.controllers.live.storage_faults import (
    StateNotWritable,
    fenced_cause,
    storage_failure,
)
from xce_resize_plugin.controllers.live.task_commands import LiveNotificationRunner, LiveTaskRunner
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.errors import ControllerStopping, JournalError

log = logging.getLogger(__name__)

#: What each job's record keeps of its past: its 32 newest ended tasks and
#: notification runs, and its first and 4 newest allocation versions
#: (docs/live-controller.md, "What a job's record keeps"). The record is written
#: whole at every change of the job: kept whole, an elastic job resized all day made
#: each write cost more than the last (a 100-task job resized 400 times: a 3.7 MB
#: record, 0.5 s a resize).
HISTORY_KEPT = 32


class Generations(JobEnds):
    """Fencing and the reload from the store (see the module docstring)."""

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
        except (StoreError, JournalError, OSError) as exc:
            # Reading back is part of the recovery: any failure of it (a failed read
            # too, not only a failed write) leaves the view stale until the next try.
            log.warning("the state could not be read back: %s", exc)
            return
        self._lease, self.embedded = lease, embedded
        self._read_side()
        self._stale = False

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
            clock=self.wall_clock,
            task_runner=LiveTaskRunner(self._runner_start, self._runner_stop),
            notification_runner=LiveNotificationRunner(self._runner_notify),
            protect_reservation=True,
            history_kept=HISTORY_KEPT,
            tasks_forgotten=self._tasks_forgotten,
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

    def _stop_plugin(self) -> None:
        """``xce_controller_stop`` without writing: the plugin drops its runtime (and
        its journal handle), whatever state that runtime was in."""
        try:
            self._hooks.controller_stop(self)
        except Exception:  # the journal may refuse: fenced, or not writable
            log.debug("xce_controller_stop without writing", exc_info=True)

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
