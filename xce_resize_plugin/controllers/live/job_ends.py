"""The live controller's job ends: a job ends once its other tasks are gone.

The fourth layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
a job whose task 0 ended, that was killed, or that a host failure ends or requeues is
first marked ending (saved), its other tasks are stopped (SIGTERM, ``kill_grace``,
SIGKILL), and only then does the embedded controller end or requeue it and free its
slots. ``finished_job_keep`` seconds after its end, a finished job is dropped
(:meth:`JobEnds._drop_finished`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live import job_kv
from xce_resize_plugin.controllers.live.protocol import ControllerProtocol
from xce_resize_plugin.controllers.live.scratch_trash import discard_scratch
from xce_resize_plugin.controllers.task_records import LIVE_STATES, TaskState
from xce_resize_plugin.core.models import JobState, LossOutcome

log = logging.getLogger(__name__)

#: The most finished jobs one loop tick drops: a backlog (a first start with this
#: setting, a long ``finished_job_keep`` shortened) is dropped over a few ticks rather
#: than holding the lock for one long write.
DROP_BATCH = 1000


class JobEnds(ControllerProtocol):
    """Job ends, other tasks stopped first (see the module docstring)."""

    def _loss_end(self, job_id: str, outcome: LossOutcome) -> LossOutcome:
        """The embedded controller's ``loss_ender``: a job that a host failure ends or
        requeues has its processes on the other hosts stopped first (:meth:`_begin_end`;
        ``PEND`` stands for the requeue); its slots there are freed once they are gone.
        The outcome that stands: a job already being ended (killed) is not requeued."""
        state = JobState.PEND if outcome is LossOutcome.REQUEUE else JobState.EXIT
        self._begin_end(job_id, state, HOST_FAILURE)
        ending = self._ending.get(job_id)
        if outcome is LossOutcome.REQUEUE and ending is not None and ending[0] is not state:
            return LossOutcome.EXIT
        return outcome

    def _begin_end(self, job_id: str, state: JobState, reason: str, kill: bool = False) -> None:
        """The job is over: stop its other tasks; :meth:`_finish_endings` ends it once
        none is left (slots are freed only after the processes are gone). A ``kill``
        that comes while a requeue is under way replaces it: the job ends instead of
        starting again (its tasks are being stopped already). Any other end of a job
        already ending (its task 0's, which the failure took) changes nothing."""
        current = self._ending.get(job_id)
        if current is not None:
            if kill and current[0] is JobState.PEND:
                self._ending[job_id] = (state, reason)
                self._save_ending(job_id, state, reason)
            return
        job = self.embedded.record(job_id)
        if job is None or job.state is not JobState.RUN:
            return
        self._ending[job_id] = (state, reason)
        self._save_ending(job_id, state, reason)
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

    def _save_ending(self, job_id: str, state: JobState, reason: str) -> None:
        """The job's end in progress, in its side record (a restarted controller
        finishes it: ``_read_side``)."""
        key = f"job:{job_id}"
        spec = dict(self.live_store.get(key) or {})
        spec["ending"] = [state.value, reason]
        self.live_store.put(key, spec)

    def _finish_endings(self) -> None:
        for job_id, reason in sorted(self._broken.items()):
            del self._broken[job_id]
            self._begin_end(job_id, JobState.EXIT, reason)
        for job_id in list(self._ending):
            job = self.embedded.record(job_id)
            if job is None or job.finished:
                self._ending.pop(job_id, None)
                continue
            if any(rec.state in LIVE_STATES for rec in job.task_states.values()):
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
            self._drop_kv(job_id, spec)  # with the end
            self.live_store.put(key, spec)
            for host in hosts:
                self.fleet.send(host, {"op": "forget", "job": job_id})
            self._discard_scratch(job_id)
            self.embedded.flush()

    def _drop_kv(self, job_id: str, spec: dict[str, Any]) -> None:
        """Delete the job's key-value records, and their list from ``spec`` (its
        ``job:ID`` record, which the caller saves): the store's count of their bytes
        (:attr:`.LiveStore.kv_bytes`, which ``[limits] kv_bytes_per_user`` bounds per
        user) goes down with them."""
        for kv_key in spec.pop("kv", []):
            self.live_store.put(job_kv.record_key(job_id, kv_key), None)

    def _discard_scratch(self, job_id: str) -> None:
        """The job's scratch directory, moved aside now and removed outside the lock
        (:mod:`.scratch_trash`): what the job left there may take minutes to remove."""
        trash = discard_scratch(self.job_dir(job_id))
        if trash is not None:
            self._trash.put(trash)

    def _requeue(self, job_id: str, hosts: Sequence[str]) -> None:
        """A job that a host failure requeued has no process left: back to the queue
        (the embedded controller frees its slots); it starts again from scratch, with a
        new launch of every task, and the key-value store of its first run dropped."""
        key = f"job:{job_id}"
        spec = dict(self.live_store.get(key) or {})
        self._drop_kv(job_id, spec)
        spec.pop("ending", None)
        spec["launched"] = False
        self.live_store.put(key, spec)  # written with the requeue, in one transaction
        job = self.embedded.record(job_id)
        if job is not None:
            # Its run is over: the next starts from task 0, and only its own launches
            # are known by the job's record when it is dropped (_drop_side_records).
            self._drop_launches(job)
        self.embedded.requeue(job_id)
        for host in hosts:
            self.fleet.send(host, {"op": "forget", "job": job_id})
        self._discard_scratch(job_id)
        self.embedded.flush()

    # -- finished jobs dropped after finished_job_keep ------------------------------------

    def _drop_finished(self) -> None:
        """Drop the finished jobs whose end is ``finished_job_keep`` seconds old or
        older, and each user's earliest ended beyond ``finished_job_max``
        (docs/live-controller.md, "Jobs and tasks"): from memory, the store and
        the side records keyed by the job, in one durable write. Only jobs whose end
        is recorded and reported are taken (the embedded controller queues them then),
        never one still ending. The job's directory (its logs) stays; the plugin's
        journal keeps its resize history, which ``xce-resize history`` still answers
        (compaction removes its facts, not its final state and records)."""
        before = self.embedded.now() - self.cfg.finished_job_keep
        ending = self._ending.__contains__
        dropped = self.embedded.forget_finished(before, DROP_BATCH, ending)
        if len(dropped) < DROP_BATCH:
            # Then each user's beyond finished_job_max, earliest ended first: a user
            # who ends jobs faster than they age out holds no more than that.
            dropped += self.embedded.forget_finished_over(
                self.cfg.finished_job_max, DROP_BATCH - len(dropped), ending
            )
        if not dropped:
            return
        for job in dropped:
            self._drop_side_records(job)
        self.embedded.flush()
        log.debug("dropped finished job(s) %s", " ".join(job.id for job in dropped))

    def _drop_side_records(self, job: JobRecord) -> None:
        """Delete every side record of a dropped job: its command spec (with its token's
        salt), its key-value entries, its tasks' launches; and what this controller
        still holds of it in memory (a notification never answered)."""
        key = f"job:{job.id}"
        self._drop_kv(job.id, dict(self.live_store.get(key) or {}))
        self.live_store.put(key, None)
        self._drop_launches(job)
        for pending in [k for k in self._notifying if k[0] == job.id]:
            del self._notifying[pending]

    def _drop_launches(self, job: JobRecord) -> None:
        """Delete the launch records of the job's run: task ids are issued in order
        and the record keeps its newest tasks, so every task launched has an id up to
        the largest the record knows. A requeue deletes its run's (:meth:`_requeue`):
        the next run's record knows only its own ids."""
        ids = [*job.task_states, *(t.id for t in job.tasks)]
        for tid in range(max(ids, default=-1) + 1):
            task_key = f"task:{job.id}:{tid}"
            if self.live_store.get(task_key) is not None:
                self.live_store.put(task_key, None)
