"""The live controller's own state: LMDB with fencing and the live side records.

It satisfies the embedded controller's :class:`~xce_resize_plugin.controllers.store.Store`
protocol (the job records and the ``meta`` record, encoded exactly as
:class:`~xce_resize_plugin.controllers.store.LmdbStore` does) and adds what only the live
controller needs, in the same transactions:

- **fencing**: opening the store takes the next epoch (durably); every write checks it
  first and raises :class:`~xce_resize_plugin.errors.FencedError`, writing nothing,
  when a newer controller has opened the same state directory (docs/failover.md: the older
  controller's writes fail and it stops);
- **side records** (database ``live``, JSON): per job its command, working directory,
  token and end in progress; per task the launch request sent to its worker (so a
  restarted controller can resend a launch that never arrived) and its process id;
  per host the worker instance last reconciled with.

Two callbacks let the controller act at the right moment: ``before_commit`` sees the
job records about to be written (the controller adds side records to the same
transaction), ``after_commit`` runs once they are durable (the controller only then
sends commands to workers: a task is never started before the record that says so).

Layout: ``state_dir/controller`` (not ``state_dir/embedded``: the simulated controller
may share a state directory layout, the two must not share a database).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import lmdb

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.store import (
    SCHEMA,
    Held,
    Snapshot,
    decode_job,
    encode_job,
    encode_meta,
)
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.errors import FencedError

_U64 = struct.Struct(">Q")
_EPOCH = b"epoch"
_STATE = b"state"


class LiveStore:
    """See the module docstring. Not thread-safe: the controller lock serialises it."""

    def __init__(self, path: Path, durable: bool = True, map_size: int = 64 << 20) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        try:
            self._env = lmdb.open(
                str(path), map_size=map_size, max_dbs=4, sync=durable, metasync=durable
            )
        except lmdb.Error as exc:
            raise StoreError(f"{path}: cannot open the live controller state ({exc})") from exc
        self._meta_db = self._env.open_db(b"meta")
        self._jobs_db = self._env.open_db(b"jobs")
        self._live_db = self._env.open_db(b"live")
        self.epoch = self._take_epoch()
        self.side: dict[str, Any] = self._load_side()
        self._dirty: set[str] = set()
        self._last_meta: dict[str, Any] | None = None
        self.before_commit: Callable[[list[JobRecord]], None] | None = None
        self.after_commit: Callable[[], None] | None = None
        self._closed = False

    # -- fencing ---------------------------------------------------------------------

    def _take_epoch(self) -> int:
        def bump(txn: Any) -> int:
            raw = txn.get(_EPOCH, db=self._meta_db)
            epoch = (_U64.unpack(bytes(raw))[0] if raw is not None else 0) + 1
            txn.put(_EPOCH, _U64.pack(epoch), db=self._meta_db)
            return epoch

        epoch: int = self._write(bump)
        return epoch

    def stored_epoch(self) -> int:
        """The epoch in the database now (a newer controller's, if one started)."""
        with self._env.begin() as txn:
            raw = txn.get(_EPOCH, db=self._meta_db)
        return _U64.unpack(bytes(raw))[0] if raw is not None else 0

    def check_epoch(self) -> None:
        """Raise :class:`FencedError` if a newer controller took the state directory."""
        stored = self.stored_epoch()
        if stored != self.epoch:
            raise self._fenced(stored)

    def _fenced(self, stored: int) -> FencedError:
        return FencedError(
            f"{self.path}: this controller holds epoch {self.epoch} but the state is at "
            f"epoch {stored}: a newer controller has started on this state directory"
        )

    # -- the Store protocol ------------------------------------------------------------

    def load(self) -> Snapshot | None:
        with self._env.begin() as txn:
            raw = txn.get(_STATE, db=self._meta_db)
            if raw is None:
                return None
            meta = self._check_meta(bytes(raw))
            jobs = []
            for key, value in txn.cursor(db=self._jobs_db):
                try:
                    jobs.append(decode_job(bytes(value)))
                except (ValueError, KeyError, TypeError) as exc:
                    raise StoreError(
                        f"{self.path}: corrupt job record {bytes(key).decode()!r} ({exc!r})"
                    ) from exc
        self._last_meta = _without_clock(meta)
        return Snapshot(meta, tuple(jobs))

    def write(self, meta: Mapping[str, Any] | None, jobs: Iterable[tuple[JobRecord, Held]]) -> None:
        """Write what changed, fenced, in one transaction; then ``after_commit``.

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
        items = [(job.id.encode(), encode_job(job, held)) for job, held in pairs]
        side = [(k, self.side.get(k)) for k in sorted(self._dirty)]
        if meta_raw is not None or items or side:

            def apply(txn: Any) -> None:
                raw = txn.get(_EPOCH, db=self._meta_db)
                stored = _U64.unpack(bytes(raw))[0] if raw is not None else 0
                if stored != self.epoch:
                    raise self._fenced(stored)
                if meta_raw is not None:
                    txn.put(_STATE, meta_raw, db=self._meta_db)
                for key, value in items:
                    txn.put(key, value, db=self._jobs_db)
                for skey, svalue in side:
                    if svalue is None:
                        txn.delete(skey.encode(), db=self._live_db)
                    else:
                        txn.put(skey.encode(), json.dumps(svalue).encode(), db=self._live_db)

            self._write(apply)
            self._dirty.clear()
            if meta_raw is not None and meta is not None:
                self._last_meta = _without_clock(meta)
        if self.after_commit is not None:
            self.after_commit()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()

    # -- side records ------------------------------------------------------------------

    def get(self, key: str) -> Any:
        return self.side.get(key)

    def put(self, key: str, value: Any) -> None:
        """Set (``None``: delete) a side record; written with the next :meth:`write`."""
        if value is None:
            self.side.pop(key, None)
        else:
            self.side[key] = value
        self._dirty.add(key)

    def keys(self, prefix: str) -> list[str]:
        return [k for k in self.side if k.startswith(prefix)]

    def _load_side(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        with self._env.begin() as txn:
            for key, value in txn.cursor(db=self._live_db):
                name = bytes(key).decode()
                try:
                    out[name] = json.loads(bytes(value))
                except ValueError as exc:
                    raise StoreError(f"{self.path}: corrupt side record {name!r} ({exc})") from exc
        return out

    # -- internals -----------------------------------------------------------------------

    def _check_meta(self, raw: bytes) -> dict[str, Any]:
        try:
            meta = json.loads(raw)
        except ValueError as exc:
            raise StoreError(f"{self.path}: corrupt meta record ({exc})") from exc
        if not isinstance(meta, dict) or not isinstance(meta.get("schema"), int):
            raise StoreError(f"{self.path}: meta record without a schema version")
        if meta["schema"] > SCHEMA:
            raise StoreError(
                f"{self.path}: state written by a newer controller "
                f"(schema {meta['schema']}, this one reads {SCHEMA})"
            )
        return meta

    def _write(self, fn: Callable[[Any], Any]) -> Any:
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    return fn(txn)
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)


def _without_clock(meta: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k not in ("clock", "schema")}
