"""The embedded controller's side of the plugin contract, and the plugin's events.

The third layer of :class:`~.sim_controller.EmbeddedController` (see :mod:`.state`):
the :class:`~xce_resize_plugin.host.Controller` protocol the plugin calls (job views,
slot reservations, task launches and stops, notifications, allocation commits, wake-up
times), the :class:`~..runners.TaskReporter` methods the task runner calls back on, and
the delivery of what they queued to the plugin (``xce_task_events``,
``xce_notify_done``), never from inside a call the plugin made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from xce_resize_plugin.controllers.jobs import NotificationLog, VersionRecord
from xce_resize_plugin.controllers.runners import NotificationRequest, NotificationResult
from xce_resize_plugin.controllers.sim.events import NotifyDone
from xce_resize_plugin.controllers.sim.scheduling import Scheduling
from xce_resize_plugin.controllers.sim.state import STOPPABLE
from xce_resize_plugin.controllers.task_records import (
    LIVE_STATES,
    TaskRecord,
    TaskState,
    TaskStates,
    mark_exited,
    prune_ended,
)
from xce_resize_plugin.controllers.violations import ContractViolation
from xce_resize_plugin.core.allocations import as_kept
from xce_resize_plugin.core.models import JobInfo, JobState, Task
from xce_resize_plugin.core.task_events import TaskEventRun, TaskEvents
from xce_resize_plugin.host import Principal, TaskEvent

log = logging.getLogger(__name__)

#: With ``history_kept``, the most allocation versions a job's record keeps besides
#: its first: each holds every task of the job, and nothing reads old ones but the
#: first (its start) and the current one; a few more are kept for who looks.
VERSIONS_KEPT = 4


def _nothing() -> None:
    """A timeline entry that only makes the controller cycle at its instant."""


class HostContract(Scheduling):
    """The Controller protocol, the task runner's reports and their delivery (see the
    module docstring)."""

    # -- the Controller protocol (what the plugin sees) -------------------------------

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
            job = self._job(job_id)
            if self._cluster.free(job_id, list(task_ids)):
                self._changed(job_id)
                if self.history_kept is not None:
                    held = self._cluster.held_view(job_id)
                    gone = prune_ended(job.task_states, held, self.history_kept)
                    if gone and self._tasks_forgotten is not None:
                        self._tasks_forgotten(job_id, gone)
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
            states = job.task_states
            if isinstance(states, TaskStates) and states.stop_group(
                task_ids, now, grace, STOPPABLE
            ):
                # Start tasks of a large job, all running: stopped as one group, as the
                # loop below would stop each (one batch to the runner, in the order given).
                with self._in_runner:
                    stop_many(job_id, list(task_ids), grace, now)
                self._changed(job_id)
                self._flush()
                return
            stopping = False
            # The tasks to stop go to the runner together (it may report them as one
            # exit); a task already gone is answered in its place in the order given.
            batch: list[int] = []
            with self._in_runner:
                for tid in task_ids:
                    rec = get(tid)
                    if rec is not None and rec.state in STOPPABLE:
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
            if self.history_kept is not None:
                kept = min(self.history_kept, VERSIONS_KEPT)
                if len(job.versions) > kept + 1:
                    # The first stays: the job's start (the live controller launches it).
                    del job.versions[1 : len(job.versions) - kept]
            self._changed(job_id)
            work = self._work.get(job_id)
            if work is not None and resized:
                # A work-based job runs at another speed from now on: its end moves.
                self._schedule_end(job, work.resize(self.now(), len(new)))
                self._update_running_view(job)
            for fn in self._on_commit:
                fn(job_id, self.now(), new, version)
            self._flush()

    # -- TaskReporter (what the task runner calls back on) ----------------------------

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
            states = self._jobs[job_id].task_states
            if isinstance(states, TaskStates):
                stopped = states.exit_group(task_ids, now, status, reason)
                if stopped is not None:
                    # A group stopped together exits together: one run, as below.
                    self._changed(job_id)
                    self._reported(
                        TaskEventRun(job_id, tuple(task_ids), "exited", status, reason, stopped)
                    )
                    return
            # The exits are reported as runs of tasks alike (core/task_events.py): the
            # tasks a release stopped together are one run, not an event each.
            alike: list[int] = []
            was_stopped = False
            for tid in task_ids:
                rec = get(tid)
                if rec is None or rec.state not in LIVE_STATES:
                    continue  # no process that may still be alive: a stale report
                # Whether the host had asked it to stop: a release_exited job drops
                # only tasks that ended on their own.
                stopped = mark_exited(rec, now, status, reason)
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
        return rec if rec is not None and rec.state in LIVE_STATES else None

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
        kept = self.history_kept
        if kept is not None and len(job.notifications) > kept:
            del job.notifications[: len(job.notifications) - kept]
        self._changed(request.job_id)
        self._events.put(NotifyDone(request.job_id, request.attempt, result.status, result.reason))

    # -- delivery to the plugin ------------------------------------------------------

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
