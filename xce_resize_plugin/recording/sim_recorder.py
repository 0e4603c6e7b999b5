"""The simulated controller's recorder: a recording of its inputs as it runs.

A :class:`SimRecorder` writes the ``"controller": "simulated"`` variant of the format
that :mod:`.recording` specifies (its docstring), with the instants (``i``) and rounds
(``r``) that replay reproduces exactly; ``xce-resize simulate TRACE --record OUT``
records its elastic run with it (:func:`.simulate.run_mode`). The task and notification
runners it wraps record the runners' reports with the phase they happened in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.hosts import HOST_FAILURE
from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.controllers.runners import (
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    NotificationRunner,
    TaskReporter,
    TaskRunner,
    start_many_of,
    stop_many_of,
)
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.sim.work import SpeedupWork
from xce_resize_plugin.core.models import ResizeRequest, Task, host_counts
from xce_resize_plugin.host import Principal
from xce_resize_plugin.recording.format import (
    RecordingWriter,
    principal_fields,
    request_fields,
    submit_fields,
)

__all__ = ["ScenarioRecorder", "SimRecorder"]


class _RecordingTaskRunner:
    """Wraps the controller's task runner: every report goes to the recording first,
    with the phase it happened in (inside the controller's call: ``sync``)."""

    def __init__(self, inner: TaskRunner, recorder: SimRecorder) -> None:
        self._inner = inner
        self._rec = recorder
        self._reporter: TaskReporter | None = None
        self._inside = 0

    # TaskRunner
    def bind(self, reporter: TaskReporter) -> None:
        self._reporter = reporter
        self._inner.bind(self)
        self._stop_many = stop_many_of(self._inner)
        self._start_many = start_many_of(self._inner)

    def start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        self._inside += 1
        try:
            self._inner.start(job_id, task, env)
        finally:
            self._inside -= 1

    def start_many(self, job_id: str, tasks: Sequence[Task], env: Mapping[str, str]) -> None:
        self._inside += 1
        try:
            self._start_many(job_id, tasks, env)
        finally:
            self._inside -= 1

    def stop(self, job_id: str, task_id: int, grace: float, since: float) -> None:
        self._inside += 1
        try:
            self._inner.stop(job_id, task_id, grace, since)
        finally:
            self._inside -= 1

    def stop_many(self, job_id: str, task_ids: Sequence[int], grace: float, since: float) -> None:
        self._inside += 1
        try:
            self._stop_many(job_id, task_ids, grace, since)
        finally:
            self._inside -= 1

    # TaskReporter, for the inner runner
    @property
    def _to(self) -> TaskReporter:
        assert self._reporter is not None, "bind() first"
        return self._reporter

    def now(self) -> float:
        return self._to.now()

    def at(self, time: float, fn: Callable[[], None]) -> None:
        self._to.at(time, fn)

    def _record(
        self, job_id: str, task_id: int, event: str, status: int | None, reason: str
    ) -> None:
        self._rec.input(
            "task",
            "sync" if self._inside else None,
            job=job_id,
            task=task_id,
            event=event,
            status=status,
            reason=reason,
        )

    def task_started(self, job_id: str, task_id: int) -> None:
        self._record(job_id, task_id, "started", None, "")
        self._to.task_started(job_id, task_id)

    def tasks_started(self, job_id: str, task_ids: Sequence[int]) -> None:
        # A recording has one line per task (the replay answers each start from it).
        for tid in task_ids:
            self._record(job_id, tid, "started", None, "")
        self._to.tasks_started(job_id, task_ids)

    def task_start_failed(self, job_id: str, task_id: int, reason: str) -> None:
        self._record(job_id, task_id, "start_failed", None, reason)
        self._to.task_start_failed(job_id, task_id, reason)

    def task_exited(self, job_id: str, task_id: int, status: int | None, reason: str) -> None:
        self._record(job_id, task_id, "exited", status, reason)
        self._to.task_exited(job_id, task_id, status, reason)

    def tasks_exited(
        self, job_id: str, task_ids: Sequence[int], status: int | None, reason: str
    ) -> None:
        # A recording has one line per task (the replay answers each stop from it).
        for tid in task_ids:
            self._record(job_id, tid, "exited", status, reason)
        self._to.tasks_exited(job_id, task_ids, status, reason)


class _RecordingNotifier:
    def __init__(self, inner: NotificationRunner, recorder: SimRecorder) -> None:
        self._inner = inner
        self._rec = recorder

    def run(self, request: NotificationRequest, done: NotificationDone) -> None:
        inside = [True]

        def answer(result: NotificationResult) -> None:
            self._rec.input(
                "notify",
                "sync" if inside[0] else None,
                job=request.job_id,
                attempt=request.attempt,
                status=result.status,
                reason=result.reason,
            )
            done(result)

        try:
            self._inner.run(request, answer)
        finally:
            inside[0] = False


class SimRecorder(Observer):
    """Records a simulated controller's inputs (and its starts) as it runs.

    Use: wrap the runners with :meth:`task_runner` and :meth:`notification_runner`
    before building the controller, then :meth:`attach` it (writes the header, starts
    observing), submit through :meth:`submit`, have drivers report their requests to
    :meth:`request`, and call :meth:`finish` with the journal's directory once the
    controller stopped (writes the facts).
    """

    def __init__(self, writer: RecordingWriter) -> None:
        self.writer = writer
        self._ctl: EmbeddedController | None = None
        self._settled_at = -1  # the last instant whose observers ran
        self._written_at = -1  # the last instant with a timeline line

    @property
    def ctl(self) -> EmbeddedController:
        assert self._ctl is not None, "attach() first"
        return self._ctl

    def task_runner(self, inner: TaskRunner) -> TaskRunner:
        return _RecordingTaskRunner(inner, self)

    def notification_runner(self, inner: NotificationRunner) -> NotificationRunner:
        return _RecordingNotifier(inner, self)

    def attach(
        self,
        ctl: EmbeddedController,
        hosts: Sequence[tuple[str, int]],
        user_slots: Mapping[str, int] | None = None,
    ) -> None:
        self._ctl = ctl
        self.writer.header(
            controller="simulated",
            hosts=hosts,
            config=ctl.config,
            user_slots=user_slots or {},
            protect_reservation=ctl.protect_reservation,
            lean_cycles=ctl.lean_cycles,
        )
        ctl.add_observer(self)

    def input(self, kind: str, phase: str | None, **fields: Any) -> None:
        """Write one input line at the controller's current instant."""
        ctl = self.ctl
        instant = ctl.instant
        if phase is None:
            phase = "settled" if self._settled_at == instant else "timeline"
        line: dict[str, Any] = {"kind": kind, "t": ctl.now(), "phase": phase, "i": instant}
        if phase == "settled":
            line["r"] = ctl.settle_round
        elif phase == "timeline":
            self._written_at = instant
        line.update(fields)
        self.writer.write(line)

    def submit(
        self,
        job_id: str,
        *,
        user: str,
        tasks: tuple[int, int],
        estimate: float | None,
        start_tasks: int | None = None,
        resizable: bool = False,
        work: SpeedupWork | None = None,
    ) -> None:
        """Record a submission about to be made (before ``ctl.submit``)."""
        self.input(
            "submit",
            None,
            job=job_id,
            user=user,
            tasks=list(tasks),
            start_tasks=start_tasks,
            estimate=estimate,
            ptile=None,
            resizable=resizable,
            grow_hosts="prefer-existing",
            notify_cmd=None,
            env={},
            work=None
            if work is None
            else {
                "model": work.model.spec(),
                "ref_procs": work.ref_procs,
                "estimate": work.estimate,
            },
        )

    def request(
        self, job_id: str, principal: Principal, request: ResizeRequest, code: str | None
    ) -> None:
        """Record a resize request that was just made and its outcome."""
        self.input("request", None, **request_fields(job_id, principal, request, code))

    # observer
    def job_started(self, job_id: str, time: float, tasks: Sequence[Task]) -> None:
        self.writer.write(
            {
                "kind": "started",
                "t": time,
                "i": self.ctl.instant,
                "job": job_id,
                "hosts": host_counts(tasks),
            }
        )

    def host_changed(
        self, name: str, time: float, state: str, evacuate: bool, principal: Principal | None
    ) -> None:
        fields: dict[str, Any] = {"host": name, "state": state}
        if evacuate and principal is not None:
            fields.update(evacuate=True, principal=principal_fields(principal))
        self.input("host", None, **fields)

    def job_ended(self, job: FinishedJob) -> None:
        if job.exit_reason == HOST_FAILURE:
            return  # an effect of the host line before it: replaying that line ends it
        self.input("end", None, job=job.id, state=job.state.value, reason=job.exit_reason)

    def settled(self, controller: EmbeddedController) -> None:
        instant = controller.instant
        if controller.settle_round == 0 and self._written_at != instant and instant > 0:
            # Nothing came in at this instant before it settled: keep the instant.
            self.writer.write(
                {"kind": "tick", "t": controller.now(), "phase": "timeline", "i": instant}
            )
            self._written_at = instant
        self._settled_at = instant

    def finish(self, journal_dir: Path) -> int:
        return self.writer.facts(journal_dir)


class ScenarioRecorder(SimRecorder):
    """Records a scenario run (``xce-resize scenario run --record``): as
    :class:`SimRecorder`, with each submission written when the job arrives (a
    scenario gives its jobs' arrival times up front) from the controller's job record,
    and the scenario's commands reported to :meth:`request`."""

    def job_submitted(self, job_id: str, time: float) -> None:
        # The controller's own record: the only place that has the job as accepted
        # (alloc, start_tasks), as the live recorder reads it too.
        record = self.ctl.record(job_id)
        assert record is not None, "observers hear of a submission once it is accepted"
        self.input("submit", None, **submit_fields(record))
