"""The embedded controller's own state: LMDB by default, in memory or none for speed.

This is the host's state, not the plugin's journal (that lives in ``state_dir/resize``
and belongs to the plugin). It holds what a restarted controller needs to find its jobs
again: every job record with its held slots and task states, and a ``meta`` record
(schema version, simulated clock, next job id, hosts, limits, the ``[resize]``
section). The controller writes the records it changed after every state-changing call,
so dropping the controller object at any point (a crash) loses nothing but the events
it had not delivered yet. A finished job that its holder drops
(:meth:`~.sim.sim_controller.EmbeddedController.forget_finished`) has its record
deleted in such a write.

Layout: one LMDB environment in ``state_dir/embedded`` with two named databases,
``meta`` (key ``state``, and ``epoch``: a store opened takes the next epoch, and every
write checks it, so a newer controller on the directory fences an older one's writes)
and ``jobs`` (job id -> record). Values are JSON (small,
readable with ``mdb_dump`` when debugging a scenario, and independent of the plugin's
converters) sealed as the journal's records are: a 4-byte big-endian CRC-32 over the
record's key and its JSON, then the JSON (:func:`~xce_resize_plugin.journal.records.seal`).
A record that fails its CRC (damaged, or edited outside the controller: a same-length
edit of a job's owner is no longer silent), a job record under another job's key, a
newer or older schema, or an undecodable record raises :class:`StoreError` naming the
data file and the record rather than starting on half a state.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from attrs import frozen

from xce_resize_plugin.controllers.jobs import JobRecord, NotificationLog, VersionRecord
from xce_resize_plugin.controllers.task_records import TaskRecord, TaskState
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.core.models import GrowHosts, JobState, Task
from xce_resize_plugin.journal.lmdb_env import DEFAULT_MAP_SIZE, Fence, LmdbEnv
from xce_resize_plugin.journal.loading import collector_paused
from xce_resize_plugin.journal.records import BadRecord, seal, unseal

if TYPE_CHECKING:
    import lmdb

    _Txn = lmdb.Transaction[bytes]

#: The store's schema: 2 since its records carry CRCs (schema 1 wrote bare JSON).
SCHEMA = 2
#: The key of the meta record in the ``meta`` database.
_STATE = b"state"
#: What a record that fails its CRC tells the administrator.
_RESTORE = "damaged, or edited outside the controller; restore the state directory from a backup"

Held = Mapping[int, str]


@frozen
class Snapshot:
    """What a store held: the meta record and every job with its held slots."""

    meta: Mapping[str, Any]
    jobs: tuple[tuple[JobRecord, dict[int, str]], ...]


class Store(Protocol):
    """Persistence of the controller's state (see the module docstring)."""

    def load(self) -> Snapshot | None:
        """The saved state, or ``None`` for a new state directory."""

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        """Save ``meta`` (if given) and these jobs, and delete the records of the
        ``deleted`` job ids (finished jobs dropped), in one transaction."""

    def close(self) -> None: ...


# -- encoding -------------------------------------------------------------------------


def _tasks(tasks: Iterable[Task]) -> list[list[Any]]:
    return [[t.id, t.host] for t in tasks]


def _untasks(data: Iterable[list[Any]]) -> tuple[Task, ...]:
    return tuple(Task(int(tid), str(host)) for tid, host in data)


def encode_job(job: JobRecord, held: Held) -> bytes:
    data = {
        "id": job.id,
        "user": job.user,
        "min_tasks": job.min_tasks,
        "max_tasks": job.max_tasks,
        "submit_time": job.submit_time,
        "runtime": job.runtime,
        "estimate": job.estimate,
        "ptile": job.ptile,
        "resizable": job.resizable,
        "autoresize": job.autoresize,
        "grow_hosts": job.grow_hosts.value,
        "notify_cmd": job.notify_cmd,
        "env": job.env,
        "alloc": None if job.alloc is None else [list(p) for p in job.alloc],
        "start_tasks": job.start_tasks,
        "initial_tasks": job.initial_tasks,
        "state": job.state.value,
        "start_time": job.start_time,
        "end_time": job.end_time,
        "tasks": _tasks(job.tasks),
        "version": job.version,
        "versions": [[v.version, v.time, _tasks(v.tasks)] for v in job.versions],
        "task_states": [
            [tid, r.host, r.state.value, r.since, r.status, r.reason, r.stop_since, r.grace]
            for tid, r in job.task_states.items()
        ],
        "exit_reason": job.exit_reason,
        "requeued": job.requeued,
        "requeues": job.requeues,
        "end_reported": job.end_reported,
        "release_exited": job.release_exited,
        "notifications": [
            [
                n.attempt,
                n.host,
                n.command,
                n.time,
                n.status,
                n.reason,
                n.stdout,
                n.stderr,
                n.elapsed,
            ]
            for n in job.notifications
        ],
        "held": _tasks(Task(tid, host) for tid, host in held.items()),
    }
    return json.dumps(data, separators=(",", ":")).encode()


