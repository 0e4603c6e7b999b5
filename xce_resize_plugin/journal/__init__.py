"""The LMDB journal: facts + materialised state, group commit, fencing (docs/journal-format.md).

This module stores bytes. It knows nothing about the domain models: the engine encodes
facts and states (:mod:`xce_resize_plugin.core.converters`) and hands the bytes over, so the
storage format of a record and the meaning of its payload can evolve separately.

Layout: one LMDB environment per state directory (``<dir>/data.mdb`` and
``<dir>/lock.mdb``) with five named databases.

``facts``
    8-byte big-endian sequence number -> record. A record is a CRC-32 (4 bytes,
    big-endian, over the rest) + job id (2-byte big-endian length + utf-8) + payload.
    Keys are always written with ``append=True``: a sequence number that is not above
    the last one is refused by LMDB, which would reveal a damaged ``meta``.
``index``
    job id utf-8 + ``b"\\0"`` + 8-byte sequence -> empty. One job's facts, in order,
    for replay and for compaction, without scanning the whole history.
``jobs``
    job id -> CRC-32 + state, for **live** jobs only. Recovery reads ``meta`` and this
    database, so its cost grows with the live jobs, never with the history.
``done``
    job id -> CRC-32 + 8-byte big-endian float ``ended_at`` + state, finished jobs.
``meta``
    ``schema`` (1), ``epoch``, ``last_seq`` and ``removed`` (facts dropped by
    :func:`compact`, absent means 0), each an 8-byte big-endian unsigned integer.

Durability: the environment is opened with LMDB's durable defaults (``sync=True``,
``metasync=True``), so :meth:`Journal.commit` returns only after the data and the meta
page have been flushed. :class:`GroupCommitter` lets many threads share one such flush.

Fencing: :meth:`Journal.start` increments ``meta.epoch`` and remembers the new value;
every write transaction first compares it with ``meta.epoch`` and raises
:class:`~xce_resize_plugin.errors.FencedError` (writing nothing) when a newer controller
has started on the same directory since.

LMDB needs a local filesystem (not NFS). One process must not open the same environment
twice (LMDB's locks are per process and file; py-lmdb refuses it), so every
:class:`Journal` handle on the same files in this process shares one
:class:`lmdb.Environment`, reference-counted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, Self, TextIO, TypeVar

import attrs
import lmdb

from xce_resize_plugin.errors import FencedError, JournalError

__all__ = [
    "DEFAULT_MAP_SIZE",
    "MAX_JOB_ID_BYTES",
    "SCHEMA",
    "Entry",
    "GroupCommitter",
    "Journal",
    "StoredState",
    "Tail",
    "VerifyReport",
    "compact",
    "export",
    "verify",
]

log = logging.getLogger(__name__)

#: The storage schema this version writes and the only one it reads (schema 1 kept a
#: job's resize records and charge steps inside its state; see docs/journal-format.md).
SCHEMA: Final = 2
#: Initial map size; the map doubles whenever a transaction does not fit.
DEFAULT_MAP_SIZE: Final = 64 * 1024 * 1024
#: Longest job id (utf-8 bytes): the ``index`` key adds 9 bytes and LMDB's keys are at
#: most 511 bytes long.
MAX_JOB_ID_BYTES: Final = 500

_DATA_FILE: Final = "data.mdb"
_FACTS, _INDEX, _JOBS, _DONE, _META = "facts", "index", "jobs", "done", "meta"
_HISTORY: Final = "history"
_DB_NAMES: Final = (_FACTS, _INDEX, _JOBS, _DONE, _META, _HISTORY)
#: The sequences of a job's history and their key tags: resize records, charge steps.
_TAILS: Final = {"records": b"r", "charges": b"c"}
_TAIL_NAMES: Final = {tag: name for name, tag in _TAILS.items()}
_SCHEMA_KEY, _EPOCH_KEY, _LAST_SEQ_KEY, _REMOVED_KEY = b"schema", b"epoch", b"last_seq", b"removed"

_U64: Final = struct.Struct(">Q")
_CRC: Final = struct.Struct(">I")
_LEN: Final = struct.Struct(">H")
_F64: Final = struct.Struct(">d")
_SEP: Final = b"\0"

#: Rows read per read transaction by the iterators. Short transactions never pin old
#: pages (a long reader makes LMDB keep every page it can see, so the file grows) and
#: never hold up a map resize; the iterators resume from the last key seen.
_CHUNK: Final = 1024
#: Upper bound on map doublings / re-maps for one transaction: 2**32 times the initial
#: map is beyond any disk, so hitting it means something else is wrong.
_MAX_REMAPS: Final = 32
#: Problems listed by :func:`verify` before it only counts the rest.
_MAX_PROBLEMS: Final = 200
#: Missing sequence ranges shown in :func:`verify`'s continuity problem.
_MAX_GAPS: Final = 10

_T = TypeVar("_T")
if TYPE_CHECKING:
    # py-lmdb's stubs make Transaction generic; the runtime class is not subscriptable.
    _Txn = lmdb.Transaction[bytes]
    _Db = lmdb._Database


# --------------------------------------------------------------------------- records


class _BadRecord(Exception):
    """A stored value failed its checks; the caller adds which record and which file."""


def _seal(body: bytes) -> bytes:
    """Prefix ``body`` with its CRC-32, so bit rot and torn writes outside LMDB show."""
    return _CRC.pack(zlib.crc32(body)) + body


def _unseal(value: bytes) -> bytes:
    """Return the body of a sealed value, or raise :class:`_BadRecord`."""
    if len(value) < _CRC.size:
        raise _BadRecord(f"record too short ({len(value)} bytes)")
    (stored,) = _CRC.unpack_from(value)
    body = value[_CRC.size :]
    computed = zlib.crc32(body)
    if stored != computed:
        raise _BadRecord(f"CRC mismatch (stored {stored:08x}, computed {computed:08x})")
    return body


def _encode_fact(job_key: bytes, payload: bytes) -> bytes:
    return _seal(_LEN.pack(len(job_key)) + job_key + payload)


def _decode_fact(value: bytes) -> tuple[str, bytes]:
    body = _unseal(value)
    if len(body) < _LEN.size:
        raise _BadRecord("record too short for its job id")
    (size,) = _LEN.unpack_from(body)
    end = _LEN.size + size
    if len(body) < end:
        raise _BadRecord("job id runs past the end of the record")
    try:
        job_id = body[_LEN.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRecord(f"job id is not utf-8 ({exc})") from None
    return job_id, body[end:]


def _encode_done(ended_at: float, state: bytes) -> bytes:
    return _seal(_F64.pack(ended_at) + state)


def _decode_done(value: bytes) -> tuple[float, bytes]:
    body = _unseal(value)
    if len(body) < _F64.size:
        raise _BadRecord("record too short for its end time")
    (ended_at,) = _F64.unpack_from(body)
    return ended_at, body[_F64.size :]


def _seq_key(seq: int) -> bytes:
    return _U64.pack(seq)


def _index_prefix(job_key: bytes) -> bytes:
    return job_key + _SEP


def _split_index_key(key: bytes) -> tuple[str, int]:
    """``job\\0seq`` -> (job id, seq); raises :class:`_BadRecord` when malformed."""
    if len(key) < 1 + len(_SEP) + _U64.size or key[-_U64.size - 1 : -_U64.size] != _SEP:
        raise _BadRecord(f"malformed index key {key!r}")
    try:
        job_id = key[: -_U64.size - 1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRecord(f"index key {key!r} has a job id that is not utf-8 ({exc})") from None
    return job_id, _U64.unpack(key[-_U64.size :])[0]


def _history_prefix(job_key: bytes, tag: bytes) -> bytes:
    return job_key + _SEP + tag


def _split_history_key(key: bytes) -> tuple[str, str, int]:
    """``job\0tag index`` -> (job id, sequence name, index), or :class:`_BadRecord`."""
    size = 1 + len(_SEP) + 1 + _U64.size
    if len(key) < size or key[-_U64.size - 2 : -_U64.size - 1] != _SEP:
        raise _BadRecord(f"malformed history key {key!r}")
    name = _TAIL_NAMES.get(key[-_U64.size - 1 : -_U64.size])
    if name is None:
        raise _BadRecord(f"history key {key!r} names no known sequence")
    job_id = _decode_job_key(key[: -_U64.size - 2])
    return job_id, name, _U64.unpack(key[-_U64.size :])[0]


def _job_key(job_id: str) -> bytes:
    return job_id.encode("utf-8")


def _decode_job_key(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRecord(f"job id {key!r} is not utf-8 ({exc})") from None


# --------------------------------------------------------------------------- entries


def _check_job_id(_instance: object, _attribute: object, value: str) -> None:
    """Job ids become LMDB keys: non-empty, no NUL (the index separator), short enough."""
    if not value or "\0" in value:
        raise ValueError(f"job_id must be non-empty and contain no NUL: {value!r}")
    if len(value.encode("utf-8")) > MAX_JOB_ID_BYTES:
        raise ValueError(f"job_id longer than {MAX_JOB_ID_BYTES} utf-8 bytes: {value[:40]!r}...")


def _to_facts(value: Iterable[bytes]) -> tuple[bytes, ...]:
    facts = tuple(value)
    for fact in facts:
        if not isinstance(fact, bytes):
            raise TypeError(f"facts must be bytes, not {type(fact).__name__}")
    return facts


def _is_time(value: object) -> bool:
    """A real number of seconds: a bool is not one, nor is NaN."""
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _check_ended_at(_instance: object, _attribute: object, value: float | None) -> None:
    # NaN is refused: it compares false with everything, so compaction would never drop it.
    if value is not None and not _is_time(value):
        raise ValueError(f"ended_at must be a number of seconds or None, not {value!r}")


def _check_tail_name(_instance: object, _attribute: object, value: str) -> None:
    if value not in _TAILS:
        raise ValueError(f"unknown history sequence {value!r} (known: {', '.join(_TAILS)})")


def _check_tail(instance: Tail, _attribute: object, value: int) -> None:
    if not 0 <= instance.start <= instance.stop:
        raise ValueError(f"a tail needs 0 <= start <= stop, got {instance.start}, {value}")


@attrs.frozen
class Tail:
    """The end of one of a job's history sequences (``records``: resize records,
    ``charges``: charged-slot steps) as a transition left it.

    ``rows`` replace the stored rows from index ``start`` on; ``stop`` is how many rows
    the sequence had before, so rows ``start + len(rows)`` up to ``stop`` are removed (a
    charge step at the same instant as the one before replaces it). The sequences only
    ever change at their end: a transition writes what changed, not the whole history.
    """

    name: str = attrs.field(validator=_check_tail_name)
    start: int
    rows: tuple[bytes, ...] = attrs.field(converter=_to_facts)
    stop: int = attrs.field(validator=_check_tail)


def _to_tails(value: Iterable[Tail]) -> tuple[Tail, ...]:
    tails = tuple(value)
    for tail in tails:
        if not isinstance(tail, Tail):
            raise TypeError(f"history must be Tail objects, not {type(tail).__name__}")
    return tails


@attrs.frozen
class Entry:
    """One engine transition of one job: the facts it appends, the job's new state and
    what changed at the end of its history.

    ``ended_at`` is ``None`` while the job is live (its state goes to ``jobs``); a time
    (seconds since the epoch) moves the state to ``done``, out of the recovery path.
    The history (``history`` database) stays where it is either way.
    """

    job_id: str = attrs.field(validator=[attrs.validators.instance_of(str), _check_job_id])
    facts: tuple[bytes, ...] = attrs.field(converter=_to_facts)
    state: bytes = attrs.field(validator=attrs.validators.instance_of(bytes))
    ended_at: float | None = attrs.field(default=None, validator=_check_ended_at)
    history: tuple[Tail, ...] = attrs.field(default=(), converter=_to_tails)


@attrs.frozen
class StoredState:
    """A job's stored state payload and its history rows, each sequence in order."""

    state: bytes
    records: tuple[bytes, ...] = ()
    charges: tuple[bytes, ...] = ()


