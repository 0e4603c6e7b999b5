"""The live controller's commands to the agents: tasks and notifications.

The second layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
the embedded controller's task and notification runners (:class:`LiveTaskRunner`,
:class:`LiveNotificationRunner`) are this controller's commands to the hosts' agents,
queued in the fleet's outbox and sent only after the store write that records them;
each task's environment (identity, job token, allocation, hostfile) is made here.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live.job_tokens import SALT_FIELD, TOKEN_ENV
from xce_resize_plugin.controllers.live.live_state import JOB_FILE_MODE, LiveState
from xce_resize_plugin.controllers.live.proc import Account, account_json, atomic_write
from xce_resize_plugin.controllers.live.submission import SubmitRejected
from xce_resize_plugin.controllers.live.task_env import (
    SCRATCH,
    identity_env,
    local_task_id,
    make_scratch,
    recorded_local_ids,
    task_file,
)
from xce_resize_plugin.controllers.live.tasks import unsendable
from xce_resize_plugin.controllers.runners import (
    WHOLE_ENV,
    NotificationDone,
    NotificationRequest,
    NotificationResult,
    TaskReporter,
    command_path,
    essential_env,
)
from xce_resize_plugin.controllers.task_records import LIVE_STATES, TaskState
from xce_resize_plugin.core.models import JobState, Task, allocation_env

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


def _account_env(account: Account) -> dict[str, str]:
    """What a login would set for the job's user (the controller's own are not the job's
    when it runs as its owner)."""
    return {"HOME": account.home, "USER": account.name, "LOGNAME": account.name}


class TaskCommands(LiveState):
    """Task and notification commands to the agents (see the module docstring)."""

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

    def _tasks_forgotten(self, job_id: str, task_ids: list[int]) -> None:
        """Ended tasks of a running job whose records the embedded controller dropped
        (docs/live-controller.md, "What a job's record keeps"): their launch records go
        with them, written with the same flush, and their agents forget them. Kept, an
        elastic job resized for days held one launch record (with the job's whole
        environment) per task it ever started, here and in its agents."""
        hosts: dict[str, list[int]] = {}
        for tid in task_ids:
            key = f"task:{job_id}:{tid}"
            side = self.live_store.get(key)
            if side is None:
                continue
            hosts.setdefault(str(side["host"]), []).append(tid)
            self.live_store.put(key, None)
        for host, tids in hosts.items():
            self.fleet.send(host, {"op": "forget", "job": job_id, "tasks": tids})

    def _runner_start(self, job_id: str, task: Task, env: Mapping[str, str]) -> None:
        if job_id in self._ending:
            self.embedded.task_start_failed(job_id, task.id, "the job is ending")
            return
        self._send_launch(self._job(job_id), task, env)

    def _send_launch(self, job: JobRecord, task: Task, alloc_env: Mapping[str, str]) -> None:
        job_id = job.id
        spec = self.live_store.get(f"job:{job_id}")
        if spec is None:
            self._launch_failed(job, task.id, "no command recorded for the job")
            return
        try:
            account = self._account(job, spec)
        except (SubmitRejected, ValueError) as exc:
            self._launch_failed(job, task.id, str(exc))
            return
        jdir = self.job_dir(job_id)
        # The job's directory is not writable by a job that runs as another user than
        # the controller's: such a job starts in its owner's home.
        cwd = spec.get("cwd") or (str(jdir) if account.uid == self.euid else account.home)
        command = {
            "op": "launch",
            "job": job_id,
            "task": task.id,
            # Which run of the job (a requeued job runs again from task 0): the agent
            # tells a resent launch of this run from a new run's task of the same id.
            "run": repr(job.start_time),
            "argv": spec["argv"],
            "user": account_json(account),
            "env": self._task_env(job, spec, task, alloc_env, account),
            "cwd": cwd,
            "stdout": str(jdir / f"task-{task.id}.out"),
            "stderr": str(jdir / f"task-{task.id}.err"),
        }
        why = unsendable(command)
        if why is not None:
            self._launch_failed(job, task.id, why)
            return
        host = self.live_store.get(f"host:{task.host}") or {}
        env = {k: v for k, v in command["env"].items() if k != TOKEN_ENV}
        self.live_store.put(
            f"task:{job_id}:{task.id}",
            {
                "host": task.host,
                # Without the token (never stored): a resend derives it again.
                "launch": {**command, "env": env},
                "pid": None,
                # Which agent could have received it (see worker_up).
                "instance": host.get("instance"),
                "gen": host.get("gen", 0),
            },
        )
        self.fleet.send(task.host, command)

    def _launch_failed(self, job: JobRecord, task_id: int, reason: str) -> None:
        """A launch the controller could not make. A grow's new task fails to start, as
        when its agent reports that; a task the job started with, which counts as
        running from the start, ends the job (EXIT, by ``_finish_endings``) as task 0's
        failed start does: the job cannot run as submitted, and it must not hold its
        slots with a task that never ran."""
        rec = job.task_states.get(task_id)
        if rec is not None and rec.state is TaskState.STARTING:
            self.embedded.task_start_failed(job.id, task_id, reason)
        else:
            self._broken.setdefault(job.id, f"task {task_id} failed to start: {reason}")

    def _task_env(
        self,
        job: JobRecord,
        spec: Mapping[str, Any],
        task: Task,
        alloc: Mapping[str, str],
        account: Account,
    ) -> dict[str, str]:
        # The controller's PATH only for a job of its own user (runners.DEFAULT_PATH
        # says why); a PATH the job sets (job.env) stays as the job gave it. Another
        # user's task gets nothing else of the controller's own environment (root's
        # LANG, LC_*, TZ, TMPDIR), as its notification commands do not: what the job's
        # env sets, and its scratch as TMPDIR, below.
        own = account.uid == self.euid
        env = essential_env() if own else {"PATH": command_path(own_user=False)}
        env.update(_account_env(account))
        env.update(job.env)
        env.update(alloc)
        jdir = self.job_dir(job.id)
        hostfile = str(jdir / "hostfile")
        env.update(self._identity(job, task, alloc, make_scratch(jdir, account, self.euid == 0)))
        if "TMPDIR" in job.env:
            env["TMPDIR"] = job.env["TMPDIR"]  # the owner's explicit choice wins
        env.update(
            {
                "XCE_JOB_ID": job.id,
                "LSB_JOBID": job.id,
                "XCE_TASK_ID": str(task.id),
                "XCE_HOSTNAME": task.host,
                "XCE_HOSTFILE": hostfile,
                "LSB_DJOB_HOSTFILE": hostfile,
                "XCE_TASKFILE": str(jdir / "tasks"),
                "LSB_DJOB_NUMPROC": str(len(alloc.get("LSB_HOSTS", "").split())),
                "LSB_RESIZABLE": "Y" if job.resizable else "N",
                "XCE_CONTROLLER_URL": self.cfg.controller_url,
                TOKEN_ENV: self._job_token(job.id, spec),
            }
        )
        return env

    def _identity(
        self, job: JobRecord, task: Task, alloc: Mapping[str, str], scratch: Path
    ) -> dict[str, str]:
        """The task's identity variables (:mod:`.task_env`): its index among the job's
        live tasks on its host, taken from their recorded launches."""
        others = [
            self.live_store.get(f"task:{job.id}:{tid}")
            for tid, rec in job.task_states.items()
            if tid != task.id and rec.host == task.host and rec.state in LIVE_STATES
        ]
        head = job.tasks[0].host if job.tasks else task.host
        return identity_env(
            task,
            local_task_id(recorded_local_ids(others)),
            alloc.get("LSB_HOSTS", "").split(),
            (job.min_tasks, job.max_tasks),
            self.fleet.address(head),
            scratch,
        )

    def _job_token(self, job_id: str, spec: Mapping[str, Any]) -> str:
        """The job's token, derived again (it is never stored); "" without a salt."""
        salt = spec.get(SALT_FIELD)
        return self._tokens.token(job_id, salt) if isinstance(salt, str) else ""

    def _with_token(self, launch: Mapping[str, Any]) -> dict[str, Any]:
        """A recorded launch command, with the job token its record leaves out."""
        job_id = str(launch["job"])
        spec = self.live_store.get(f"job:{job_id}") or {}
        return {**launch, "env": {**launch["env"], TOKEN_ENV: self._job_token(job_id, spec)}}

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
        try:
            account = self._account(self._job(request.job_id), spec)
        except (SubmitRejected, ValueError) as exc:
            done(NotificationResult(None, f"cannot run: {exc}"))
            return
        jdir = self.job_dir(request.job_id)
        env = {**_account_env(account), **request.env}
        if account.uid != self.euid:
            # Nothing of the agent's own environment (its user's, root's: PATH, TMPDIR,
            # LANG, LC_*, TZ) is for another user's command: this is all of it
            # (runners.WHOLE_ENV). TMPDIR is the job's scratch, as its tasks'
            # (task_env.identity_env); what the job set (request.env has the job's) stays.
            env.setdefault("PATH", command_path(own_user=False))
            if (jdir / SCRATCH).is_dir():
                env.setdefault("TMPDIR", str(jdir / SCRATCH / "tmp"))
            env[WHOLE_ENV] = "1"
        hosts = env.get("LSB_HOSTS", "").split()
        version = env.get("XCE_ALLOC_VERSION", "next")
        # The notification sees the allocation the change would commit: a hostfile of
        # its own (the job's hostfile changes only at the commit).
        hostfile = jdir / f"hostfile.v{version}"
        refused = self._write_job_file(hostfile, "".join(f"{h}\n" for h in hosts), account)
        if refused is not None:
            done(NotificationResult(None, f"cannot run: {refused}"))
            return
        env.update(
            {
                "XCE_HOSTFILE": str(hostfile),
                "LSB_DJOB_HOSTFILE": str(hostfile),
                "LSB_DJOB_NUMPROC": str(len(hosts)),
                "XCE_HOSTNAME": request.host,
                "XCE_CONTROLLER_URL": self.cfg.controller_url,
                TOKEN_ENV: self._job_token(request.job_id, spec),
            }
        )
        command = {
            "op": "notify",
            "job": request.job_id,
            "attempt": request.attempt,
            "user": account_json(account),
            "command": request.command,
            "env": env,
            "timeout": request.timeout,
            "cwd": str(jdir),
            "log": str(jdir / f"notify-{request.attempt}.log"),
        }
        why = unsendable(command)
        if why is not None:
            done(NotificationResult(None, f"cannot run: {why}"))
            return
        self._notifying[(request.job_id, request.attempt)] = (request.host, command, done)
        self.fleet.send(request.host, command)

    def _write_hostfile(self, job_id: str, tasks: Sequence[Task]) -> None:
        """LSF's ``LSB_DJOB_HOSTFILE``: one line per task, the host's name; and the task
        file beside it, ``ID HOST`` per task (``XCE_TASKFILE``)."""
        jdir = self.job_dir(job_id)
        try:
            account: Account | None = self._account(
                self._job(job_id), self.live_store.get(f"job:{job_id}") or {}
            )
        except (SubmitRejected, ValueError):
            account = None  # its launches fail for the same reason; the files stay ours
        if account is not None:
            # Called at every start and commit: the directory of a job an earlier version
            # started (its owner's group could list it) is made as a new job's is.
            self._make_job_dir(job_id, account)
        for path, data in (
            (jdir / "hostfile", "".join(f"{t.host}\n" for t in tasks)),
            (jdir / "tasks", task_file(tasks)),
        ):
            refused = self._write_job_file(path, data, account)
            if refused is not None:
                self._broken.setdefault(job_id, refused)  # ended: it cannot read its hosts
                return

    def _write_job_file(self, path: Path, data: str, account: Account | None) -> str | None:
        """A file of the job's directory the job reads (a hostfile, the task file),
        written atomically (never a mix of two allocations) and readable by its owner
        alone (docs/live-controller.md, "State directory"): not by its owner's group,
        which other users may share. ``None`` once written; why not, when the owner's
        disk quota refused it: the file is the owner's, so that is the job's failure,
        not the controller's (whose disk is fine: every other user's changes go on)."""
        owner = self._file_owner(account)
        try:
            atomic_write(path, data, JOB_FILE_MODE, owner=owner)
        except OSError as exc:
            if owner is None or exc.errno != errno.EDQUOT:
                raise
            return f"{path.name}: over the disk quota of user {owner.name}"
        return None

    def _before_commit(self, jobs: list[JobRecord]) -> None:
        """Called by the store before it writes these job records: a job that has just
        started gets its tasks' launches recorded in the same transaction."""
        for job in jobs:
            if job.state is not JobState.RUN:
                continue
            spec = self.live_store.get(f"job:{job.id}")
            if spec is None:
                self._broken[job.id] = "no command recorded for the job"
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