def decode_job(raw: bytes) -> tuple[JobRecord, dict[int, str]]:
    d = json.loads(raw)
    job = JobRecord(
        id=d["id"],
        user=d["user"],
        min_tasks=d["min_tasks"],
        max_tasks=d["max_tasks"],
        submit_time=d["submit_time"],
        runtime=d["runtime"],
        estimate=d["estimate"],
        ptile=d["ptile"],
        resizable=d["resizable"],
        # Stores written before autoresize existed have no key: those jobs had none.
        autoresize=bool(d.get("autoresize", False)),
        grow_hosts=GrowHosts(d["grow_hosts"]),
        notify_cmd=d["notify_cmd"],
        env=dict(d["env"]),
        alloc=None if d["alloc"] is None else tuple((str(h), int(n)) for h, n in d["alloc"]),
        # Absent from records an older version wrote: they had no such caps saved.
        start_tasks=d.get("start_tasks"),
        initial_tasks=d.get("initial_tasks"),
        # Absent from records written before the option existed: those jobs had none.
        release_exited=bool(d.get("release_exited", False)),
        state=JobState(d["state"]),
        start_time=d["start_time"],
        end_time=d["end_time"],
        tasks=_untasks(d["tasks"]),
        version=d["version"],
        versions=[VersionRecord(v, t, _untasks(ts)) for v, t, ts in d["versions"]],
        task_states={
            int(tid): TaskRecord(host, TaskState(state), since, status, reason, stop_since, grace)
            for tid, host, state, since, status, reason, stop_since, grace in d["task_states"]
        },
        exit_reason=d["exit_reason"],
        requeued=bool(d.get("requeued", False)),
        # Records written before the count existed: a requeued job was requeued once
        # at least.
        requeues=int(d.get("requeues", 1 if d.get("requeued") else 0)),
        end_reported=d["end_reported"],
        notifications=[
            NotificationLog(d["id"], a, h, c, t, s, r, o, e, el)
            for a, h, c, t, s, r, o, e, el in d["notifications"]
        ],
    )
    held = {t.id: t.host for t in _untasks(d["held"])}
    return job, held


def encode_meta(meta: Mapping[str, Any]) -> bytes:
    """The meta record as stored: JSON with the schema version, sealed."""
    # default=str: a [resize] value TOML can express but JSON cannot (a date) is kept
    # as text rather than refusing to save the controller's state.
    return seal(json.dumps({"schema": SCHEMA, **meta}, default=str).encode(), _STATE)


