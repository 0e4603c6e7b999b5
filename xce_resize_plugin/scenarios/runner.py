"""Run a scenario in simulated time on the embedded controller, with the plugin.

Order within one instant: what the controller has scheduled for that instant (job
arrivals, job ends, task exits) happens first; then the scenario's commands in file
order, each followed by scheduler and dispatch cycles until nothing changes. Commands
reach the plugin exactly as in production: ``bresize`` lines through the same command
logic as the real ``bresize`` (:func:`xce_resize_plugin.lsf.bresize_run.run`), ``resize``
bodies through the same decoding as the REST API, both ending in the host's
``xce_resize_request`` hook.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any

from attrs import evolve

from xce_resize_plugin.controllers.hosts import HostDrain, HostFailure
from xce_resize_plugin.controllers.runners import (
    NotificationRunner,
    SimTaskRunner,
    SubprocessNotificationRunner,
    TaskRunner,
)
from xce_resize_plugin.controllers.sim.sim_controller import EmbeddedController
from xce_resize_plugin.controllers.violations import HostStateError, SubmissionRejected
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    ResizeRequest,
    TargetRequest,
    host_counts,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.errors import ConfigError, InvalidRequest, ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.lsf import bresize_run
from xce_resize_plugin.lsf.bresize_args import Command, to_request
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.recording.format import RecordingWriter
from xce_resize_plugin.recording.sim_recorder import ScenarioRecorder
from xce_resize_plugin.scenarios.files import CommandSpec, HostCommand, JobSpec, Scenario
from xce_resize_plugin.scenarios.result import CommandResult, ScenarioResult


class _Runner:
    def __init__(
        self, scenario: Scenario, state_dir: Path, recorder: ScenarioRecorder | None = None
    ) -> None:
        self.scenario = scenario
        self.recorder = recorder
        try:
            pm = get_plugin_manager(
                scenario.resize, base_dir=scenario.path.parent, entry_points=False
            )
        except ConfigError as exc:
            raise ConfigError(f"{scenario.path}: {exc.detail}") from exc
        tasks: TaskRunner | None = None
        notes: NotificationRunner | None = None
        if recorder is not None:
            tasks = recorder.task_runner(SimTaskRunner())
            notes = recorder.notification_runner(SubprocessNotificationRunner())
        self.ctl = EmbeddedController(
            pm,
            state_dir,
            hosts=list(scenario.hosts),
            config=scenario.resize,
            user_slots=scenario.user_slots,
            protect_reservation=scenario.protect_reservation,
            task_runner=tasks,
            notification_runner=notes,
        )
        if recorder is not None:
            recorder.attach(self.ctl, list(scenario.hosts), scenario.user_slots)
        self.results: list[CommandResult] = []
        self.journal_dir = state_dir / "resize"

    def submit_jobs(self) -> None:
        for i, job in enumerate(self.scenario.jobs):
            try:
                self._submit(job)
            except (SubmissionRejected, ResizeError) as exc:
                text = exc.text if isinstance(exc, ResizeError) else str(exc)
                raise ConfigError(
                    f"{self.scenario.path}: jobs[{i}] (job {job.id}): rejected: {text}"
                ) from None

    def _submit(self, job: JobSpec) -> None:
        tasks = (job.min_tasks, job.max_tasks)
        self.ctl.submit_job(
            job.user, tasks, job, runtime=job.runtime, job_id=job.id, submit_time=job.submit
        )

    def principal(self, user: str) -> Principal:
        return Principal(user, admin=user in self.scenario.admins)

    def journal_seq(self) -> int:
        with Journal.open(self.journal_dir, readonly=True) as journal:
            return journal.last_seq

    def execute(self, cmd: CommandSpec) -> CommandResult:
        seq = self.journal_seq()
        return evolve(self._execute(cmd), seq=seq)

    def _execute(self, cmd: CommandSpec) -> CommandResult:
        principal = self.principal(cmd.user)
        if cmd.host is not None:
            return self._host(cmd, cmd.host, principal)
        if cmd.argv is not None:

            def send(parsed: Command) -> None:
                job_id, request = to_request(parsed)
                self._request(principal, job_id, request)

            out = bresize_run.run(cmd.argv, send)
            return CommandResult(
                cmd.at, cmd.user, cmd.argv, None, out.exit, out.code, out.message, out.stdout
            )
        body = dict(cmd.resize or {})
        try:
            job_id, request = _api_request(body)
        except ResizeError as exc:
            return CommandResult(
                cmd.at, cmd.user, None, cmd.resize, bresize_run.EXIT_USAGE, exc.code, exc.text
            )
        try:
            self._request(principal, job_id, request)
        except ResizeError as exc:
            return CommandResult(
                cmd.at, cmd.user, None, cmd.resize, bresize_run.EXIT_REJECTED, exc.code, exc.text
            )
        return CommandResult(cmd.at, cmd.user, None, cmd.resize, bresize_run.EXIT_OK, None, "")

    def _host(self, cmd: CommandSpec, host: HostCommand, principal: Principal) -> CommandResult:
        """A host state change, as an administrator's ``xce-resize host`` would make it."""
        ctl = self.ctl
        try:
            if host.state == "down":
                message = _failure_text(ctl.host_down(host.name))
            elif host.state == "up":
                ctl.host_up(host.name)
                message = f"host {host.name} is up"
            elif host.state == "closed":
                message = _drain_text(ctl.host_close(host.name, host.evacuate, principal))
            else:
                ctl.host_open(host.name)
                message = f"host {host.name} is open"
        except HostStateError as exc:
            return CommandResult(
                cmd.at,
                cmd.user,
                None,
                None,
                bresize_run.EXIT_REJECTED,
                "XCE_HOST_STATE",
                str(exc),
                host=host,
            )
        return CommandResult(
            cmd.at, cmd.user, None, None, bresize_run.EXIT_OK, None, "", message, host=host
        )

    def _request(self, principal: Principal, job_id: str, request: ResizeRequest) -> None:
        """Send a request; with a recording, write it down with its outcome."""
        code: str | None = None
        try:
            self.ctl.request_resize(principal, job_id, request)
        except ResizeError as exc:
            code = exc.code
            raise
        finally:
            if self.recorder is not None:
                self.recorder.request(job_id, principal, request, code)

    def run(self) -> None:
        self.submit_jobs()
        until = self.scenario.until
        for cmd in self.scenario.commands:
            if until is not None and cmd.at > until:
                break
            if cmd.at > self.ctl.now():
                self.ctl.run(until=cmd.at)
            self.results.append(self.execute(cmd))
            self.ctl.settle()
        self.ctl.run(until=until)


