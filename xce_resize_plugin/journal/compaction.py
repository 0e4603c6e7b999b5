"""``journal compact``: drop the facts of jobs that finished long ago, archiving them."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import lmdb

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.exporting import export_line
from xce_resize_plugin.journal.journal import Journal
from xce_resize_plugin.journal.page_walk import require_readable
from xce_resize_plugin.journal.records import (
    DATA_FILE,
    DONE,
    FACTS,
    INDEX,
    META,
    REMOVED_KEY,
    U64,
    BadRecord,
    decode_done,
    decode_fact,
    index_prefix,
    key_seq,
    numbered_rows,
)

if TYPE_CHECKING:
    _Txn = lmdb.Transaction[bytes]


def compact(
    path: Path | str,
    keep_days: float,
    now: float,
    archive: TextIO | None = None,
    *,
    checked: bool = False,
) -> int:
    """Drop the history of jobs that finished more than ``keep_days`` before ``now``.

    Their facts and index rows go in one write transaction; each removed fact is first
    written to ``archive`` as an :func:`~xce_resize_plugin.journal.exporting.export` line,
    so no history is lost unless the caller chose to pass none. The jobs' final states
    stay in ``done`` (they are small and carry the accounting: timeline and resize
    records). Live jobs and recently finished ones are untouched, sequence numbers are
    never reused and ``meta.removed`` counts what went (so ``verify`` still accounts for
    every sequence number). Returns the number of facts removed.

    An offline tool: run it with the controller stopped. It does not take an epoch, so
    it does not fence a running controller, and a running engine may still be reading
    the history it removes. The data file does not shrink; LMDB reuses freed pages.
    The meta pages and the page structure are checked first, unless the caller has
    (``checked``): damage raises :class:`JournalError`, nothing compacted.
    """
    if not keep_days >= 0:
        raise ValueError(f"keep_days must be zero or more, not {keep_days!r}")
    path = Path(path).absolute()
    if not (path / DATA_FILE).is_file():
        raise JournalError(f"{path / DATA_FILE}: no journal here (the file does not exist)")
    if not checked:
        # Before LMDB reads a page: a damaged one would kill this process.
        require_readable(path, "nothing was compacted")
    Journal.require(path)  # before a writable open touches its files
    cutoff = now - keep_days * 86400.0
    # The transaction runs again from the start when the map grows; the archive is
    # outside it, so a fact archived by an attempt that was rolled back is not written
    # to it twice.
    archived: set[bytes] = set()
    with Journal.open(path) as journal:

        def apply(txn: _Txn) -> int:
            raw = txn.get(REMOVED_KEY, db=journal._db(META))
            if raw is not None and len(raw) != U64.size:
                # As for a damaged done state: the count of earlier compactions would
                # be overwritten, and the damage with it. Before any fact is archived.
                raise JournalError(
                    f"{journal.path}: damaged: meta removed is {len(raw)} bytes, not "
                    f"{U64.size}; run verify, nothing was compacted"
                )
            removed = 0
            jobs = _finished_before(journal, txn, cutoff)
            # Every fact checked before the first is archived: a damaged one stops the
            # compaction with nothing removed and nothing in the archive.
            for job in jobs:
                _drop_facts(journal, txn, job, None, archived, check_only=True)
            for job in jobs:
                removed += _drop_facts(journal, txn, job, archive, archived)
            total = journal._removed(txn)
            txn.put(REMOVED_KEY, U64.pack(total + removed), db=journal._db(META))
            if archive is not None:
                _sync(archive)  # before the transaction commits the deletion
            return removed

        return journal._write(apply)


def _finished_before(journal: Journal, txn: _Txn, cutoff: float) -> list[bytes]:
    """The keys of the jobs that ended before ``cutoff``, but those held for a next
    run (requeued: their history goes on when they start again)."""
    old: list[bytes] = []
    for key, value in txn.cursor(journal._db(DONE)):
        try:
            ended_at, state = decode_done(value)
            held = ended_at < cutoff and _held(state)
        except BadRecord as exc:
            raise JournalError(
                f"{journal.path}: done state of job {key.decode(errors='replace')!r}: {exc}; "
                "run verify, "
                "nothing was compacted"
            ) from None
        if ended_at < cutoff and not held:
            old.append(key)
    return old


def _held(state: bytes) -> bool:
    """Whether a final state is a requeued run's (``"requeued": true``, written only
    then): the job waits to start again, and its next run continues this history."""
    if b'"requeued"' not in state:
        return False  # the common case, without parsing the state
    try:
        decoded = json.loads(state)
    except ValueError as exc:
        raise BadRecord(f"final state is not JSON ({exc})") from None
    return isinstance(decoded, dict) and decoded.get("requeued") is True


def _drop_facts(
    journal: Journal,
    txn: _Txn,
    job: bytes,
    archive: TextIO | None,
    archived: set[bytes],
    *,
    check_only: bool = False,
) -> int:
    """Delete one job's facts and index rows (archiving the facts not in ``archived``
    yet); how many facts went. ``check_only``: check them, change nothing."""
    facts_db, index_db = journal._db(FACTS), journal._db(INDEX)
    prefix = index_prefix(job)
    rows = [key for key, _ in numbered_rows(txn.cursor(index_db), prefix)]
    removed = 0
    for key in rows:
        seq = key[len(prefix) :]
        stored = txn.get(seq, db=facts_db)
        if stored is None:
            # verify reports it; deleting the row would hide the damage (docs/journal-
            # format.md, "Compaction": a damaged index row stops the compaction).
            raise JournalError(
                f"{journal.path}: damaged: the index lists fact {key_seq(seq)} for job "
                f"{job.decode(errors='replace')!r}, but there is no such fact; run verify, "
                "nothing was compacted"
            )
        # Checked with or without an archive: a damaged index row naming another
        # job's fact would otherwise delete that fact (maybe a live job's).
        job_id, payload = _owned_fact(journal, job, seq, stored)
        if check_only:
            continue
        if archive is not None and seq not in archived:
            export_line(archive, key_seq(seq), job_id, payload)
            archived.add(seq)
        if txn.delete(seq, db=facts_db):
            removed += 1
        txn.delete(key, db=index_db)
    return removed


def _owned_fact(journal: Journal, job: bytes, seq: bytes, value: bytes) -> tuple[str, bytes]:
    """The fact ``value`` at ``seq`` as (job id, payload), if it is ``job``'s."""
    where = f"{journal.path}: fact {key_seq(seq)}"
    try:
        job_id, payload = decode_fact(value)
    except BadRecord as exc:
        raise JournalError(f"{where}: {exc}; run verify, nothing was compacted") from None
    if job_id.encode("utf-8") != job:
        raise JournalError(
            f"{where}: damaged: the index lists it for job {job.decode(errors='replace')!r}, "
            f"but it belongs to {job_id!r}; run verify, nothing was compacted"
        )
    return job_id, payload


def _sync(out: TextIO) -> None:
    """Make the archive durable before the facts it holds are deleted: its data, and
    its name in its directory (the file may be new). A stream with no file behind it
    (a pipe, a terminal: fsync gives EINVAL) has nothing to make durable; any other
    failure (EIO, ENOSPC) raises :class:`JournalError`, so nothing is compacted."""
    try:
        out.flush()
        fd = out.fileno()
    except (AttributeError, ValueError, OSError) as exc:
        if isinstance(exc, OSError) and not isinstance(exc, io.UnsupportedOperation):
            raise JournalError(f"the archive could not be written: {exc}") from exc
        return  # an in-memory stream
    try:
        os.fsync(fd)
        name = getattr(out, "name", None)
        if isinstance(name, str) and os.path.isfile(name):
            try:
                directory = os.open(os.path.dirname(os.path.abspath(name)), os.O_RDONLY)
            except PermissionError:
                return  # a directory one may write but not read: it cannot be synced
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise JournalError(f"the archive could not be made durable: {exc}") from exc