def encode_jobs(jobs: Iterable[tuple[JobRecord, Held]]) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of each job record, as the ``jobs`` database holds them."""
    out = []
    for job, held in jobs:
        key = job.id.encode()
        out.append((key, seal(encode_job(job, held), key)))
    return out


def unseal_record(raw: bytes, key: bytes, where: str, what: str) -> bytes:
    """The body of a sealed record, or :class:`StoreError` naming ``where`` (the data
    file) and ``what`` (which record)."""
    try:
        return unseal(raw, key)
    except BadRecord as exc:
        raise StoreError(f"{where}: {what}: {exc}: {_RESTORE}") from None


def _check_meta(raw: bytes, where: str, writer: str = "embedded controller") -> dict[str, Any]:
    try:
        body = unseal(raw, _STATE)
    except BadRecord as exc:
        _check_schema(_bare_json(raw), where, writer)
        raise StoreError(f"{where}: meta record: {exc}: {_RESTORE}") from None
    try:
        meta = json.loads(body)
    except ValueError as exc:
        raise StoreError(f"{where}: corrupt meta record ({exc})") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("schema"), int):
        raise StoreError(f"{where}: meta record without a schema version")
    _check_schema(meta, where, writer)
    return meta


def _bare_json(raw: bytes) -> Any:
    """A meta record written without a CRC (schema 1), decoded; ``None`` if it is not."""
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _check_schema(meta: Any, where: str, writer: str) -> None:
    """Refuse a state of another schema (``meta`` decoded, or ``None``)."""
    schema = meta.get("schema") if isinstance(meta, dict) else None
    if not isinstance(schema, int) or schema == SCHEMA:
        return
    if schema > SCHEMA:
        raise StoreError(
            f"{where}: state written by a newer {writer} (schema {schema}, this one reads {SCHEMA})"
        )
    raise StoreError(
        f"{where}: state of schema {schema}, written by an earlier development version "
        f"(records without CRCs; this version reads schema {SCHEMA} only): start the "
        f"{writer} on a new state directory"
    )


def _decode(raw: bytes, where: str, key: str) -> tuple[JobRecord, dict[int, str]]:
    what = f"job record {key!r}"
    body = unseal_record(raw, key.encode(), where, what)
    try:
        job, held = decode_job(body)
    except (ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"{where}: corrupt {what} ({exc!r})") from exc
    if job.id != key:
        raise StoreError(f"{where}: {what} holds job {job.id!r}: {_RESTORE}")
    return job, held


# -- stores ---------------------------------------------------------------------------


class MemoryStore:
    """Keeps the encoded records in memory. Encoding on every write keeps it honest
    (a restart from it sees exactly what LMDB would give back); handing the same
    object to a new controller simulates a crash without touching the disk."""

    def __init__(self) -> None:
        self._meta: bytes | None = None
        self._jobs: dict[str, bytes] = {}

    def load(self) -> Snapshot | None:
        if self._meta is None:
            return None
        meta = _check_meta(self._meta, "memory store")
        jobs = tuple(_decode(raw, "memory store", key) for key, raw in self._jobs.items())
        return Snapshot(meta, jobs)

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        if meta is not None:
            self._meta = encode_meta(meta)
        for key, value in encode_jobs(jobs):
            self._jobs[key.decode()] = value
        for job_id in deleted:
            self._jobs.pop(job_id, None)

    def close(self) -> None:
        """Nothing to release."""


class NullStore:
    """Saves nothing: for long trace simulations where a restart is never needed."""

    def load(self) -> Snapshot | None:
        return None

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        """Nothing is kept."""

    def close(self) -> None:
        """Nothing to release."""


class LmdbStore:
    """The default store: LMDB in ``path`` (``state_dir/embedded``).

    ``durable=True`` syncs every write (py-lmdb's defaults); ``False`` leaves flushing
    to the OS, which survives a process crash but not a power cut, for long simulations.
    The map grows on ``MapFullError`` and the whole write is retried (within the bounds
    of :class:`~xce_resize_plugin.journal.lmdb_env.LmdbEnv`).
    """

    #: What the store is called in its messages.
    noun = "the embedded controller state"
    #: Who wrote a state of a newer schema, in the message refusing it.
    writer = "embedded controller"
    #: Take the next epoch when opened, and fence every write with it: a second
    #: controller on the state directory makes the first one's writes fail rather
    #: than overwrite its jobs (a subclass that takes it later says False).
    takes_epoch = True

    def __init__(self, path: Path, durable: bool = True, map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.path = path
        # A crash simulated in-process leaves the dropped controller holding the
        # environment until the cycle collector frees it (its runner and timeline refer
        # back to it); LmdbEnv.open collects and tries again once.
        self._env = LmdbEnv.open(
            path,
            noun=self.noun,
            error=StoreError,
            map_size=map_size,
            max_dbs=4,
            sync=durable,
            metasync=durable,
        )
        self._meta_db = self._env.open_db(b"meta")
        self._jobs_db = self._env.open_db(b"jobs")
        self._write_fence: Fence | None = None
        if self.takes_epoch:
            try:
                fence = Fence(self._meta_db, subject="the embedded controller's state")
                self._write_fence = self._env.take_epoch(fence)
            except BaseException:
                self._env.close()
                raise

    @property
    def data_file(self) -> str:
        """The store's data file, as its messages name it."""
        return self._env.name

    def load(self) -> Snapshot | None:
        with collector_paused():
            return self._env.read(self._snapshot)

    def _snapshot(self, txn: _Txn) -> Snapshot | None:
        raw = txn.get(_STATE, db=self._meta_db)
        if raw is None:
            return None
        where = self.data_file
        meta = _check_meta(bytes(raw), where, self.writer)
        jobs = tuple(
            _decode(bytes(value), where, bytes(key).decode())
            for key, value in txn.cursor(db=self._jobs_db)
        )
        return Snapshot(meta, jobs)

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        # Encode first: a retry after MapFullError must not re-run the iterators.
        items = encode_jobs(jobs)
        meta_raw = None if meta is None else encode_meta(meta)
        gone = [job_id.encode() for job_id in deleted]
        self._env.write(functools.partial(self._put, meta_raw, items, gone), self._write_fence)

    def _put(
        self,
        meta_raw: bytes | None,
        items: list[tuple[bytes, bytes]],
        gone: list[bytes],
        txn: _Txn,
    ) -> None:
        """Write the meta record (if given) and these encoded job records, and delete
        the records of the ``gone`` job ids, in ``txn``."""
        if meta_raw is not None:
            txn.put(_STATE, meta_raw, db=self._meta_db)
        for key, value in items:
            txn.put(key, value, db=self._jobs_db)
        for key in gone:
            txn.delete(key, db=self._jobs_db)

    def close(self) -> None:
        self._env.close()