def _failure_text(failure: HostFailure) -> str:
    jobs = ", ".join(f"job {j} {o.value}" for j, o in failure.outcomes.items())
    return f"host {failure.host} is down" + (f": {jobs}" if jobs else "")


def _drain_text(drain: HostDrain) -> str:
    parts = [f"job {j} asked to release {len(ids)} task(s)" for j, ids in drain.asked.items()]
    parts += [f"job {j} stays ({why})" for j, why in drain.stays.items()]
    return f"host {drain.host} is closed" + (": " + "; ".join(parts) if parts else "")


def _target_json(status: ResizeStatus | None) -> dict[str, Any]:
    """A job's ``target``, only while one is set (docs/scenarios.md, "target tables")."""
    if status is None or status.target is None:
        return {}
    return {"target": converters.API.unstructure(status.target)}


def _api_request(body: dict[str, Any]) -> tuple[str, ResizeRequest]:
    """A scenario ``resize`` table: the REST body plus ``op`` and ``job``."""
    op = body.pop("op")
    job_id = body.pop("job")
    if op == "grow":
        return job_id, converters.grow_from_json(body)
    if op == "release":
        return job_id, converters.release_from_json(body)
    if op == "modify":
        return job_id, AutoresizeRequest(bool(body["autoresize"]))
    if op == "target":
        if body.pop("clear", False):
            return job_id, TargetRequest(None)
        return job_id, converters.target_from_json(body)
    if body:
        raise InvalidRequest(f"cancel takes no fields, got {', '.join(sorted(body))}")
    return job_id, CancelRequest()


def run(scenario: Scenario, state_dir: Path, record: IO[str] | None = None) -> ScenarioResult:
    """Run a loaded scenario with its state (controller and journal) in ``state_dir``,
    which must be new or empty: a scenario always starts from time 0. With ``record``,
    write a recording of the run there (``xce-resize simulate --replay`` replays it)."""
    if state_dir.exists() and any(state_dir.iterdir()):
        raise ConfigError(
            f"state directory {state_dir} is not empty: a scenario starts from a fresh state"
        )
    recorder = ScenarioRecorder(RecordingWriter(record)) if record is not None else None
    runner = _Runner(scenario, state_dir, recorder)
    ctl = runner.ctl
    try:
        runner.run()
        end = ctl.now()
        jobs: dict[str, dict[str, Any]] = {}
        for view in ctl.jobs():
            status = ctl.resize_status(view.id)
            usage = ctl.acct_usage(view.id)
            pending = status.pending if status is not None else None
            jobs[view.id] = {
                "state": view.state.value,
                "user": view.user,
                "hosts": host_counts(view.tasks),
                "tasks": {str(t.id): t.host for t in view.tasks},
                "pending_grow": (
                    None if pending is None else {"min": pending.min_add, "max": pending.max_add}
                ),
                "autoresize": status.autoresize if status is not None else False,
                "demand": (
                    None
                    if pending is None or not pending.auto
                    else {"min": pending.min_add, "max": pending.max_add}
                ),
                "resize_phase": status.phase.value if status is not None else "IDLE",
                **_target_json(status),
                "start_time": view.start_time,
                "end_time": view.end_time,
                **({"exit_reason": view.exit_reason} if view.state.value == "EXIT" else {}),
                "slot_seconds": usage.slot_seconds if usage is not None else 0.0,
                "resize_records": [converters.record_json(r) for r in usage.records]
                if usage
                else [],
            }
        notifications = tuple(
            {
                "job": n.job_id,
                "attempt": n.attempt,
                "host": n.host,
                "time": n.time,
                "status": n.status,
                "reason": n.reason,
                "stdout": n.stdout,
            }
            for n in ctl.notifications()
        )
        hosts = ctl.hosts_view()
        host_states = {v.name: v.state.value for v in ctl.host_views()}
        users = ctl.users_view()
        problems = tuple(ctl.check_invariants())
        rejected = tuple(ctl.rejections)
    finally:
        ctl.stop()
    if recorder is not None:
        recorder.finish(state_dir / "resize")
    with Journal.open(state_dir / "resize", readonly=True) as journal:
        facts = tuple((seq, converters.decode_fact(p)) for seq, _, p in journal.facts())
    return ScenarioResult(
        scenario=scenario,
        end_time=end,
        commands=tuple(runner.results),
        jobs=jobs,
        hosts=hosts,
        users=users,
        facts=facts,
        notifications=notifications,
        problems=problems,
        rejected=rejected,
        host_states=host_states,
    )