# --------------------------------------------------------------------------- sharing


class _TurnLock:
    """A mutex granted in arrival order: the lock of one environment in this process.

    Every piece of LMDB work on the environment (one read chunk, one whole write
    transaction, a remap, the close) takes a turn. py-lmdb serialises its calls on an
    environment anyway (an internal lock per environment), but that lock is not fair:
    threads that read in a tight loop can keep a writer out indefinitely (seen with
    three readers: a commit did not get its turn within minutes). Handing the lock over
    in arrival order bounds every wait by the work queued ahead of it (a reader waits
    at most for the write transaction in progress, fsync included). Holding the turn
    also means no transaction of this process is open, which LMDB requires for changing
    the map size. Other processes are not affected: LMDB readers never block writers.
    """

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._queue: deque[threading.Lock] = deque()
        self._held = False

    def __enter__(self) -> None:
        with self._guard:
            if not self._held:
                self._held = True
                return
            turn = threading.Lock()
            turn.acquire()
            self._queue.append(turn)
        try:
            turn.acquire()  # released by the previous holder, who hands its turn over
        except BaseException:  # e.g. KeyboardInterrupt while waiting
            with self._guard:
                if turn in self._queue:
                    self._queue.remove(turn)  # never reached: just leave the line
                else:
                    self._pass_on()  # the turn was handed over already: pass it on
            raise

    def __exit__(self, *exc: object) -> None:
        with self._guard:
            self._pass_on()

    def _pass_on(self) -> None:
        # Called with the guard held by the holder of the turn.
        if self._queue:
            self._queue.popleft().release()  # still held: now by the next in line
        else:
            self._held = False


