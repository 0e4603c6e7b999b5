"""The embedded controller's hosts: failures, drains and requeues.

The fourth layer of :class:`~.sim_controller.EmbeddedController` (see :mod:`.state`;
docs/admin-guide.md, "Host states"): a host that fails loses its tasks and the plugin
says per job whether the job shrank, ends or is requeued (``xce_host_failed``); a host
that is closed takes no new task, and with ``evacuate`` its resizable jobs are asked to
release their tasks there through the normal release path.
"""

from __future__ import annotations

from collections.abc import Mapping

from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.hosts import HOST_FAILURE, HostDrain, HostFailure, HostView
from xce_resize_plugin.controllers.jobs import JobRecord, job_id_key
from xce_resize_plugin.controllers.sim.contract import HostContract
from xce_resize_plugin.controllers.sim.state import exit_all, exit_tasks
from xce_resize_plugin.controllers.violations import HostStateError, UnknownHost
from xce_resize_plugin.core.models import JobState, LossOutcome, ReleaseRequest
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import Principal


class HostStates(HostContract):
    """Host states, failures, drains and requeues (see the module docstring)."""

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
            exit_tasks((states[t] for t in ids if t in states), now, HOST_FAILURE)
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
            # The ender says what stands (None: as asked): a job it is ending already
            # (killed) is not requeued.
            outcome = self._loss_ender(job.id, outcome) or outcome
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
            self._requeue_job(job)
            self._flush()
            return True

    def _requeue_job(self, job: JobRecord) -> None:
        """Put a running job back in the queue (its place: its submit time); it starts
        again from scratch. No ``xce_job_end``: the plugin ended the run's state. The
        observers see ``job_ending`` with ``PEND`` first (the run is over), then
        ``job_requeued`` once the job is back in the queue."""
        for fn in self._on_ending:
            fn(job.id, self.now(), JobState.PEND, HOST_FAILURE)
        exit_all(job.task_states, self.now(), "requeued")
        self._cluster.free_job(job.id)
        self._running.pop(job.id, None)
        self._drop_running_view(job.id)
        self._end_gen[job.id] = self._end_gen.get(job.id, 0) + 1  # its end is void
        job.state = JobState.PEND
        job.start_time = None
        job.tasks = ()
        job.version = 0
        job.requeued = True
        job.requeues += 1
        self._enqueue(job)
        self._changed(job.id)
        for requeued in self._on_requeue:
            requeued(job.id, self.now())

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
