"""The live controller's agents: their events, reconciliation, lost and returning hosts.

The sixth layer of :class:`~.live_controller.LiveController` (see :mod:`.live_state`):
the agents' task and notification events become the embedded controller's task
reports; an agent that (re)connects is reconciled with what the records say; a host
whose agent is lost, or that an administrator sets down, fails through the embedded
controller's ``host_down``, and takes tasks again once its agent registers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from xce_resize_plugin.controllers.cluster import HostState
from xce_resize_plugin.controllers.hosts import HostFailure
from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live.generations import Generations
from xce_resize_plugin.controllers.live.live_state import TICK
from xce_resize_plugin.controllers.live.tasks import Queued
from xce_resize_plugin.controllers.live.worker import same_run
from xce_resize_plugin.controllers.runners import NotificationResult
from xce_resize_plugin.controllers.task_records import LIVE_STATES, TaskRecord, TaskState
from xce_resize_plugin.controllers.violations import HostStateError
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.host import Principal

log = logging.getLogger(__name__)


class Agents(Generations):
    """The agents' events and the hosts they stand for (see the module docstring)."""

    def worker_events(self, host: str, events: Sequence[Mapping[str, Any]]) -> None:
        # While the state cannot be written the agent's events wait here (applied
        # after the recovery's reconciliation, they change nothing it did not see).
        if not self._await_writable():
            return
        try:
            with self.lock:
                if self.fenced is not None or self.failing is not None:
                    return
                for event in events:
                    self._on_event(host, event)
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc, f"applying the events of {host}")
        self._wake.set()

    def worker_down(self, host: str, queued: Queued) -> None:
        """The host's agent is dead or unheard: the host fails (:meth:`_host_lost`)."""
        try:
            with self.lock:
                if self.fenced is not None or not self._reconciling():
                    return
                self._host_lost(host, f"lost: the agent of {host} died or went unheard")
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc)
        self._wake.set()

    def worker_up(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        """Reconcile this host's tasks with the agent's snapshot (see the module doc)."""
        try:
            with self.lock:
                if self.fenced is not None or not self._reconciling():
                    return
                self._reconcile(host, snapshot, queued)
                self.embedded.flush()
        except Exception as exc:
            self._on_error(exc)
        self._wake.set()

    def _await_writable(self) -> bool:
        """Wait while the state cannot be written; ``False`` once the controller stops."""
        while not self._writable.wait(TICK):
            if self._stopping.is_set():
                return False
        return True

    def _reconciling(self) -> bool:
        """Whether an agent's state may be reconciled now: always, except while the
        state cannot be written — then only by the recovery (:meth:`_recover`), which
        reconciles every agent with the state read back from the disk. (A channel
        calls this holding its own lock: it must not wait here.)"""
        return self.failing is None or threading.get_ident() == self._loop_ident

    def _reconcile(self, host: str, snapshot: Mapping[str, Any], queued: Queued) -> None:
        instance = str(snapshot["instance"])
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        if record.get("instance") not in (None, instance):
            # The agent was replaced while nobody watched: the host failed.
            self._host_lost(host, f"lost: the agent of {host} was replaced")
            record = self.live_store.get(f"host:{host}") or record
        same = record.get("instance") == instance
        known = {(str(t["job"]), int(t["task"])): t for t in snapshot.get("tasks", [])}
        # A host failing at the start loses its tasks then (_settle_hosts): the agent
        # stops what it still runs of them.
        failing = host in self._down_pending
        for job in self.embedded.records():
            if job.finished or failing:
                continue
            for tid, rec in list(job.task_states.items()):
                if rec.host != host or rec.state not in LIVE_STATES:
                    continue
                key = (job.id, tid)
                entry = known.pop(key, None)
                side = self.live_store.get(f"task:{job.id}:{tid}") or {}
                if entry is not None and _other_run(entry, side):
                    # The agent's task of this id is an earlier run's (a requeue whose
                    # forget it missed), not this run's: its launch never got there.
                    entry = None
                if entry is not None:
                    self._sync(host, job.id, tid, entry)
                    stop = side.get("stop")
                    if rec.state is TaskState.STOPPING and stop and entry["state"] == "running":
                        self.fleet.send(host, {"op": "stop", "job": job.id, "task": tid, **stop})
                    continue
                if ("launch", job.id, tid) in queued:
                    continue  # still to be sent: the agent will get it
                never_sent = same or (
                    record.get("instance") is None and side.get("gen", -1) == record.get("gen", 0)
                )
                if never_sent and side.get("launch"):
                    log.info("resending the launch of %s.%s to %s", job.id, tid, host)
                    self.fleet.send(host, self._with_token(side["launch"]))
                    if rec.state is TaskState.STOPPING and side.get("stop"):
                        self.fleet.send(
                            host, {"op": "stop", "job": job.id, "task": tid, **side["stop"]}
                        )
                    continue
                self._task_lost(job, tid, rec, f"lost: the agent of {host} does not know it")
        for (job_id, tid), entry in known.items():
            if entry.get("state") in ("running", "stopping"):
                log.warning("%s: stopping task %s.%s that no job owns", host, job_id, tid)
                self.fleet.send(
                    host, {"op": "stop", "job": job_id, "task": tid, "grace": 0.0, "since": None}
                )
        for key2, (nhost, command, done) in list(self._notifying.items()):
            if nhost != host or ("notify", *key2) in queued:
                continue
            if same:
                self.fleet.send(host, command)  # idempotent per (job, attempt) on the agent
            else:
                del self._notifying[key2]
                done(NotificationResult(None, f"lost: the agent of {host} was replaced"))
        self.live_store.put(
            f"host:{host}", {**record, "instance": instance, "gen": int(record.get("gen", 0)) + 1}
        )
        if self._opened:
            self._host_back(host)

    def _task_lost(self, job: JobRecord, tid: int, rec: TaskRecord, why: str) -> None:
        log.warning("job %s task %s on %s: %s", job.id, tid, rec.host, why)
        if rec.state is TaskState.STARTING:
            self.embedded.task_start_failed(job.id, tid, why)
        else:
            self.embedded.task_exited(job.id, tid, None, why)
        if tid == 0:
            self._begin_end(job.id, JobState.EXIT, f"task 0 {why}")

    def _sync(self, host: str, job_id: str, tid: int, entry: Mapping[str, Any]) -> None:
        """Replay an agent's view of a task as the events that lead to it."""
        state = entry.get("state")
        if state == "failed":
            self._on_event(
                host,
                {"kind": "start_failed", "job": job_id, "task": tid, "reason": entry["reason"]},
            )
            return
        self._on_event(host, {"kind": "started", "job": job_id, "task": tid, "pid": entry["pid"]})
        if state == "exited":
            self._on_event(
                host,
                {
                    "kind": "exited",
                    "job": job_id,
                    "task": tid,
                    "status": entry.get("status"),
                    "reason": entry.get("reason", ""),
                },
            )

    def _on_event(self, host: str, event: Mapping[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "notify_done":
            nkey = (str(event["job"]), int(event["attempt"]))
            pending = self._notifying.pop(nkey, None)
            if pending is None:
                log.info("late result of notification %s.%s ignored", *nkey)
                return
            pending[2](
                NotificationResult(
                    event.get("status"),
                    str(event.get("reason", "")),
                    str(event.get("stdout", "")),
                    str(event.get("stderr", "")),
                    float(event.get("elapsed", 0.0)),
                )
            )
            return
        job_id, tid = str(event["job"]), int(event["task"])
        job = self.embedded.record(job_id)
        rec = job.task_states.get(tid) if job is not None else None
        if job is None or rec is None or rec.host != host:
            log.debug("%s: event for unknown task %s.%s ignored", host, job_id, tid)
            return
        if kind == "started":
            key = f"task:{job_id}:{tid}"
            side = self.live_store.get(key)
            if side is not None and side.get("pid") != event.get("pid"):
                side["pid"] = event.get("pid")
                self.live_store.put(key, side)
            self.embedded.task_started(job_id, tid)
        elif kind == "start_failed":
            reason = str(event.get("reason", ""))
            if rec.state is TaskState.STARTING:
                self.embedded.task_start_failed(job_id, tid, reason)
            elif rec.state in LIVE_STATES:
                # A task the job started with (the controller counts those as running
                # from the start): it never ran.
                self.embedded.task_exited(job_id, tid, None, f"start failed: {reason}")
            if tid == 0:
                self._begin_end(job_id, JobState.EXIT, f"task 0 failed to start: {reason}")
        elif kind == "exited":
            status = event.get("status")
            reason = str(event.get("reason", ""))
            if rec.state is TaskState.STARTING:
                self.embedded.task_started(job_id, tid)
            self.embedded.task_exited(job_id, tid, status, reason)
            if tid == 0:
                if status == 0:
                    self._begin_end(job_id, JobState.DONE, "done")
                else:
                    self._begin_end(job_id, JobState.EXIT, f"task 0 ended: {reason}")

    # -- host failures (docs/live-controller.md, "Lost agents and failed hosts") -----------

    def _host_lost(self, host: str, why: str, *, kill: bool = False) -> HostFailure | None:
        """The host failed (its agent died, was replaced, or went unheard for
        ``agent_timeout``; or ``host down``): a notification running there is answered
        as failed, the commands not yet sent there are dropped, and the embedded
        controller fails the host (``host_down``: its tasks lost, each job shrunk, ended
        or requeued through :meth:`_loss_end`). With ``kill``, the agent is told to
        kill the host's tasks (if it answers). Before the plugin has started, the
        failure waits for :meth:`_settle_hosts`."""
        record = self.live_store.get(f"host:{host}") or {"instance": None, "gen": 0}
        for key, (nhost, _, done) in list(self._notifying.items()):
            if nhost == host:
                del self._notifying[key]
                done(NotificationResult(None, why))
        live = [
            (job.id, tid)
            for job in self.embedded.records()
            if not job.finished
            for tid, rec in job.task_states.items()
            if rec.host == host and rec.state in LIVE_STATES
        ]
        self.fleet.drop(host)
        for job_id, tid in live if kill else ():
            self.fleet.send(
                host, {"op": "stop", "job": job_id, "task": tid, "grace": 0.0, "since": None}
            )
        if not kill and record.get("instance") is not None:
            self.live_store.put(f"host:{host}", {**record, "instance": None})
        if self.embedded.host_view(host).state is HostState.UNAVAIL:
            return None
        if not self._opened:
            if live:
                self._down_pending.add(host)
            return None
        log.warning("host %s failed (%s): %d task(s) lost", host, why, len(live))
        return self.embedded.host_down(host)

    def _host_back(self, host: str) -> None:
        """The host's agent is registered: a failed host takes tasks again (``closed``
        again if it was closed), unless an administrator set it down by hand."""
        record = self.live_store.get(f"host:{host}") or {}
        if record.get("admin_down") or host in self._down_pending:
            return
        if self.embedded.host_view(host).state is HostState.UNAVAIL:
            log.info("host %s is back: its agent is registered", host)
            self.embedded.host_up(host)

    def _settle_hosts(self) -> None:
        """Once the plugin has started: fail the hosts whose agent was lost meanwhile (or
        never answered), then take back every failed host whose agent is registered (a
        restart re-derives ``unavail`` from whether the agents answer)."""
        pending, self._down_pending = sorted(self._down_pending), set()
        for host in pending:
            if self.embedded.host_view(host).state is not HostState.UNAVAIL:
                log.warning("host %s failed: its agent did not answer at the start", host)
                self.embedded.host_down(host)
        for host, _ in self.cfg.hosts:
            if self.fleet.ready(host):
                self._host_back(host)

    def _host_down_by_hand(self, name: str, principal: Principal) -> HostFailure | None:
        """``host down``: fail the host now, as if its agent were lost; its tasks are
        stopped at once if the agent answers (lost either way), and the host stays
        ``unavail`` until ``host up``, whatever its agent does."""
        if self.embedded.host_view(name).state is HostState.UNAVAIL:
            raise HostStateError(f"host {name} is already unavail")
        key = f"host:{name}"
        self.live_store.put(key, {**(self.live_store.get(key) or {"gen": 0}), "admin_down": True})
        return self._host_lost(name, f"lost: host {name} set down by {principal.name}", kill=True)

    def _host_up_by_hand(self, name: str) -> None:
        """``host up``: the host takes tasks again, at once if its agent is registered,
        else once it registers."""
        if self.embedded.host_view(name).state is not HostState.UNAVAIL:
            state = self.embedded.host_view(name).state.value
            raise HostStateError(f"host {name} is {state}, not unavail")
        key = f"host:{name}"
        record = dict(self.live_store.get(key) or {"gen": 0})
        record.pop("admin_down", None)
        self.live_store.put(key, record)
        if self.fleet.ready(name):
            self._host_back(name)


def _other_run(entry: Mapping[str, Any], side: Mapping[str, Any]) -> bool:
    """Whether the agent's task (``entry``) belongs to another run of the job than the
    recorded launch (``side``) names (docs/live-controller.md, "Worker agents"), by the
    agent's own rule (:func:`.worker.same_run`)."""
    launch = side.get("launch")
    ours = launch.get("run") if isinstance(launch, Mapping) else None
    return not same_run(ours, entry.get("run"))