@attrs.define(eq=False)
class _SharedEnv:
    """One open environment and what every handle on it in this process shares."""

    env: lmdb.Environment
    file: str
    key: tuple[int, int]
    readonly: bool
    sync: bool
    dbs: dict[str, _Db]
    users: int = 0
    turn: _TurnLock = attrs.field(factory=_TurnLock)


_REGISTRY: dict[tuple[int, int], _SharedEnv] = {}
_REGISTRY_LOCK = threading.Lock()


def _file_key(data_file: Path) -> tuple[int, int] | None:
    """Identity of the data file: the same files under another path are the same env."""
    try:
        st = data_file.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def _lmdb_reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _acquire(path: Path, *, map_size: int, sync: bool, readonly: bool) -> _SharedEnv:
    data_file = path / _DATA_FILE
    with _REGISTRY_LOCK:
        key = _file_key(data_file)
        shared = _REGISTRY.get(key) if key is not None else None
        if shared is None:
            shared = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=readonly)
            _REGISTRY[shared.key] = shared
        elif shared.readonly and not readonly:
            _reopen_writable(shared, path, data_file, map_size=map_size, sync=sync)
        shared.users += 1
        return shared


def _reopen_writable(
    shared: _SharedEnv, path: Path, data_file: Path, *, map_size: int, sync: bool
) -> None:
    """Swap a read-only environment for a writable one under its existing handles.

    The files cannot be opened twice in one process, so the read-only environment is
    closed and the same files opened for writing; the read-only handles keep working
    (they refuse writes themselves). Called with the registry lock held.
    """
    with shared.turn:
        shared.env.close()
        try:
            fresh = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=False)
        except BaseException:
            # Give the existing handles their environment back before reporting.
            with contextlib.suppress(JournalError):
                old = _open_env(path, data_file, map_size=map_size, sync=sync, readonly=True)
                shared.env, shared.dbs = old.env, old.dbs
            raise
        shared.env, shared.dbs, shared.readonly, shared.sync = fresh.env, fresh.dbs, False, sync


def _release(shared: _SharedEnv) -> None:
    # Closed under the registry lock: an open() racing with the last close() must find
    # either the registered environment or none at all, never one still closing (which
    # py-lmdb would refuse as "already open in this process").
    with _REGISTRY_LOCK:
        shared.users -= 1
        if shared.users:
            return
        if _REGISTRY.get(shared.key) is shared:
            del _REGISTRY[shared.key]
        with shared.turn:
            shared.env.close()


def _open_env(
    path: Path, data_file: Path, *, map_size: int, sync: bool, readonly: bool
) -> _SharedEnv:
    """Open and check the environment; create a fresh journal only in an empty one."""
    if readonly:
        if not data_file.is_file():
            raise JournalError(f"{data_file}: no journal here (the file does not exist)")
    else:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"{data_file}: cannot create the directory: {exc}") from exc
    try:
        size: int | None = data_file.stat().st_size
    except FileNotFoundError:
        size = None
    except OSError as exc:
        raise JournalError(f"{data_file}: cannot stat the file: {exc}") from exc
    if size == 0:
        # LMDB would silently start a new, empty environment over a zero-length file.
        raise JournalError(
            f"{data_file}: the file is empty (truncated?); refusing to start a new journal "
            "over it. Move it away only if this is a fresh installation."
        )
    # Without sync (simulations), LMDB writes through the map instead of copying every
    # dirty page to the file at each commit. It then extends the file to the map size
    # as it opens it, which would hide a truncation from _check_size: check first.
    writemap = not sync and not readonly
    if writemap and size is not None:
        _check_size_read_only(path, data_file)
    try:
        env = lmdb.open(
            str(path),
            map_size=map_size,
            subdir=True,
            readonly=readonly,
            sync=sync,
            metasync=True,
            writemap=writemap,
            create=not readonly,
            max_dbs=len(_DB_NAMES) + 1,
        )
    except lmdb.Error as exc:
        raise JournalError(
            f"{data_file}: not a usable LMDB environment ({_lmdb_reason(exc)})"
        ) from exc
    try:
        _check_size(env, data_file)
        dbs = _open_dbs(env, data_file, readonly=readonly)
        key = _file_key(data_file)
        if key is None:
            raise JournalError(f"{data_file}: the file disappeared while opening it")
    except BaseException:
        env.close()
        raise
    return _SharedEnv(env=env, file=str(data_file), key=key, readonly=readonly, sync=sync, dbs=dbs)


def _check_size(env: lmdb.Environment, data_file: Path) -> None:
    """Refuse a data file shorter than its own meta page says it is.

    LMDB maps the file and does not check this: reading a page past the end of a
    truncated file kills the process with SIGBUS instead of raising.
    """
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        actual = data_file.stat().st_size
    except (lmdb.Error, OSError) as exc:
        raise JournalError(f"{data_file}: cannot read the file ({_lmdb_reason(exc)})") from exc
    if actual < needed:
        raise JournalError(
            f"{data_file}: truncated: {actual} bytes on disk, but its last page ends at byte "
            f"{needed}"
        )


def _check_size_read_only(path: Path, data_file: Path) -> None:
    """:func:`_check_size` on a read-only view of the file (which LMDB leaves as is)."""
    try:
        env = lmdb.open(str(path), subdir=True, readonly=True, lock=False, max_dbs=0)
    except lmdb.Error as exc:
        raise JournalError(
            f"{data_file}: not a usable LMDB environment ({_lmdb_reason(exc)})"
        ) from exc
    try:
        _check_size(env, data_file)
    finally:
        env.close()


def _open_dbs(env: lmdb.Environment, data_file: Path, *, readonly: bool) -> dict[str, _Db]:
    """Open the named databases; initialise a journal only in an empty environment."""
    try:
        with env.begin() as txn:
            has_meta = txn.get(_META.encode()) is not None
            empty = not txn.cursor().first()
    except lmdb.Error as exc:
        raise JournalError(f"{data_file}: damaged ({_lmdb_reason(exc)})") from exc
    if not has_meta and not empty:
        raise JournalError(
            f"{data_file}: an LMDB environment, but not a journal (no meta database)"
        )
    if not has_meta and readonly:
        raise JournalError(f"{data_file}: an empty LMDB environment, not a journal yet")
    dbs: dict[str, _Db] = {}
    if has_meta:
        _check_schema(env, data_file)
        for name in _DB_NAMES:
            try:
                dbs[name] = env.open_db(name.encode(), create=False)
            except lmdb.NotFoundError:
                raise JournalError(
                    f"{data_file}: damaged: the {name} database is missing"
                ) from None
            except lmdb.Error as exc:
                raise JournalError(
                    f"{data_file}: cannot open the {name} database ({_lmdb_reason(exc)})"
                ) from exc
    else:
        try:
            with env.begin(write=True) as txn:
                for name in _DB_NAMES:
                    dbs[name] = env.open_db(name.encode(), txn=txn, create=True)
                # overwrite=False: a second process initialising at the same moment must
                # not reset an epoch the first one has already taken.
                for key in (_SCHEMA_KEY, _EPOCH_KEY, _LAST_SEQ_KEY, _REMOVED_KEY):
                    value = SCHEMA if key == _SCHEMA_KEY else 0
                    txn.put(key, _U64.pack(value), db=dbs[_META], overwrite=False)
        except lmdb.Error as exc:
            raise JournalError(
                f"{data_file}: cannot initialise a new journal ({_lmdb_reason(exc)})"
            ) from exc
    _check_schema(env, data_file)
    return dbs


