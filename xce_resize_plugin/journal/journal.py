"""The :class:`Journal`: one handle on the journal in a state directory.

Durability: the environment is opened with LMDB's durable defaults (``sync=True``,
``metasync=True``), so :meth:`Journal.commit` returns only after the data and the meta
page have been flushed. :class:`~xce_resize_plugin.journal.group_commit.GroupCommitter`
lets many threads share one such flush.

Fencing: :meth:`Journal.start` increments ``meta.epoch`` and remembers the new value;
every commit first compares it with ``meta.epoch`` in its own transaction and raises
:class:`~xce_resize_plugin.errors.FencedError` (writing nothing) when a newer
controller has started on the same directory since.

LMDB needs a local filesystem (not NFS). Every handle on the same files in this process
shares one environment (:mod:`xce_resize_plugin.journal.files`).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final, Self, TypeVar

import lmdb

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.closing import Closing
from xce_resize_plugin.journal.entries import Entry, StoredState
from xce_resize_plugin.journal.files import SharedEnv, acquire, release
from xce_resize_plugin.journal.lmdb_env import DEFAULT_MAP_SIZE, Fence
from xce_resize_plugin.journal.records import (
    DB_NAMES,
    DONE,
    EPOCH_KEY,
    FACTS,
    HISTORY,
    INDEX,
    JOBS,
    LAST_SEQ_KEY,
    META,
    REMOVED_KEY,
    SEP,
    TAILS,
    U64,
    BadRecord,
    decode_done,
    decode_fact,
    decode_job_key,
    encode_done,
    encode_fact,
    history_prefix,
    history_rows,
    index_prefix,
    job_key,
    key_seq,
    numbered_rows,
    seal,
    seq_key,
    unseal,
)

if TYPE_CHECKING:
    _Txn = lmdb.Transaction[bytes]
    _Db = lmdb._Database

_T = TypeVar("_T")

#: Rows read per read transaction by the iterators. Short transactions never pin old
#: pages (a long reader makes LMDB keep every page it can see, so the file grows) and
#: never hold up a map resize; the iterators resume from the last key seen.
CHUNK = 1024

#: A job's history rows as read: sequence name -> ``(key, sealed value)`` in key order.
_Histories = dict[str, list[tuple[bytes, bytes]]]


class _Prepared:
    """One entry encoded for storage, outside the write lock."""

    __slots__ = ("job", "live", "records", "state", "tails")

    def __init__(self, entry: Entry) -> None:
        self.job = job_key(entry.job_id)
        self.records = [encode_fact(self.job, payload) for payload in entry.facts]
        self.live = entry.ended_at is None
        if entry.ended_at is None:
            self.state = seal(entry.state)
        else:
            self.state = encode_done(float(entry.ended_at), entry.state)
        self.tails = [
            (
                history_prefix(self.job, TAILS[tail.name]),
                tail.start,
                [seal(row) for row in tail.rows],
                tail.stop,
            )
            for tail in entry.history
        ]


class Journal(Closing):
    """A handle on the journal in one directory. Thread-safe; create with :meth:`open`.

    Within this process, the work on one environment is done one transaction at a time
    in arrival order (see :class:`~xce_resize_plugin.journal.turn.TurnLock`); other
    processes read concurrently. Iterators read in chunks of short transactions and
    yield between them, so no caller code ever runs inside a transaction, and a commit
    made while iterating may or may not be seen by the rest of the iteration.
    """

    def __init__(self, shared: SharedEnv, *, readonly: bool, sync: bool) -> None:
        """Private: use :meth:`open`."""
        self._shared_env: SharedEnv | None = shared
        self._file = shared.file
        #: The data file (``<dir>/data.mdb``), as named in error messages.
        self.path: Final = Path(shared.file)
        #: Whether this handle refuses writes.
        self.readonly: Final = readonly
        self._sync = sync
        self._epoch = 0
        self._close_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        path: Path | str,
        *,
        map_size: int = DEFAULT_MAP_SIZE,
        sync: bool = True,
        readonly: bool = False,
    ) -> Self:
        """Open (creating it unless ``readonly``) the journal in directory ``path``.

        ``sync=False`` gives up durability (a system crash may lose the last commits,
        and on a filesystem that reorders writes, damage the file); it is meant for bulk
        loading and tests. The map is ``map_size``, or what the data in use needs if
        that is more (LMDB does not keep a bigger map recorded in the file); it doubles
        when full.

        Raises :class:`JournalError`, naming ``path/data.mdb``, when the file is not an
        LMDB environment, is truncated or damaged, holds something other than a journal,
        or was written by a newer version.
        """
        if map_size <= 0:
            raise ValueError(f"map_size must be positive, not {map_size}")
        # Absolute, so that error messages name the file wherever the reader stands.
        directory = Path(path).absolute()
        shared = acquire(directory, map_size=map_size, sync=sync, readonly=readonly)
        return cls(shared, readonly=readonly, sync=sync)

    @classmethod
    def require(cls, path: Path | str) -> None:
        """Raise :class:`JournalError`, as :meth:`open` does, unless ``path`` holds a
        journal; opened read-only, so that what is no journal (another program's LMDB
        environment) is refused before anything, its files' modes included, changes."""
        with cls.open(path, readonly=True):
            pass

    # -- lifecycle

    def __repr__(self) -> str:
        state = "closed" if self._shared_env is None else f"epoch={self._epoch}"
        return f"<Journal {self._file} {state}>"

    def close(self) -> None:
        """Release this handle; the environment closes with its last handle. Idempotent."""
        with self._close_lock:
            shared, self._shared_env = self._shared_env, None
        if shared is not None:
            release(shared)

    @property
    def epoch(self) -> int:
        """This handle's epoch: 0 until :meth:`start`, then the epoch it took."""
        return self._epoch

    def start(self) -> int:
        """Take the next epoch (durably) and make it this handle's; returns it.

        From now on any handle that started earlier fails its writes with
        :class:`FencedError`: a controller calls this once when it starts.
        """
        self._require_writable()
        shared = self._shared
        with shared.turn:
            self._epoch = shared.env.take_epoch(self._fence()).epoch
            self._flush(shared)
        return self._epoch

    # -- writing

    def commit(self, entries: Sequence[Entry]) -> list[int]:
        """Write ``entries`` in one durable transaction; return the facts' sequence numbers.

        The transaction first checks that no newer controller has started (else
        :class:`FencedError`, nothing written), then appends every fact with
        consecutive sequence numbers, adds their index rows and stores each job's state
        in ``jobs`` or ``done`` (removing it from the other). If the map is full, the
        transaction is abandoned, the map doubled and the whole transaction run again.
        With ``sync=True`` the data is on disk when this returns.
        """
        self._require_writable()
        if not self._epoch:
            raise JournalError(f"{self._file}: call start() before commit()")
        if not entries:
            return []
        # Encoding needs no lock: do it before taking the writer's, to keep that short.
        prepared = []
        for entry in entries:
            if not isinstance(entry, Entry):
                raise TypeError(f"commit() takes Entry objects, not {type(entry).__name__}")
            prepared.append(_Prepared(entry))
        apply = functools.partial(self._apply, prepared, dict(self._shared.dbs))
        return self._write(apply, fence=self._fence())

    def _apply(self, prepared: list[_Prepared], dbs: dict[str, _Db], txn: _Txn) -> list[int]:
        """The body of :meth:`commit`'s transaction (run again whole if the map grows)."""
        facts, index, jobs, done, meta, history = [dbs[name] for name in DB_NAMES]
        seq = self._get_meta(txn, LAST_SEQ_KEY)
        # Stored first, through the LMDB helper: it refuses a last_seq past 2**64 - 1
        # (a damaged one, not a long history) before any sequence key is made.
        last = seq + sum(len(item.records) for item in prepared)
        self._shared.env.put_u64(txn, meta, LAST_SEQ_KEY, last)
        seqs: list[int] = []
        put, delete = txn.put, txn.delete
        for item in prepared:
            prefix = index_prefix(item.job)
            for record in item.records:
                seq += 1
                key = seq_key(seq)
                if not put(key, record, db=facts, append=True):
                    raise JournalError(
                        f"{self._file}: damaged: fact {seq} is not after the last stored "
                        "fact (meta last_seq is behind the facts database)"
                    )
                put(prefix + key, b"", db=index)
                seqs.append(seq)
            put(item.job, item.state, db=jobs if item.live else done)
            delete(item.job, db=done if item.live else jobs)
            for tail_prefix, start, rows, stop in item.tails:
                for i, row in enumerate(rows, start):
                    put(tail_prefix + U64.pack(i), row, db=history)
                for i in range(start + len(rows), stop):
                    delete(tail_prefix + U64.pack(i), db=history)
        return seqs

    # -- reading

    def live_states(self) -> Iterator[tuple[str, StoredState]]:
        """``(job id, state)`` of every live job, in job id order, CRC checked."""
        start = b""
        while True:
            rows = self._read(functools.partial(self._live_chunk, start=start))
            for key, value, histories in rows:
                try:
                    job_id = decode_job_key(key)
                    state = unseal(value)
                except BadRecord as exc:
                    raise JournalError(f"{self._file}: live state of job {key!r}: {exc}") from None
                yield job_id, self._stored(job_id, state, histories)
            if len(rows) < CHUNK:
                return
            start = rows[-1][0] + SEP

    def _live_chunk(self, txn: _Txn, start: bytes) -> list[tuple[bytes, bytes, _Histories]]:
        # A state and its history are read in one transaction: they are consistent.
        return [
            (key, value, self._history_rows(txn, key))
            for key, value in self._scan_chunk(txn, JOBS, start)
        ]

    def _history_rows(self, txn: _Txn, job: bytes) -> _Histories:
        return history_rows(txn.cursor(self._db(HISTORY)), job)

    def _stored(self, job_id: str, state: bytes, histories: _Histories) -> StoredState:
        """Check each history row (CRC, no index missing) and assemble the state."""
        parts: dict[str, tuple[bytes, ...]] = {}
        for name, rows in histories.items():
            values = []
            for expected, (key, value) in enumerate(rows):
                index = key_seq(key)
                if index != expected:
                    raise JournalError(
                        f"{self._file}: damaged: {name} {expected} of job {job_id!r} is missing"
                    )
                try:
                    values.append(unseal(value))
                except BadRecord as exc:
                    raise JournalError(
                        f"{self._file}: {name} {index} of job {job_id!r}: {exc}"
                    ) from None
            parts[name] = tuple(values)
        return StoredState(state, parts.get("records", ()), parts.get("charges", ()))

    def state(self, job_id: str) -> StoredState | None:
        """The latest state of ``job_id``, live or finished, with its history;
        ``None`` if unknown."""
        job = job_key(job_id)

        def get(txn: _Txn) -> tuple[str, bytes, _Histories] | None:
            value = txn.get(job, db=self._db(JOBS))
            db = JOBS
            if value is None:
                value, db = txn.get(job, db=self._db(DONE)), DONE
            if value is None:
                return None
            return db, value, self._history_rows(txn, job)

        found = self._read(get)
        if found is None:
            return None
        db, value, histories = found
        try:
            state = unseal(value) if db == JOBS else decode_done(value)[1]
        except BadRecord as exc:
            raise JournalError(f"{self._file}: {db} state of job {job_id!r}: {exc}") from None
        return self._stored(job_id, state, histories)

    def job_ids(self) -> Iterator[str]:
        """Every job id the journal holds, live then finished (the keys of ``jobs`` and
        ``done``), in job id order within each."""
        for db_name in (JOBS, DONE):
            for key, _value in self._scan(db_name, b""):
                yield key.decode("utf-8", "replace")

    def ended_at(self, job_id: str) -> float | None:
        """When ``job_id`` finished, or ``None`` if it is live or unknown."""
        done = self._done(job_id)
        return None if done is None else done[0]

    def final_state(self, job_id: str) -> bytes | None:
        """A finished job's state payload, without its history rows (what it is and
        who owns it, read cheaply); ``None`` if it is live or unknown."""
        done = self._done(job_id)
        return None if done is None else done[1]

    def _done(self, job_id: str) -> tuple[float, bytes] | None:
        """A finished job's ``done`` record: its end time and final state payload."""
        job = job_key(job_id)
        value = self._read(lambda txn: txn.get(job, db=self._db(DONE)))
        if value is None:
            return None
        try:
            return decode_done(value)
        except BadRecord as exc:
            raise JournalError(f"{self._file}: done state of job {job_id!r}: {exc}") from None

    def facts(self, start: int = 1) -> Iterator[tuple[int, str, bytes]]:
        """``(seq, job id, payload)`` of every fact from ``start`` on, CRC checked."""
        for key, value in self._scan(FACTS, seq_key(max(start, 0))):
            if len(key) != U64.size:
                raise JournalError(f"{self._file}: damaged: malformed fact key {key!r}")
            seq = key_seq(key)
            try:
                job_id, payload = decode_fact(value)
            except BadRecord as exc:
                raise JournalError(f"{self._file}: fact {seq}: {exc}") from None
            yield seq, job_id, payload

    def job_facts(self, job_id: str, after_seq: int = 0) -> Iterator[tuple[int, bytes]]:
        """``(seq, payload)`` of one job's facts in order, through the index; only those
        after sequence number ``after_seq`` (the index is in seq order per job, so a
        reader that has the earlier ones reads only what is new)."""
        prefix = index_prefix(job_key(job_id))
        after = prefix + seq_key(after_seq) + SEP if after_seq > 0 else prefix
        while True:
            chunk = self._read(functools.partial(self._job_chunk, prefix=prefix, after=after))
            for seq, value in chunk:
                if value is None:
                    raise JournalError(
                        f"{self._file}: damaged: the index lists fact {seq} for job "
                        f"{job_id!r}, but there is no such fact"
                    )
                try:
                    owner, payload = decode_fact(value)
                except BadRecord as exc:
                    raise JournalError(f"{self._file}: fact {seq}: {exc}") from None
                if owner != job_id:
                    raise JournalError(
                        f"{self._file}: damaged: the index lists fact {seq} for job "
                        f"{job_id!r}, but it belongs to {owner!r}"
                    )
                yield seq, payload
            if len(chunk) < CHUNK:
                return
            after = prefix + seq_key(chunk[-1][0]) + SEP

    def _job_chunk(self, txn: _Txn, prefix: bytes, after: bytes) -> list[tuple[int, bytes | None]]:
        # The facts are fetched in the index's transaction: the pair is consistent.
        rows: list[tuple[int, bytes | None]] = []
        facts = self._db(FACTS)
        for key, _ in numbered_rows(txn.cursor(self._db(INDEX)), prefix, after):
            seq = key[len(prefix) :]
            rows.append((key_seq(seq), txn.get(seq, db=facts)))
            if len(rows) >= CHUNK:
                break
        return rows

    @property
    def last_seq(self) -> int:
        """The sequence number of the last fact ever committed (0 if none)."""
        return self._read(lambda txn: self._get_meta(txn, LAST_SEQ_KEY))

    def stats(self) -> dict[str, int]:
        """Entries per database, map and file size, ``last_seq``, epochs, facts compacted."""

        def collect(txn: _Txn) -> dict[str, int]:
            out = {name: txn.stat(self._db(name))["entries"] for name in DB_NAMES}
            out["last_seq"] = self._get_meta(txn, LAST_SEQ_KEY)
            out["epoch"] = self._get_meta(txn, EPOCH_KEY)
            out["removed"] = self._removed(txn)
            out["map_size"] = self._shared.env.map_size
            return out

        out = self._read(collect)
        out["handle_epoch"] = self._epoch
        try:
            out["file_size"] = os.stat(self._file).st_size
        except OSError:
            out["file_size"] = 0
        return out

    # -- machinery (also used by verify and compact in this package)

    @property
    def _shared(self) -> SharedEnv:
        shared = self._shared_env
        if shared is None:
            raise JournalError(f"{self._file}: the journal handle is closed")
        return shared

    def _db(self, name: str) -> _Db:
        return self._shared.dbs[name]

    def _fence(self) -> Fence:
        """Where this journal keeps its epoch, holding this handle's epoch."""
        return Fence(
            self._db(META),
            self._epoch,
            EPOCH_KEY,
            subject="the journal",
            advice="; stop this one",
            required=True,
        )

    def _require_writable(self) -> None:
        if self.readonly:
            raise JournalError(f"{self._file}: the journal is open read-only")

    def _get_meta(self, txn: _Txn, key: bytes) -> int:
        return self._shared.env.get_u64(txn, self._db(META), key)

    def _removed(self, txn: _Txn) -> int:
        """``meta.removed``: facts dropped by compaction (absent or invalid: 0)."""
        raw = txn.get(REMOVED_KEY, db=self._db(META))
        return key_seq(raw) if raw is not None and len(raw) == U64.size else 0

    def _read(self, fn: Callable[[_Txn], _T]) -> _T:
        """Run ``fn`` in a read transaction; the values it returns are copies (bytes)."""
        shared = self._shared
        with shared.turn:
            return shared.env.read(fn)

    def _write(self, fn: Callable[[_Txn], _T], fence: Fence | None = None) -> _T:
        """Run ``fn`` in one write transaction (fenced if ``fence`` is given) and commit
        it, growing the map as needed: ``fn`` must be repeatable (see
        :meth:`~xce_resize_plugin.journal.lmdb_env.LmdbEnv.write`)."""
        shared = self._shared
        with shared.turn:
            result = shared.env.write(fn, fence)
            self._flush(shared)
            return result

    def _flush(self, shared: SharedEnv) -> None:
        if self._sync and not shared.sync:
            # The environment was opened without sync by another handle; this one
            # promised durability, so flush before returning.
            shared.env.env.sync(True)

    def _scan(self, db_name: str, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` from ``start`` on, read in chunks of short transactions."""
        key = start
        while True:
            rows = self._read(functools.partial(self._scan_chunk, db_name=db_name, start=key))
            yield from rows
            if len(rows) < CHUNK:
                return
            key = rows[-1][0] + SEP  # the smallest key after the last one seen

    def _scan_chunk(self, txn: _Txn, db_name: str, start: bytes) -> list[tuple[bytes, bytes]]:
        cursor = txn.cursor(self._db(db_name))
        rows: list[tuple[bytes, bytes]] = []
        if not cursor.set_range(start):
            return rows
        for row in cursor:
            rows.append(row)
            if len(rows) >= CHUNK:
                break
        return rows
