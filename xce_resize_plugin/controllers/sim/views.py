"""The embedded controller's views: what a driver, a test or a holder reads.

The fifth layer of :class:`~.sim_controller.EmbeddedController` (see :mod:`.state`):
read-only views of jobs, hosts, users and notifications, counters an observer uses to
say when something happened, the invariant check, and the job records a host holding
this controller (the live controller) and recorders read.
"""

from __future__ import annotations

from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.jobs import JobRecord, JobView, NotificationLog
from xce_resize_plugin.controllers.scheduler import Reservation
from xce_resize_plugin.controllers.sim.cluster_view import offered_total
from xce_resize_plugin.controllers.sim.host_states import HostStates
from xce_resize_plugin.controllers.sim.state import lost_with_host
from xce_resize_plugin.controllers.task_records import LIVE_STATES
from xce_resize_plugin.core.models import JobState


class Views(HostStates):
    """Read-only views and the invariant check (see the module docstring)."""

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
        slots and the ledger's counters consistent (per host and per user, and the
        queued jobs per user); pending and finished jobs hold no slot; a running job's
        committed allocation is held, starts with task 0, stays within
        ``min_tasks..max_tasks`` and respects ``ptile`` (held slots per host); every
        live task process runs on a slot its job holds; finished jobs have no live
        task.
        """
        with self._lock:
            problems = list(self._problems)
            problems.extend(self._cluster.check())
            problems.extend(self._down_host_problems())
            problems.extend(self._pending_count_problems())
            for job in self._ordered_jobs():
                held = self._cluster.held(job.id)
                if job.state is not JobState.RUN:
                    if held:
                        problems.append(
                            f"job {job.id} is {job.state.value} but holds {len(held)} slot(s)"
                        )
                    live = [tid for tid, r in job.task_states.items() if r.state in LIVE_STATES]
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
                    if held.get(task.id) != task.host and not lost_with_host(job, task.id):
                        problems.append(f"job {job.id}: committed task {task.id} is not held")
                if job.ptile is not None:
                    for host, n in self._cluster.job_host_counts(job.id).items():
                        if n > job.ptile:
                            problems.append(
                                f"job {job.id}: {n} slots on {host} > ptile {job.ptile}"
                            )
                for tid, rec in job.task_states.items():
                    if rec.state in LIVE_STATES and held.get(tid) != rec.host:
                        problems.append(
                            f"job {job.id}: task {tid} is {rec.state.value} without a held slot"
                        )
            return problems

    def _pending_count_problems(self) -> list[str]:
        """The per-user count of queued jobs (``pending_of``) matches the jobs."""
        counted: dict[str, int] = {}
        for job in self._jobs.values():
            if job.state is JobState.PEND:
                counted[job.user] = counted.get(job.user, 0) + 1
        if counted == self._pending_users:
            return []
        return [f"queued jobs per user counted {self._pending_users}, but the jobs say {counted}"]

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
                if rec.host in down and rec.state in LIVE_STATES:
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

    def pending_of(self, user: str) -> int:
        """How many of ``user``'s jobs are pending (queued, or submitted to arrive)."""
        with self._lock:
            # Counted as jobs are queued and leave the queue: a scan of every job the
            # controller keeps (finished ones too) cost each submission O(all jobs).
            queued = self._pending_users.get(user, 0)
            return queued + sum(1 for j in self._future.values() if j.user == user)

    def records(self) -> list[JobRecord]:
        """Every known job's record, in the order the controller took them (see
        :meth:`record`)."""
        with self._lock:
            return list(self._jobs.values())