def _check_schema(env: lmdb.Environment, data_file: Path) -> None:
    """Refuse a journal of another schema before opening its databases (a different
    schema may have different ones)."""
    try:
        meta = env.open_db(_META.encode(), create=False)
        with env.begin() as txn:
            raw = txn.get(_SCHEMA_KEY, db=meta)
    except lmdb.Error as exc:
        raise JournalError(f"{data_file}: damaged ({_lmdb_reason(exc)})") from exc
    if raw is None or len(raw) != _U64.size:
        raise JournalError(f"{data_file}: damaged: meta has no valid schema version")
    (schema,) = _U64.unpack(raw)
    if schema > SCHEMA:
        raise JournalError(
            f"{data_file}: written by a newer version (journal schema {schema}, this version "
            f"reads up to {SCHEMA}); upgrade xce_resize_plugin"
        )
    if schema == 1:
        raise JournalError(
            f"{data_file}: journal schema 1, written by an earlier development version of "
            f"xce_resize_plugin (this version reads schema {SCHEMA} only); export its facts "
            "with that version (`xce-resize journal export`) and start from a new state "
            "directory"
        )
    if schema < 1:
        raise JournalError(f"{data_file}: unknown journal schema {schema}")


# --------------------------------------------------------------------------- journal


class Journal:
    """A handle on the journal in one directory. Thread-safe; create with :meth:`open`.

    Within this process, the work on one environment is done one transaction at a time
    in arrival order (see :class:`_TurnLock`); other processes read concurrently.
    Iterators read in chunks of short transactions and yield between them, so no caller
    code ever runs inside a transaction, and a commit made while iterating may or may
    not be seen by the rest of the iteration.
    """

    def __init__(self, shared: _SharedEnv, *, readonly: bool, sync: bool) -> None:
        """Private: use :meth:`open`."""
        self._shared_env: _SharedEnv | None = shared
        self._file = shared.file
        self._readonly = readonly
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
        loading and tests. A map bigger than
        ``map_size`` recorded in the file is kept; the map doubles when full.

        Raises :class:`JournalError`, naming ``path/data.mdb``, when the file is not an
        LMDB environment, is truncated or damaged, holds something other than a journal,
        or was written by a newer version.
        """
        if map_size <= 0:
            raise ValueError(f"map_size must be positive, not {map_size}")
        # Absolute, so that error messages name the file wherever the reader stands.
        directory = Path(path).absolute()
        shared = _acquire(directory, map_size=map_size, sync=sync, readonly=readonly)
        return cls(shared, readonly=readonly, sync=sync)

    # -- lifecycle

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._shared_env is None else f"epoch={self._epoch}"
        return f"<Journal {self._file} {state}>"

    def close(self) -> None:
        """Release this handle; the environment closes with its last handle. Idempotent."""
        with self._close_lock:
            shared, self._shared_env = self._shared_env, None
        if shared is not None:
            _release(shared)

    @property
    def path(self) -> Path:
        """The data file (``<dir>/data.mdb``), as named in error messages."""
        return Path(self._file)

    @property
    def readonly(self) -> bool:
        """Whether this handle refuses writes."""
        return self._readonly

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

        def bump(txn: _Txn) -> int:
            epoch = self._get_meta(txn, _EPOCH_KEY) + 1
            txn.put(_EPOCH_KEY, _U64.pack(epoch), db=self._db(_META))
            return epoch

        self._epoch = self._write(bump)
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
            job_key = _job_key(entry.job_id)
            records = [_encode_fact(job_key, payload) for payload in entry.facts]
            if entry.ended_at is None:
                state_value = _seal(entry.state)
            else:
                state_value = _encode_done(float(entry.ended_at), entry.state)
            tails = [
                (
                    _history_prefix(job_key, _TAILS[tail.name]),
                    tail.start,
                    [_seal(row) for row in tail.rows],
                    tail.stop,
                )
                for tail in entry.history
            ]
            prepared.append((job_key, records, entry.ended_at is None, state_value, tails))
        epoch = self._epoch
        dbs = self._shared.dbs
        facts, index, jobs, done, meta, history = [dbs[name] for name in _DB_NAMES]

        def apply(txn: _Txn) -> list[int]:
            stored = self._get_meta(txn, _EPOCH_KEY, meta)
            if stored != epoch:
                raise FencedError(
                    f"{self._file}: this controller holds epoch {epoch} but the journal is at "
                    f"epoch {stored}: a newer controller has started on this state "
                    "directory; stop this one"
                )
            seq = self._get_meta(txn, _LAST_SEQ_KEY, meta)
            seqs: list[int] = []
            put, delete = txn.put, txn.delete
            for job_key, records, live, state_value, tails in prepared:
                prefix = _index_prefix(job_key)
                for record in records:
                    seq += 1
                    key = _seq_key(seq)
                    if not put(key, record, db=facts, append=True):
                        raise JournalError(
                            f"{self._file}: damaged: fact {seq} is not after the last stored "
                            "fact (meta last_seq is behind the facts database)"
                        )
                    put(prefix + key, b"", db=index)
                    seqs.append(seq)
                if live:
                    put(job_key, state_value, db=jobs)
                    delete(job_key, db=done)
                else:
                    put(job_key, state_value, db=done)
                    delete(job_key, db=jobs)
                for tail_prefix, start, rows, stop in tails:
                    for i, row in enumerate(rows, start):
                        put(tail_prefix + _U64.pack(i), row, db=history)
                    for i in range(start + len(rows), stop):
                        delete(tail_prefix + _U64.pack(i), db=history)
            put(_LAST_SEQ_KEY, _U64.pack(seq), db=meta)
            return seqs

        return self._write(apply)

    # -- reading

    def live_states(self) -> Iterator[tuple[str, StoredState]]:
        """``(job id, state)`` of every live job, in job id order, CRC checked."""
        start = b""
        while True:
            rows = self._read(functools.partial(self._live_chunk, start=start))
            for key, value, histories in rows:
                try:
                    job_id = _decode_job_key(key)
                    state = _unseal(value)
                except _BadRecord as exc:
                    raise JournalError(f"{self._file}: live state of job {key!r}: {exc}") from None
                yield job_id, self._stored(job_id, state, histories)
            if len(rows) < _CHUNK:
                return
            start = rows[-1][0] + _SEP

    def _live_chunk(
        self, txn: _Txn, start: bytes
    ) -> list[tuple[bytes, bytes, dict[str, list[tuple[bytes, bytes]]]]]:
        # A state and its history are read in one transaction: they are consistent.
        return [
            (key, value, self._history_rows(txn, key))
            for key, value in self._scan_chunk(txn, _JOBS, start)
        ]

    def _history_rows(self, txn: _Txn, job_key: bytes) -> dict[str, list[tuple[bytes, bytes]]]:
        out: dict[str, list[tuple[bytes, bytes]]] = {}
        cursor = txn.cursor(self._db(_HISTORY))
        for name, tag in _TAILS.items():
            prefix = _history_prefix(job_key, tag)
            rows: list[tuple[bytes, bytes]] = []
            if cursor.set_range(prefix):
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    if len(key) == len(prefix) + _U64.size:
                        rows.append((key, value))
            out[name] = rows
        return out

    def _stored(
        self, job_id: str, state: bytes, histories: dict[str, list[tuple[bytes, bytes]]]
    ) -> StoredState:
        """Check each history row (CRC, no index missing) and assemble the state."""
        parts: dict[str, tuple[bytes, ...]] = {}
        for name, rows in histories.items():
            values = []
            for expected, (key, value) in enumerate(rows):
                index = _U64.unpack(key[-_U64.size :])[0]
                if index != expected:
                    raise JournalError(
                        f"{self._file}: damaged: {name} {expected} of job {job_id!r} is missing"
                    )
                try:
                    values.append(_unseal(value))
                except _BadRecord as exc:
                    raise JournalError(
                        f"{self._file}: {name} {index} of job {job_id!r}: {exc}"
                    ) from None
            parts[name] = tuple(values)
        return StoredState(state, parts.get("records", ()), parts.get("charges", ()))

    def state(self, job_id: str) -> StoredState | None:
        """The latest state of ``job_id``, live or finished, with its history;
        ``None`` if unknown."""
        job_key = _job_key(job_id)

        def get(
            txn: _Txn,
        ) -> tuple[str, bytes, dict[str, list[tuple[bytes, bytes]]]] | None:
            value = txn.get(job_key, db=self._db(_JOBS))
            db = _JOBS
            if value is None:
                value, db = txn.get(job_key, db=self._db(_DONE)), _DONE
            if value is None:
                return None
            return db, value, self._history_rows(txn, job_key)

        found = self._read(get)
        if found is None:
            return None
        db, value, histories = found
        try:
            state = _unseal(value) if db == _JOBS else _decode_done(value)[1]
        except _BadRecord as exc:
            raise JournalError(f"{self._file}: {db} state of job {job_id!r}: {exc}") from None
        return self._stored(job_id, state, histories)

    def ended_at(self, job_id: str) -> float | None:
        """When ``job_id`` finished, or ``None`` if it is live or unknown."""
        job_key = _job_key(job_id)
        value = self._read(lambda txn: txn.get(job_key, db=self._db(_DONE)))
        if value is None:
            return None
        try:
            return _decode_done(value)[0]
        except _BadRecord as exc:
            raise JournalError(f"{self._file}: done state of job {job_id!r}: {exc}") from None

    def facts(self, start: int = 1) -> Iterator[tuple[int, str, bytes]]:
        """``(seq, job id, payload)`` of every fact from ``start`` on, CRC checked."""
        for key, value in self._scan(_FACTS, _seq_key(max(start, 0))):
            if len(key) != _U64.size:
                raise JournalError(f"{self._file}: damaged: malformed fact key {key!r}")
            (seq,) = _U64.unpack(key)
            try:
                job_id, payload = _decode_fact(value)
            except _BadRecord as exc:
                raise JournalError(f"{self._file}: fact {seq}: {exc}") from None
            yield seq, job_id, payload

    def job_facts(self, job_id: str) -> Iterator[tuple[int, bytes]]:
        """``(seq, payload)`` of one job's facts in order, through the index."""
        prefix = _index_prefix(_job_key(job_id))
        after = prefix
        while True:
            chunk = self._read(functools.partial(self._job_chunk, prefix=prefix, after=after))
            for seq, value in chunk:
                if value is None:
                    raise JournalError(
                        f"{self._file}: damaged: the index lists fact {seq} for job "
                        f"{job_id!r}, but there is no such fact"
                    )
                try:
                    owner, payload = _decode_fact(value)
                except _BadRecord as exc:
                    raise JournalError(f"{self._file}: fact {seq}: {exc}") from None
                if owner != job_id:
                    raise JournalError(
                        f"{self._file}: damaged: the index lists fact {seq} for job "
                        f"{job_id!r}, but it belongs to {owner!r}"
                    )
                yield seq, payload
            if len(chunk) < _CHUNK:
                return
            after = prefix + _seq_key(chunk[-1][0]) + _SEP

    def _job_chunk(self, txn: _Txn, prefix: bytes, after: bytes) -> list[tuple[int, bytes | None]]:
        # The facts are fetched in the index's transaction: the pair is consistent.
        rows: list[tuple[int, bytes | None]] = []
        cursor = txn.cursor(self._db(_INDEX))
        if not cursor.set_range(after):
            return rows
        facts = self._db(_FACTS)
        for key in cursor.iternext(keys=True, values=False):
            if not key.startswith(prefix):
                break
            if len(key) != len(prefix) + _U64.size:
                continue  # not this job's: job ids hold no NUL, so only a foreign key could
            seq_key = key[len(prefix) :]
            rows.append((_U64.unpack(seq_key)[0], txn.get(seq_key, db=facts)))
            if len(rows) >= _CHUNK:
                break
        return rows

    @property
    def last_seq(self) -> int:
        """The sequence number of the last fact ever committed (0 if none)."""
        return self._read(lambda txn: self._get_meta(txn, _LAST_SEQ_KEY))

    def stats(self) -> dict[str, int]:
        """Entries per database, map and file size, ``last_seq``, epochs, facts compacted."""

        def collect(txn: _Txn) -> dict[str, int]:
            out = {name: txn.stat(self._db(name))["entries"] for name in _DB_NAMES}
            out["last_seq"] = self._get_meta(txn, _LAST_SEQ_KEY)
            out["epoch"] = self._get_meta(txn, _EPOCH_KEY)
            raw = txn.get(_REMOVED_KEY, db=self._db(_META))
            out["removed"] = _U64.unpack(raw)[0] if raw is not None and len(raw) == 8 else 0
            out["map_size"] = self._shared.env.info()["map_size"]
            return out

        out = self._read(collect)
        out["handle_epoch"] = self._epoch
        try:
            out["file_size"] = os.stat(self._file).st_size
        except OSError:
            out["file_size"] = 0
        return out

    # -- machinery

    @property
    def _shared(self) -> _SharedEnv:
        shared = self._shared_env
        if shared is None:
            raise JournalError(f"{self._file}: the journal handle is closed")
        return shared

    def _db(self, name: str) -> _Db:
        return self._shared.dbs[name]

    def _require_writable(self) -> None:
        if self._readonly:
            raise JournalError(f"{self._file}: the journal is open read-only")

    def _get_meta(self, txn: _Txn, key: bytes, db: _Db | None = None) -> int:
        raw = txn.get(key, db=self._db(_META) if db is None else db)
        if raw is None or len(raw) != _U64.size:
            raise JournalError(f"{self._file}: damaged: meta {key.decode()} is missing or invalid")
        value: int = _U64.unpack(raw)[0]
        return value

    def _fail(self, what: str, exc: lmdb.Error) -> JournalError:
        return JournalError(f"{self._file}: cannot {what} ({_lmdb_reason(exc)})")

    def _read(self, fn: Callable[[_Txn], _T]) -> _T:
        """Run ``fn`` in a read transaction; the values it returns are copies (bytes)."""
        shared = self._shared
        with shared.turn:
            for _ in range(_MAX_REMAPS):
                try:
                    with shared.env.begin(buffers=False) as txn:
                        return fn(txn)
                except lmdb.MapResizedError:
                    # Another process grew the map: adopt its size, then try again.
                    self._remap(shared, 0)
                except lmdb.Error as exc:
                    raise self._fail("read the journal", exc) from exc
        raise JournalError(f"{self._file}: the map keeps changing size under this reader")

    def _write(self, fn: Callable[[_Txn], _T]) -> _T:
        """Run ``fn`` in one write transaction and commit it, growing the map as needed.

        ``fn`` must be repeatable: on ``MapFullError`` the transaction is aborted, the map
        doubled and ``fn`` run again from the start on a new transaction.
        """
        shared = self._shared
        with shared.turn:
            for _ in range(_MAX_REMAPS):
                try:
                    txn = shared.env.begin(write=True)
                except lmdb.MapResizedError:
                    self._remap(shared, 0)
                    continue
                except lmdb.Error as exc:
                    raise self._fail("begin a write transaction", exc) from exc
                try:
                    result = fn(txn)
                    txn.commit()
                except lmdb.MapFullError:
                    _abort(txn)
                    old = shared.env.info()["map_size"]
                    self._remap(shared, old * 2)
                    log.info("%s: map full, grown from %d to %d bytes", self._file, old, old * 2)
                    continue
                except lmdb.Error as exc:
                    _abort(txn)
                    raise self._fail("write the journal", exc) from exc
                except BaseException:
                    _abort(txn)
                    raise
                if self._sync and not shared.sync:
                    # The environment was opened without sync by another handle; this
                    # one promised durability, so flush before returning.
                    shared.env.sync(True)
                return result
        raise JournalError(f"{self._file}: a transaction does not fit even after growing")

    def _remap(self, shared: _SharedEnv, size: int) -> None:
        """Set the map size (0: adopt the size another process set); caller holds the turn."""
        try:
            shared.env.set_mapsize(size)
        except lmdb.Error as exc:
            raise self._fail(f"set the map size to {size or 'the current size'}", exc) from exc

    def _scan(self, db_name: str, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Every ``(key, value)`` from ``start`` on, read in chunks of short transactions."""
        key = start
        while True:
            rows = self._read(functools.partial(self._scan_chunk, db_name=db_name, start=key))
            yield from rows
            if len(rows) < _CHUNK:
                return
            key = rows[-1][0] + _SEP  # the smallest key after the last one seen

    def _scan_chunk(self, txn: _Txn, db_name: str, start: bytes) -> list[tuple[bytes, bytes]]:
        cursor = txn.cursor(self._db(db_name))
        rows: list[tuple[bytes, bytes]] = []
        if not cursor.set_range(start):
            return rows
        for row in cursor:
            rows.append(row)
            if len(rows) >= _CHUNK:
                break
        return rows


def _abort(txn: _Txn) -> None:
    # After a failed commit LMDB has already ended the transaction; aborting again may
    # raise, and must not hide the original error.
    with contextlib.suppress(lmdb.Error):
        txn.abort()


# --------------------------------------------------------------------------- group commit


class Ticket:
    """One submitter's rendezvous with the writer thread.

    A bare lock, taken at creation and released by the writer once the outcome is set:
    far cheaper than a Future (no condition variable), which matters with many threads
    each waiting a fraction of a millisecond.
    """

    __slots__ = ("_lock", "error", "seqs")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.seqs: list[int] = []
        self.error: BaseException | None = None

    def finish(self, seqs: list[int] | None = None, error: BaseException | None = None) -> None:
        self.seqs = seqs or []
        self.error = error
        self._lock.release()

    def wait(self) -> list[int]:
        self._lock.acquire()
        if self.error is not None:
            # The same exception object for every caller of the batch, as
            # concurrent.futures does.
            raise self.error
        return self.seqs


class GroupCommitter:
    """Group commit: many threads call submit(); a single writer thread takes everything
    queued, writes it in ONE transaction (one fsync) and then wakes all those callers.
    No caller returns before its fsync returned.

    Batches form by themselves: while one transaction is being flushed, new submissions
    queue up and go together into the next one, so there is no added delay when the
    load is light and one flush per batch when it is heavy. ``max_batch`` bounds a batch.
    """

    def __init__(self, journal: Journal, max_batch: int = 1024) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._journal = journal
        self._max_batch = max_batch
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[tuple[Entry, Ticket]] = deque()
        self._closed = False
        self._transactions = 0
        self._entries = 0
        self._last_batch = 0
        self._thread = threading.Thread(
            target=self._run, name=f"journal-group-commit:{journal.path}", daemon=True
        )
        self._thread.start()

    @property
    def transactions(self) -> int:
        """Write transactions made so far (failed ones included)."""
        return self._transactions

    @property
    def entries(self) -> int:
        """Entries written so far (committed successfully)."""
        return self._entries

    def submit(self, entry: Entry) -> list[int]:
        """Commit ``entry`` with whatever else is queued; block until it is durable.

        Returns the sequence numbers of the entry's facts. If the batch's transaction
        fails (e.g. :class:`FencedError`), every caller of that batch gets the exception.
        """
        return self.enqueue(entry).wait()

    def enqueue(self, entry: Entry) -> Ticket:
        """Queue ``entry`` and return at once; ``.wait()`` on the result blocks until it
        is durable (returning its sequence numbers) or raises the batch's error.

        Lets a caller fix its place in the commit order while holding its own lock and
        wait for the fsync after releasing it, so that concurrent callers share fsyncs.
        """
        if not isinstance(entry, Entry):
            # Checked here so that a bad entry fails its own caller, not a whole batch.
            raise TypeError(f"submit() takes an Entry, not {type(entry).__name__}")
        waiter = Ticket()
        with self._cond:
            if self._closed:
                raise JournalError(f"{self._journal.path}: the group committer is closed")
            self._queue.append((entry, waiter))
            self._cond.notify()
        return waiter

    def close(self) -> None:
        """Write what is queued, then stop the writer thread. Idempotent.

        The journal itself stays open: it belongs to the caller.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self) -> None:
        try:
            while True:
                if self._last_batch > 1:
                    # Under concurrency the callers just woken are about to submit again:
                    # let them run before taking the next batch (releasing the GIL for a
                    # moment), so that more of them share its fsync. Alone, no yield.
                    time.sleep(0)
                with self._cond:
                    while not self._queue and not self._closed:
                        self._cond.wait()
                    if not self._queue:
                        return  # closed and drained
                    take = min(len(self._queue), self._max_batch)
                    batch = [self._queue.popleft() for _ in range(take)]
                self._write(batch)
        finally:
            # Only reached early if the thread itself dies: never leave a caller waiting.
            with self._cond:
                self._closed = True
                left = list(self._queue)
                self._queue.clear()
            for _, waiter in left:
                waiter.finish(
                    error=JournalError(f"{self._journal.path}: the group commit writer stopped")
                )

    def _write(self, batch: list[tuple[Entry, Ticket]]) -> None:
        self._transactions += 1
        try:
            seqs = self._journal.commit([entry for entry, _ in batch])
        except BaseException as exc:
            for _, waiter in batch:
                waiter.finish(error=exc)
            if not isinstance(exc, Exception):
                raise
            return
        self._entries += len(batch)
        self._last_batch = len(batch)
        start = 0
        for entry, waiter in batch:
            end = start + len(entry.facts)
            waiter.finish(seqs[start:end])
            start = end


