"""What the live controller's host REST routes call.

The eighth layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
submissions, kills, host commands, the job key-value store, and the job, jobs, hosts
and cluster views with their JSON, each checked for who may see or change what.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from xce_resize_plugin.controllers.live import host_admin, job_kv
from xce_resize_plugin.controllers.live.hook_monitor import HookMonitor
from xce_resize_plugin.controllers.live.job_tokens import SALT_FIELD
from xce_resize_plugin.controllers.live.live_store import kv_stored_size
from xce_resize_plugin.controllers.live.proc import account_json
from xce_resize_plugin.controllers.live.storage_faults import fenced_cause, storage_failure
from xce_resize_plugin.controllers.live.submission import (
    SubmitRejected,
    check_cwd,
    job_account,
    parse_submission,
)
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.models import JobState, Task
from xce_resize_plugin.errors import JobFinished, PendingJobLimit, PermissionDenied, ResizeError
from xce_resize_plugin.host import Principal

log = logging.getLogger(__name__)


def _counts(tasks: Sequence[Task]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tasks:
        out[t.host] = out.get(t.host, 0) + 1
    return out


class HostApi(HookMonitor):
    """What the host routes call (see the module docstring)."""

    def health(self) -> tuple[dict[str, Any], int]:
        """``GET /v1/health``: the answer and its status (503 unless ``ok``)."""
        body: dict[str, Any] = {"status": "ok", "epoch": self.live_store.epoch}
        if self.fenced is not None:
            body.update(status="fenced", reason=str(self.fenced))
        elif self.failing is not None:
            body.update(status="failing", reason=f"the state cannot be written: {self.failing}")
        return body, 200 if body["status"] == "ok" else 503

    def job_count(self) -> int:
        """How many jobs the controller knows (any state), e.g. 0 on a new state dir."""
        return len(self.embedded.records())

    def kill(self, job_id: str, reason: str = "killed") -> bool:
        """End a job as EXIT: a pending one at once, a running one once its tasks have
        been stopped (SIGTERM, ``kill_grace``, SIGKILL). ``False`` if already finished."""
        with self.lock:
            job = self._job(job_id)
            if job.finished:
                return False
            if job.state is JobState.PEND:
                spec = dict(self.live_store.get(f"job:{job_id}") or {})
                if spec.get("kv"):
                    # Values an earlier version took for a pending job end with it, as
                    # every job's do (they count among its owner's bytes until then).
                    self._drop_kv(job_id, spec)
                    self.live_store.put(f"job:{job_id}", spec)
                killed = self.embedded.kill(job_id, reason)
                self.embedded.flush()
                # A job that never ran has nothing in its directory: it goes too (one is
                # made per submission, and a submit-and-kill loop left one per job for
                # ever). rmdir: a requeued job's has its first run's logs, and stays.
                with contextlib.suppress(OSError):
                    self.job_dir(job_id).rmdir()
                return killed
            self._begin_end(job_id, JobState.EXIT, reason, kill=True)
            self.embedded.flush()
            return True

    def check_invariants(self) -> list[str]:
        return self.embedded.check_invariants()

    def submit_job(self, principal: Principal, body: Any) -> dict[str, Any]:
        """``POST /v1/jobs``: check, record the command and a job token, submit."""
        if principal.job_id is not None:
            raise PermissionDenied("a job token cannot submit jobs")
        sub = parse_submission(body)
        account = job_account(principal.name, single_user=self.cfg.single_user, euid=self.euid)
        check_cwd(sub.cwd, account, self.euid)
        with self.lock:
            self._check_open()
            self._check_pending(principal.name)
            job_id = self._new_job_id()
            salt = self._tokens.new_salt()
            key = f"job:{job_id}"
            self.live_store.put(
                key,
                {
                    "argv": list(sub.command),
                    "cwd": sub.cwd,
                    SALT_FIELD: salt,
                    "launched": False,
                    "account": account_json(account),
                },
            )
            self._make_job_dir(job_id, account)
            try:
                self.embedded.submit_job(principal.name, sub.tasks, sub, env=sub.env, job_id=job_id)
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc  # not the submission's fault
                if fenced_cause(exc) is not None:
                    raise
                self.live_store.put(key, None)
                with contextlib.suppress(OSError):
                    self.job_dir(job_id).rmdir()  # nothing in it: the job never started
                if isinstance(exc, ResizeError):
                    raise
                raise SubmitRejected(str(exc)) from exc
        self._wake.set()
        token = self._tokens.token(job_id, salt)
        return {"id": job_id, "token": token, "job": self.job_json(job_id)}

    def _check_pending(self, user: str) -> None:
        """Refuse a submission past the user's pending job threshold (a user's queue is
        held in memory and in the store: without a bound one user could fill both)."""
        limit = self.cfg.max_pend_jobs
        if limit and (pending := self.embedded.pending_of(user)) >= limit:
            raise PendingJobLimit(
                f"user {user} has {pending} pending jobs ([limits] max_pend_jobs = {limit})"
            )

    def kill_job(self, principal: Principal, job_id: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}``."""
        with self.lock:
            self._check_open()
            job = self._visible(principal, job_id)
            if job.finished:
                raise JobFinished(f"job {job_id} is {job.state.value}")
            try:
                self.kill(job_id, f"killed by {principal.name}")
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc
                raise
        self._wake.set()
        return self.job_json(job_id)

    def hosts_view(self, principal: Principal) -> list[dict[str, Any]]:
        """``GET /v1/hosts`` (:mod:`.host_admin`)."""
        with self.lock:
            self._check_view()
            owners = {job.id: job.user for job in self.embedded.records() if not job.finished}
            return host_admin.hosts_json(self.embedded.host_views(), principal, owners)

    def host_command(
        self, principal: Principal, name: str, action: str, body: Any
    ) -> dict[str, Any]:
        """``POST /v1/hosts/{name}/close|open|down|up``: an administrator drains a host or
        undoes it (with ``evacuate``, resizable jobs are asked to release their tasks
        there), or fences it by hand (:meth:`_host_down_by_hand`, :meth:`_host_up_by_hand`)."""
        evacuate = host_admin.check_command(principal, action, body)
        with self.lock:
            self._check_open()
            try:
                drain = failure = None
                if action == "close":
                    drain = self.embedded.host_close(name, evacuate, principal)
                elif action == "open":
                    self.embedded.host_open(name)
                elif action == "down":
                    failure = self._host_down_by_hand(name, principal)
                else:
                    self._host_up_by_hand(name)
                state = self.embedded.host_view(name).state.value
            except host_admin.HOST_ERRORS as exc:
                raise host_admin.translated(exc) from None
            except Exception as exc:
                if storage_failure(exc) is not None:
                    raise self.storage_failed(exc) from exc
                raise
        self._wake.set()
        log.info("host %s: %s by %s", name, action, principal.name)
        if action == "down":
            return host_admin.failure_json(name, state, failure)
        return host_admin.drain_json(name, state, drain if evacuate else None)

    def kv_put(self, principal: Principal, job_id: str, key: str, body: Any) -> dict[str, Any]:
        """``PUT /v1/jobs/{id}/kv/{key}``: set a value, durably (:mod:`.job_kv`), in a
        job that has started, within the job's keys and its owner's bytes."""
        job_kv.check_key(key)
        value = job_kv.parse_value(body)
        with self.lock:
            name, old, owner = self._kv_record(principal, job_id, key)
            # The job's record lists its keys: counted and removed without a scan.
            spec = dict(self.live_store.get(f"job:{job_id}") or {})
            keys = list(spec.get("kv", []))
            job_kv.check_room(len(keys), old is not None)
            more = kv_stored_size(value) - (0 if old is None else kv_stored_size(old["value"]))
            limit = self.cfg.kv_bytes_per_user
            job_kv.check_user_bytes(owner, self._kv_bytes_of(owner), more, limit)
            if old is None:
                spec["kv"] = [*keys, key]
                self.live_store.put(f"job:{job_id}", spec)
            record = {"value": value, "version": (old["version"] if old else 0) + 1}
            self.live_store.put(name, record)
            self._write_kv()
            return job_kv.answer(key, record)

    def kv_delete(self, principal: Principal, job_id: str, key: str) -> dict[str, Any]:
        """``DELETE /v1/jobs/{id}/kv/{key}``: remove a key, durably; the answer is the
        record removed. :class:`~.job_kv.NoSuchKey` when it is not set (nothing
        changes). Its place counts again among the job's keys, its bytes among its
        owner's, and a key set again starts at version 1."""
        job_kv.check_key(key)
        with self.lock:
            # A pending job takes no value, but one an earlier version took may go.
            name, old, _ = self._kv_record(principal, job_id, key, started=False)
            if old is None:
                raise job_kv.NoSuchKey(f"job {job_id} has no key {key!r}")
            spec = dict(self.live_store.get(f"job:{job_id}") or {})
            spec["kv"] = [k for k in spec.get("kv", []) if k != key]
            self.live_store.put(f"job:{job_id}", spec)
            self.live_store.put(name, None)
            self._write_kv()
            return job_kv.answer(key, old)

    def _kv_record(
        self, principal: Principal, job_id: str, key: str, started: bool = True
    ) -> tuple[str, Any, str]:
        """A change's key as a record name, its record (``None``: not set) and the
        job's owner, in a job the caller may see that has not ended and, when
        ``started``, has started (under the lock)."""
        self._check_open()
        job = self._visible(principal, job_id)
        if job.finished:
            raise JobFinished(f"job {job_id} is {job.state.value}")
        if started:
            job_kv.check_started(job_id, job.state)
        name = job_kv.record_key(job_id, key)
        return name, self.live_store.get(name), job.user

    def _kv_bytes_of(self, user: str) -> int:
        """The stored bytes of the values ``user``'s jobs hold, from the store's count
        per job (only jobs that hold a value: no record is read)."""
        held = 0
        for job_id, size in self.live_store.kv_bytes.items():
            job = self.embedded.record(job_id)
            if job is not None and job.user == user:
                held += size
        return held

    def _write_kv(self) -> None:
        """Write a key-value change now: the client's answer means it is on disk."""
        try:
            self.live_store.write(None, [])
        except Exception as exc:
            if storage_failure(exc) is not None:
                raise self.storage_failed(exc) from exc
            raise

    def kv_get(self, principal: Principal, job_id: str, key: str) -> dict[str, Any] | None:
        """``GET /v1/jobs/{id}/kv/{key}``: the value, or ``None`` when not set (yet).
        :class:`JobFinished` when it is not set and the job has ended: no one will set
        it, so a waiting read ends at once, as the events and wait long polls do."""
        job_kv.check_key(key)
        with self.lock:
            self._check_view()
            job = self._visible(principal, job_id)
            record = self.live_store.get(job_kv.record_key(job_id, key))
            if record is None and job.finished:
                raise JobFinished(f"job {job_id} is {job.state.value}: key {key!r} will not be set")
            return None if record is None else job_kv.answer(key, record)

    def job_view(self, principal: Principal, job_id: str) -> dict[str, Any]:
        with self.lock:
            self._check_view()
            self._visible(principal, job_id)
            return self.job_json(job_id)

    def jobs_view(self, principal: Principal) -> list[dict[str, Any]]:
        with self.lock:
            self._check_view()
            return [
                self.job_json(j.id)
                for j in self.embedded.jobs()
                if principal.may_act_on(j.id, j.user)
            ]

    def job_json(self, job_id: str) -> dict[str, Any]:
        """Everything about one job, JSON-ready (the ``Job`` schema)."""
        with self.lock:
            job = self._job(job_id)
            view = self.embedded.job(job_id)
            spec = self.live_store.get(f"job:{job_id}") or {}
            tasks = []
            for tid, rec in sorted(job.task_states.items()):
                side = self.live_store.get(f"task:{job_id}:{tid}") or {}
                tasks.append(
                    {
                        "id": tid,
                        "host": rec.host,
                        "state": rec.state.value,
                        "pid": side.get("pid"),
                        "status": rec.status,
                        "reason": rec.reason,
                    }
                )
            status = self._hooks.resize_status(self, job_id) if self._opened else None
            usage = self._hooks.acct_usage(self, job_id, self.now()) if self._opened else None
            charged = 0
            if usage is not None and usage.segments and job.state is JobState.RUN:
                charged = usage.segments[-1].slots
            ending = self._ending.get(job_id)
            return {
                "id": job.id,
                "user": job.user,
                "state": job.state.value,
                "command": list(spec.get("argv", [])),
                "cwd": spec.get("cwd"),
                "min_tasks": job.min_tasks,
                "max_tasks": job.max_tasks,
                "ptile": job.ptile,
                "resizable": job.resizable,
                "grow_hosts": job.grow_hosts.value,
                "notify_cmd": job.notify_cmd,
                "submit_time": job.submit_time,
                "start_time": job.start_time,
                "end_time": job.end_time,
                "exit_reason": job.exit_reason,
                "requeues": job.requeues,
                "ending": None
                if ending is None
                else {"state": ending[0].value, "reason": ending[1]},
                "version": job.version,
                "hosts": {h: n for h, n in _counts(job.tasks).items()},
                "allocation": [{"id": t.id, "host": t.host} for t in job.tasks],
                "held": [{"id": t.id, "host": t.host} for t in view.held],
                "tasks": tasks,
                "resize": None if status is None else converters.status_json(status),
                "accounting": {
                    "slot_seconds": 0.0 if usage is None else float(usage.slot_seconds),
                    "charged_slots": charged,
                    "resize_records": 0 if usage is None else len(usage.records),
                },
                "logs": str(self.job_dir(job_id)),
                "hostfile": str(self.job_dir(job_id) / "hostfile"),
                "notifications": [
                    {
                        "attempt": n.attempt,
                        "host": n.host,
                        "command": n.command,
                        "time": n.time,
                        "status": n.status,
                        "reason": n.reason,
                        "stdout": n.stdout,
                        "stderr": n.stderr,
                        "elapsed": n.elapsed,
                    }
                    for n in job.notifications
                ],
            }

    def cluster_json(self) -> dict[str, Any]:
        """Hosts, users, agents and the invariant check (the ``Cluster`` schema)."""
        with self.lock:
            self._check_view()
            workers = self.fleet.view()
            return {
                "epoch": self.live_store.epoch,
                "hosts": {
                    h: {**v, "worker": workers.get(h, {})}
                    for h, v in self.embedded.hosts_view().items()
                },
                "users": {
                    u: {**v, "limit": self.cfg.user_slots.get(u)}
                    for u, v in self.embedded.users_view().items()
                },
                "problems": self.check_invariants(),
            }
