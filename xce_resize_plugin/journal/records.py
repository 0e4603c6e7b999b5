"""The journal's layout: its databases, keys and CRC-sealed records (docs/journal-format.md).

One LMDB environment per state directory (``<dir>/data.mdb`` and ``<dir>/lock.mdb``)
with six named databases.

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
``history``
    job id utf-8 + ``b"\\0"`` + sequence tag (``r``: resize records, ``c``: charge
    steps) + 8-byte big-endian index -> CRC-32 + row.
``meta``
    ``schema``, ``epoch``, ``last_seq`` and ``removed`` (facts dropped by compaction,
    absent means 0), each an 8-byte big-endian unsigned integer.

The decoders raise :class:`BadRecord`; the caller adds which record and which file.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import lmdb

#: The storage schema this version writes (schema 1 kept a job's resize records and
#: charge steps inside its state; schema 3 added the facts of several tasks at once,
#: ``TasksStarted`` and ``TasksStopped``; schema 4 writes a long allocation of
#: consecutive task ids as its first id and its hosts; schema 5 writes runs of
#: consecutively numbered hosts in those; see docs/journal-format.md).
SCHEMA: Final = 5
#: Older schemas this version reads, and upgrades in place when it opens the journal
#: for writing (what they hold is a subset of what this one may hold).
UPGRADABLE: Final = (2, 3, 4)

DATA_FILE: Final = "data.mdb"
FACTS, INDEX, JOBS, DONE, META = "facts", "index", "jobs", "done", "meta"
HISTORY: Final = "history"
DB_NAMES: Final = (FACTS, INDEX, JOBS, DONE, META, HISTORY)
#: The sequences of a job's history and their key tags: resize records, charge steps.
TAILS: Final = {"records": b"r", "charges": b"c"}
TAIL_NAMES: Final = {tag: name for name, tag in TAILS.items()}
SCHEMA_KEY, EPOCH_KEY, LAST_SEQ_KEY, REMOVED_KEY = b"schema", b"epoch", b"last_seq", b"removed"

U64: Final = struct.Struct(">Q")
_CRC: Final = struct.Struct(">I")
_LEN: Final = struct.Struct(">H")
_F64: Final = struct.Struct(">d")
SEP: Final = b"\0"


class BadRecord(Exception):
    """A stored value failed its checks; the caller adds which record and which file."""


def seal(body: bytes, key: bytes = b"") -> bytes:
    """Prefix ``body`` with its CRC-32, so bit rot and torn writes outside LMDB show.

    With ``key`` (the record's LMDB key, not stored in the value) the CRC covers the key
    too, so that a record copied under another key shows as well.
    """
    # The journal's own records have no key: one CRC call, not two (recovery reads
    # tens of thousands of them).
    return _CRC.pack(zlib.crc32(body, zlib.crc32(key)) if key else zlib.crc32(body)) + body


def unseal(value: bytes, key: bytes = b"") -> bytes:
    """Return the body of a value sealed with ``key``, or raise :class:`BadRecord`."""
    if len(value) < _CRC.size:
        raise BadRecord(f"record too short ({len(value)} bytes)")
    (stored,) = _CRC.unpack_from(value)
    body = value[_CRC.size :]
    computed = zlib.crc32(body, zlib.crc32(key)) if key else zlib.crc32(body)
    if stored != computed:
        raise BadRecord(f"CRC mismatch (stored {stored:08x}, computed {computed:08x})")
    return body


def encode_fact(job: bytes, payload: bytes) -> bytes:
    """A ``facts`` value: the job id (of key ``job``) and the payload, sealed."""
    return seal(_LEN.pack(len(job)) + job + payload)


def decode_fact(value: bytes) -> tuple[str, bytes]:
    """A ``facts`` value -> (job id, payload)."""
    body = unseal(value)
    if len(body) < _LEN.size:
        raise BadRecord("record too short for its job id")
    (size,) = _LEN.unpack_from(body)
    end = _LEN.size + size
    if len(body) < end:
        raise BadRecord("job id runs past the end of the record")
    try:
        job_id = body[_LEN.size : end].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"job id is not utf-8 ({exc})") from None
    return job_id, body[end:]


def encode_done(ended_at: float, state: bytes) -> bytes:
    """A ``done`` value: when the job ended and its final state, sealed."""
    return seal(_F64.pack(ended_at) + state)


def decode_done(value: bytes) -> tuple[float, bytes]:
    """A ``done`` value -> (ended_at, state)."""
    body = unseal(value)
    if len(body) < _F64.size:
        raise BadRecord("record too short for its end time")
    (ended_at,) = _F64.unpack_from(body)
    return ended_at, body[_F64.size :]


def seq_key(seq: int) -> bytes:
    """The ``facts`` key of sequence number ``seq`` (also a row index's suffix)."""
    return U64.pack(seq)


def key_seq(key: bytes) -> int:
    """The number at the end of a ``facts``, ``index`` or ``history`` key."""
    value: int = U64.unpack(key[-U64.size :])[0]
    return value


def index_prefix(job: bytes) -> bytes:
    """Every ``index`` key of the job with key ``job`` starts with this."""
    return job + SEP


def split_index_key(key: bytes) -> tuple[str, int]:
    """``job\\0seq`` -> (job id, seq); raises :class:`BadRecord` when malformed."""
    if len(key) < 1 + len(SEP) + U64.size or key[-U64.size - 1 : -U64.size] != SEP:
        raise BadRecord(f"malformed index key {key!r}")
    try:
        job_id = key[: -U64.size - 1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"index key {key!r} has a job id that is not utf-8 ({exc})") from None
    return job_id, key_seq(key)


def history_prefix(job: bytes, tag: bytes) -> bytes:
    """Every ``history`` key of one sequence (``tag``) of one job starts with this."""
    return job + SEP + tag


def split_history_key(key: bytes) -> tuple[str, str, int]:
    """``job\\0tag index`` -> (job id, sequence name, index), or :class:`BadRecord`."""
    size = 1 + len(SEP) + 1 + U64.size
    if len(key) < size or key[-U64.size - 2 : -U64.size - 1] != SEP:
        raise BadRecord(f"malformed history key {key!r}")
    name = TAIL_NAMES.get(key[-U64.size - 1 : -U64.size])
    if name is None:
        raise BadRecord(f"history key {key!r} names no known sequence")
    job_id = decode_job_key(key[: -U64.size - 2])
    return job_id, name, key_seq(key)


def job_key(job_id: str) -> bytes:
    """The key of ``job_id`` in ``jobs`` and ``done``, and the start of its other keys."""
    return job_id.encode("utf-8")


def decode_job_key(key: bytes) -> str:
    """A ``jobs`` or ``done`` key -> job id."""
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRecord(f"job id {key!r} is not utf-8 ({exc})") from None


def history_rows(cursor: lmdb.Cursor[bytes], job: bytes) -> dict[str, list[tuple[bytes, bytes]]]:
    """``{sequence name: [(key, value), ...]}`` of one job's ``history`` rows, every
    known sequence present (empty if it has no rows), each in index order.

    One cursor walk over ``job\\0``: the sequences of one job are adjacent, and recovery
    reads every live job's, so a seek per sequence would double its cursor work.
    """
    out: dict[str, list[tuple[bytes, bytes]]] = {name: [] for name in TAILS}
    prefix = job + SEP
    size = len(prefix) + 1 + U64.size
    if not cursor.set_range(prefix):
        return out
    for key, value in cursor:
        if not key.startswith(prefix):
            break
        name = TAIL_NAMES.get(key[len(prefix) : len(prefix) + 1])
        if name is not None and len(key) == size:
            out[name].append((key, value))
    return out


def numbered_rows(
    cursor: lmdb.Cursor[bytes], prefix: bytes, start: bytes | None = None
) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every key that is ``prefix`` + an 8-byte number, from ``start``
    (default: the first such key) on, in order.

    Keys of another length under the prefix belong to another job (``a`` and ``a\\0x``
    cannot both be job ids, since job ids hold no NUL) and are skipped.
    """
    if not cursor.set_range(prefix if start is None else start):
        return
    for key, value in cursor:
        if not key.startswith(prefix):
            return
        if len(key) == len(prefix) + U64.size:
            yield key, value