# --------------------------------------------------------------------------- tools


@attrs.frozen
class VerifyReport:
    """What :func:`verify` found. ``ok`` is true when ``problems`` is empty."""

    ok: bool
    problems: tuple[str, ...]
    facts: int
    live: int
    done: int
    epoch: int
    last_seq: int


class _Problems:
    """Collects problems, keeping the first :data:`_MAX_PROBLEMS` and counting the rest."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.dropped = 0

    def add(self, text: str) -> None:
        if len(self.items) < _MAX_PROBLEMS:
            self.items.append(text)
        else:
            self.dropped += 1

    def result(self) -> tuple[str, ...]:
        extra = [f"... and {self.dropped} more problems"] if self.dropped else []
        return (*self.items, *extra)


def _structure_problems(path: Path) -> list[str]:
    """Walk the data file's pages without liblmdb (py-lmdb's offline verifier).

    LMDB has no page checksums and trusts its pages: a damaged branch page can crash
    the process reading it. Checking the structure first lets :func:`verify` report
    such damage instead. Returns an empty list when the module is not available.
    """
    try:
        from lmdb import verify as lmdb_verify
    except ImportError:  # older py-lmdb releases have no offline verifier
        return []
    walk: Callable[..., list[str]] = lmdb_verify.verify
    data_file = path / _DATA_FILE
    try:
        problems = walk(str(path), subdir=True)
    except lmdb_verify.VerifyError as exc:
        raise JournalError(f"{data_file}: not a usable LMDB environment ({exc})") from exc
    except OSError as exc:
        raise JournalError(f"{data_file}: cannot read the file ({exc})") from exc
    return [f"structure: {problem}" for problem in problems]


def verify(path: Path | str, *, structure: bool = True) -> VerifyReport:
    """Check the journal in ``path`` and report every problem found; change nothing.

    Checks the LMDB page structure (``structure=True``; only meaningful with the
    controller stopped, as a writer reuses pages under an outside reader), every
    record's CRC, the meta keys, that sequence numbers run without gaps up to
    ``last_seq`` (counting the facts :func:`compact` removed), that every index row
    points to an existing fact of its job and that every fact has its index row, and
    that no job is both live and done. When the page structure is damaged the record
    checks are skipped (reading would walk the damaged pages) and the counts are 0.
    Damage is reported, not raised; :class:`JournalError` only means the file cannot
    be opened at all (missing, not LMDB, truncated, newer schema).
    """
    path = Path(path).absolute()
    problems = _Problems()
    if structure:
        found = _structure_problems(path)
        if found:
            for problem in found:
                problems.add(problem)
            # Reading records would walk the damaged pages: stop at the structure.
            return VerifyReport(False, problems.result(), 0, 0, 0, 0, 0)
    with Journal.open(path, readonly=True) as journal:
        try:
            counts = journal._read(lambda txn: _verify_txn(journal, txn, problems))
        except JournalError as exc:
            problems.add(str(exc))
            counts = (0, 0, 0, 0, 0)
    facts, live, done, epoch, last_seq = counts
    result = problems.result()
    return VerifyReport(not result, result, facts, live, done, epoch, last_seq)


def _meta_int(txn: _Txn, db: _Db, key: bytes, problems: _Problems, *, required: bool) -> int:
    raw = txn.get(key, db=db)
    if raw is None:
        if required:
            problems.add(f"meta: {key.decode()} is missing")
        return 0
    if len(raw) != _U64.size:
        problems.add(f"meta: {key.decode()} is {len(raw)} bytes, not 8")
        return 0
    value: int = _U64.unpack(raw)[0]
    return value


def _verify_txn(journal: Journal, txn: _Txn, problems: _Problems) -> tuple[int, int, int, int, int]:
    """All record checks, in one read transaction so that they see one snapshot."""
    facts_db, index_db, jobs_db, done_db, meta_db, history_db = (journal._db(n) for n in _DB_NAMES)
    epoch = _meta_int(txn, meta_db, _EPOCH_KEY, problems, required=True)
    last_seq = _meta_int(txn, meta_db, _LAST_SEQ_KEY, problems, required=True)
    removed = _meta_int(txn, meta_db, _REMOVED_KEY, problems, required=False)
    _meta_int(txn, meta_db, _SCHEMA_KEY, problems, required=True)

    n_facts = 0
    expected = 1  # the next sequence number if there were no gap
    gaps: list[str] = []
    for key, value in txn.cursor(facts_db):
        if len(key) != _U64.size:
            problems.add(f"facts: malformed key {key!r}")
            continue
        (seq,) = _U64.unpack(key)
        n_facts += 1
        if seq > expected and len(gaps) <= _MAX_GAPS:  # compaction may leave very many
            gaps.append(f"{expected}..{seq - 1}" if seq - 1 > expected else str(expected))
        expected = seq + 1
        if seq > last_seq:
            problems.add(f"fact {seq}: after meta last_seq {last_seq}")
        try:
            job_id, _ = _decode_fact(value)
        except _BadRecord as exc:
            problems.add(f"fact {seq}: {exc}")
            continue
        if txn.get(_index_prefix(_job_key(job_id)) + key, db=index_db) is None:
            problems.add(f"fact {seq}: job {job_id!r} has no index row for it")
    if last_seq > expected - 1 and len(gaps) <= _MAX_GAPS:
        gaps.append(f"{expected}..{last_seq}" if last_seq > expected else str(expected))
    # Compaction removes finished jobs' facts wherever they are, so gaps are expected;
    # what must hold is that kept + removed accounts for every sequence number issued.
    if n_facts + removed != last_seq:
        shown = ", ".join(gaps[:_MAX_GAPS]) + (", ..." if len(gaps) > _MAX_GAPS else "")
        problems.add(
            f"facts: {n_facts} kept + {removed} compacted != last_seq {last_seq}"
            + (f"; missing: {shown}" if gaps else "")
        )

    for key, _value in txn.cursor(index_db):
        try:
            job_id, seq = _split_index_key(key)
        except _BadRecord as exc:
            problems.add(f"index: {exc}")
            continue
        fact = txn.get(_seq_key(seq), db=facts_db)
        if fact is None:
            problems.add(f"index: job {job_id!r} lists fact {seq}, which does not exist")
            continue
        try:
            owner, _ = _decode_fact(fact)
        except _BadRecord:
            continue  # already reported with the fact
        if owner != job_id:
            problems.add(f"index: job {job_id!r} lists fact {seq}, which belongs to {owner!r}")

    n_live = 0
    for key, value in txn.cursor(jobs_db):
        n_live += 1
        try:
            job_id = _decode_job_key(key)
            _unseal(value)
        except _BadRecord as exc:
            problems.add(f"jobs: live state of job {key!r}: {exc}")
            continue
        if txn.get(key, db=done_db) is not None:
            problems.add(f"jobs: job {job_id!r} is both live and done")

    n_done = 0
    for key, value in txn.cursor(done_db):
        n_done += 1
        try:
            _decode_job_key(key)
            _decode_done(value)
        except _BadRecord as exc:
            problems.add(f"done: state of job {key!r}: {exc}")
    _verify_history(txn, history_db, jobs_db, done_db, problems)
    return n_facts, n_live, n_done, epoch, last_seq


def _verify_history(
    txn: _Txn, history_db: _Db, jobs_db: _Db, done_db: _Db, problems: _Problems
) -> None:
    """Every history row: a well-formed key of a job that has a state, a good CRC, and
    each sequence numbered from 0 without a gap."""
    expected: dict[tuple[str, str], int] = {}
    for key, value in txn.cursor(history_db):
        try:
            job_id, name, index = _split_history_key(key)
        except _BadRecord as exc:
            problems.add(f"history: {exc}")
            continue
        where = (job_id, name)
        if where not in expected:
            job_key = _job_key(job_id)
            if txn.get(job_key, db=jobs_db) is None and txn.get(job_key, db=done_db) is None:
                problems.add(f"history: job {job_id!r} has {name} but no state")
            expected[where] = 0
        if index != expected[where]:
            problems.add(
                f"history: {name} of job {job_id!r}: row {index} where {expected[where]} was due"
            )
        expected[where] = index + 1
        try:
            _unseal(value)
        except _BadRecord as exc:
            problems.add(f"history: {name} {index} of job {job_id!r}: {exc}")


def _fact_json(payload: bytes) -> object:
    """The payload as JSON if it is utf-8 JSON (strict: no NaN), else its hex."""

    def reject(constant: str) -> object:
        raise ValueError(constant)

    try:
        value: object = json.loads(payload.decode("utf-8"), parse_constant=reject)
    except (UnicodeDecodeError, ValueError):
        return {"hex": payload.hex()}
    return value


def export(path: Path | str, out: TextIO) -> int:
    """Write every fact as a JSON line ``{"seq", "job", "fact"}``; return how many.

    ``fact`` is the payload parsed as JSON when it is utf-8 JSON, else ``{"hex": ...}``.
    Opens the journal read-only; a damaged record raises :class:`JournalError`.
    """
    count = 0
    with Journal.open(path, readonly=True) as journal:
        for seq, job_id, payload in journal.facts():
            _export_line(out, seq, job_id, payload)
            count += 1
    return count


def _export_line(out: TextIO, seq: int, job_id: str, payload: bytes) -> None:
    line = {"seq": seq, "job": job_id, "fact": _fact_json(payload)}
    out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")


def _archive_line(out: TextIO, seq_key: bytes, value: bytes) -> None:
    try:
        job_id, payload = _decode_fact(value)
    except _BadRecord as exc:
        raise JournalError(f"fact {_U64.unpack(seq_key)[0]}: {exc}; run verify") from None
    _export_line(out, _U64.unpack(seq_key)[0], job_id, payload)


def _sync(out: TextIO) -> None:
    """Make the archive durable before the facts it holds are deleted."""
    out.flush()
    with contextlib.suppress(AttributeError, OSError, ValueError):
        os.fsync(out.fileno())


def compact(path: Path | str, keep_days: float, now: float, archive: TextIO | None = None) -> int:
    """Drop the history of jobs that finished more than ``keep_days`` before ``now``.

    Their facts and index rows go in one write transaction; each removed fact is first
    written to ``archive`` as an :func:`export` line, so no history is lost unless the
    caller chose to pass none. The jobs' final states stay in ``done`` (they are small
    and carry the accounting: timeline and resize records). Live jobs and recently
    finished ones are untouched, sequence numbers are never reused and ``meta.removed``
    counts what went (so :func:`verify` still accounts for every sequence number).
    Returns the number of facts removed.

    An offline tool: run it with the controller stopped. It does not take an epoch, so
    it does not fence a running controller, and a running engine may still be reading
    the history it removes. The data file does not shrink; LMDB reuses freed pages.
    """
    if not keep_days >= 0:
        raise ValueError(f"keep_days must be zero or more, not {keep_days!r}")
    path = Path(path).absolute()
    if not (path / _DATA_FILE).is_file():
        raise JournalError(f"{path / _DATA_FILE}: no journal here (the file does not exist)")
    cutoff = now - keep_days * 86400.0
    with Journal.open(path) as journal:
        facts_db, index_db, _jobs_db, done_db, meta_db, _history = (
            journal._db(n) for n in _DB_NAMES
        )

        def apply(txn: _Txn) -> int:
            old: list[bytes] = []
            for key, value in txn.cursor(done_db):
                try:
                    ended_at, _ = _decode_done(value)
                except _BadRecord as exc:
                    raise JournalError(
                        f"{journal.path}: done state of job {key!r}: {exc}; run verify, "
                        "nothing was compacted"
                    ) from None
                if ended_at < cutoff:
                    old.append(key)
            removed = 0
            for job_key in old:
                prefix = _index_prefix(job_key)
                cursor = txn.cursor(index_db)
                rows: list[bytes] = []
                if cursor.set_range(prefix):
                    for key in cursor.iternext(keys=True, values=False):
                        if not key.startswith(prefix):
                            break
                        if len(key) == len(prefix) + _U64.size:
                            rows.append(key)
                for key in rows:
                    seq_key = key[len(prefix) :]
                    if archive is not None:
                        stored = txn.get(seq_key, db=facts_db)
                        if stored is not None:
                            _archive_line(archive, seq_key, stored)
                    if txn.delete(seq_key, db=facts_db):
                        removed += 1
                    txn.delete(key, db=index_db)
            total = _meta_int(txn, meta_db, _REMOVED_KEY, _Problems(), required=False)
            txn.put(_REMOVED_KEY, _U64.pack(total + removed), db=meta_db)
            if archive is not None:
                _sync(archive)  # before the transaction commits the deletion
            return removed

        return journal._write(apply)
