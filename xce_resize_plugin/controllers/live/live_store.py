"""The live controller's own state: LMDB with fencing and the live side records.

A :class:`~xce_resize_plugin.controllers.store.LmdbStore` (it satisfies the embedded
controller's :class:`~xce_resize_plugin.controllers.store.Store` protocol and keeps the
job records and the ``meta`` record as that store does) that adds what only the live
controller needs, in the same transactions:

- **fencing**: :meth:`LiveStore.start` (by default when the store opens) takes the next
  epoch (durably); every write checks it first and raises
  :class:`~xce_resize_plugin.errors.FencedError`, writing nothing, when a newer
  controller has opened the same state directory (docs/failover.md: the older
  controller's writes fail and it stops). Opened with ``start=False``, the store can be
  read and checked first without changing anything;
- **side records** (database ``live``, JSON sealed with a CRC as the job records are):
  per job its command, working directory, the salt of its token (never the token:
  :mod:`.job_tokens`) and end in progress; per task the launch request sent to its
  worker, without the job token (so a restarted controller can resend a launch that
  never arrived) and its process id; per host the worker instance last reconciled with;
  per key of a job's key-value store (``kv:JOB:KEY``, :mod:`.job_kv`) its value.

The bytes each job's key-value values take in the store are counted in memory
(:attr:`LiveStore.kv_bytes`), as every side record changes and again whenever the side
records are read (at open, and by :meth:`LiveStore.reload`): the controller bounds
what a user's jobs hold without encoding every record at each ``PUT``.

Two callbacks let the controller act at the right moment: ``before_commit`` sees the
job records about to be written (the controller adds side records to the same
transaction), ``after_commit`` runs once they are durable (the controller only then
sends commands to workers: a task is never started before the record that says so).

Layout: ``state_dir/controller`` (not ``state_dir/embedded``: the simulated controller
may share a state directory layout, the two must not share a database).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.store import (
    Held,
    LmdbStore,
    Snapshot,
    encode_jobs,
    encode_meta,
    unseal_record,
)
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.journal.lmdb_env import DEFAULT_MAP_SIZE, Fence
from xce_resize_plugin.journal.records import seal

if TYPE_CHECKING:
    import lmdb

    _Txn = lmdb.Transaction[bytes]


class LiveStore(LmdbStore):
    """See the module docstring. Not thread-safe: the controller lock serialises it."""

    noun = "the live controller state"
    writer = "controller"
    takes_epoch = False  # at start(), after the checks that only read

    def __init__(
        self,
        path: Path,
        durable: bool = True,
        map_size: int = DEFAULT_MAP_SIZE,
        *,
        start: bool = True,
    ) -> None:
        super().__init__(path, durable, map_size)
        self._closed = False
        try:
            self._live_db = self._env.open_db(b"live")
            self.side: dict[str, Any] = self._env.read(self._read_side)
            #: Per job, the bytes its key-value values take in the store
            #: (:func:`kv_stored_size`); only jobs that hold a value have an entry.
            self.kv_bytes: dict[str, int] = _count_kv(self.side)
        except BaseException:
            self.close()
            raise
        self._fence = Fence(self._meta_db, subject="the state")
        #: A snapshot read before start() and the transaction that read it (see load()).
        self._kept: tuple[int, Snapshot | None] | None = None
        self._dirty: set[str] = set()
        self._last_meta: dict[str, Any] | None = None
        self.before_commit: Callable[[list[JobRecord]], None] | None = None
        self.after_commit: Callable[[], None] | None = None
        if start:
            self.start()

    # -- fencing ---------------------------------------------------------------------

    def start(self) -> None:
        """Take the next epoch: from now on an older controller's writes fail."""
        self._fence = self._env.take_epoch(self._fence)

    @property
    def epoch(self) -> int:
        """The epoch this controller took when it started the store (0 before)."""
        return self._fence.epoch

    def stored_epoch(self) -> int:
        """The epoch in the database now (a newer controller's, if one started)."""
        return self._env.read(functools.partial(self._env.stored_epoch, fence=self._fence))

    def check_epoch(self) -> None:
        """Raise :class:`FencedError` if a newer controller took the state directory."""
        self._env.read(functools.partial(self._env.check_fence, fence=self._fence))

    # -- the Store protocol ------------------------------------------------------------

    def load(self) -> Snapshot | None:
        """The saved state. Read before :meth:`start` (to check it), it is kept and
        given again by the next call if the only commit since was this store's epoch:
        decoding every job record is the bulk of a start, and need not be done twice."""
        kept, self._kept = self._kept, None
        if kept is not None and self._env.env.info()["last_txnid"] == kept[0] + 1:
            snapshot = kept[1]
        else:
            txn_id, snapshot = self._env.read(lambda txn: (txn.id(), self._snapshot(txn)))
            if not self.epoch:
                self._kept = (txn_id, snapshot)
        if snapshot is not None:
            self._last_meta = _without_clock(snapshot.meta)
        return snapshot

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        """Write what changed (and delete the ``deleted`` jobs' records), fenced, in one
        transaction; then ``after_commit``.

        A wall-clock controller's meta record changes at every call only because of
        the clock, which a live restart does not need: such a write is skipped, so an
        idle controller does not fsync ten times a second.
        """
        if self._closed:
            return
        pairs = list(jobs)
        if self.before_commit is not None:
            self.before_commit([job for job, _ in pairs])
        meta_raw = None
        if meta is not None and _without_clock(meta) != self._last_meta:
            meta_raw = encode_meta(meta)
        items = encode_jobs(pairs)
        gone = [job_id.encode() for job_id in deleted]
        side = [(k, self.side.get(k)) for k in sorted(self._dirty)]
        if meta_raw is not None or items or gone or side:
            write = functools.partial(self._put_all, meta_raw, items, gone, side)
            self._env.write(write, self._fence)
            self._dirty.clear()
            if meta_raw is not None and meta is not None:
                self._last_meta = _without_clock(meta)
        if self.after_commit is not None:
            self.after_commit()

    def _put_all(
        self,
        meta_raw: bytes | None,
        items: list[tuple[bytes, bytes]],
        gone: list[bytes],
        side: list[tuple[str, Any]],
        txn: _Txn,
    ) -> None:
        self._put(meta_raw, items, gone, txn)
        for skey, svalue in side:
            key = skey.encode()
            if svalue is None:
                txn.delete(key, db=self._live_db)
            else:
                txn.put(key, seal(json.dumps(svalue).encode(), key), db=self._live_db)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            super().close()

    def reload(self) -> None:
        """Forget every change not written: the side records as on disk, none pending.

        After a write failed, so that what the controller knows is what is on disk; the
        job records are read again by the embedded controller built on a new
        :class:`Lease`.
        """
        self.side = self._env.read(self._read_side)
        self.kv_bytes = _count_kv(self.side)
        self._dirty.clear()
        self._last_meta = None

    # -- side records ------------------------------------------------------------------

    def get(self, key: str) -> Any:
        return self.side.get(key)

    def put(self, key: str, value: Any) -> None:
        """Set (``None``: delete) a side record; written with the next :meth:`write`."""
        if key.startswith(KV_PREFIX):
            self._count_kv_change(key, self.side.get(key), value)
        if value is None:
            self.side.pop(key, None)
        else:
            self.side[key] = value
        self._dirty.add(key)

    def _count_kv_change(self, key: str, old: Any, new: Any) -> None:
        job_id = _kv_job(key)
        held = self.kv_bytes.get(job_id, 0) + _kv_size(new) - _kv_size(old)
        if held > 0:
            self.kv_bytes[job_id] = held
        else:
            self.kv_bytes.pop(job_id, None)  # jobs come and go: keep no entry for none

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.side if k.startswith(prefix)]

    def _read_side(self, txn: _Txn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in txn.cursor(db=self._live_db):
            name = bytes(key).decode(errors="replace")
            what = f"side record {name!r}"
            body = unseal_record(bytes(value), bytes(key), self.data_file, what)
            try:
                out[name] = json.loads(body)
            except ValueError as exc:
                raise StoreError(f"{self.data_file}: corrupt {what} ({exc})") from exc
        return out


#: The side records of the jobs' key-value stores: ``kv:JOB:KEY`` (:mod:`.job_kv`).
KV_PREFIX = "kv:"


def kv_stored_size(value: str) -> int:
    """The bytes a key-value value takes in the store: its JSON text as
    :meth:`LiveStore.write` encodes it (ASCII: a control or non-ASCII character is a
    six-byte escape, a character beyond the BMP two), quotes included."""
    return len(json.dumps(value))


def _kv_job(key: str) -> str:
    """The job of a ``kv:JOB:KEY`` record (a key has no ``:``, a job id may)."""
    return key[len(KV_PREFIX) :].rpartition(":")[0]


def _kv_size(record: Any) -> int:
    """The stored bytes of a key-value record's value (0: no record)."""
    if not isinstance(record, dict) or not isinstance(record.get("value"), str):
        return 0
    return kv_stored_size(record["value"])


def _count_kv(side: Mapping[str, Any]) -> dict[str, int]:
    """Per job, the stored bytes of its key-value values, from every side record."""
    out: dict[str, int] = {}
    for key, record in side.items():
        if key.startswith(KV_PREFIX) and (size := _kv_size(record)):
            job_id = _kv_job(key)
            out[job_id] = out.get(job_id, 0) + size
    return out


def _without_clock(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in ("clock", "schema")}


class Lease:
    """The store as one generation of the embedded controller sees it.

    After a failed write the live controller drops its embedded controller (whose
    records ran ahead of the disk) and builds a new one from the store: it revokes the
    old generation's lease first, so that nothing the old one still does — a ``finally``
    on the way out of the failed call — can write. Closing is the live controller's
    business, not a generation's.
    """

    def __init__(self, store: LiveStore) -> None:
        self._store = store
        self.revoked = False

    def load(self) -> Snapshot | None:
        return self._store.load()

    def write(
        self,
        meta: Mapping[str, Any] | None,
        jobs: Iterable[tuple[JobRecord, Held]],
        deleted: Iterable[str] = (),
    ) -> None:
        """:meth:`LiveStore.write`, unless the lease was revoked (then nothing)."""
        if not self.revoked:
            self._store.write(meta, jobs, deleted)

    def close(self) -> None:
        """Nothing: the live controller closes the store itself."""
