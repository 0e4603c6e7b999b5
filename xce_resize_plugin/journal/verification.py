"""``journal verify``: check a journal and report every problem found, changing nothing
(also the record checks a controller makes before it starts: :mod:`.start_check`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs
import lmdb

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal.journal import Journal
from xce_resize_plugin.journal.meta_pages import meta_pair_problems
from xce_resize_plugin.journal.page_walk import structure_problems
from xce_resize_plugin.journal.records import (
    DATA_FILE,
    DB_NAMES,
    EPOCH_KEY,
    LAST_SEQ_KEY,
    REMOVED_KEY,
    SCHEMA_KEY,
    U64,
    BadRecord,
    decode_done,
    decode_fact,
    decode_job_key,
    index_prefix,
    job_key,
    key_seq,
    seq_key,
    split_history_key,
    split_index_key,
    unseal,
)

if TYPE_CHECKING:
    _Txn = lmdb.Transaction[bytes]

#: Problems listed by :func:`verify` before it only counts the rest.
_MAX_PROBLEMS: Final = 200
#: Missing sequence ranges shown in :func:`verify`'s continuity problem.
_MAX_GAPS: Final = 10


@attrs.frozen
class VerifyReport:
    """What :func:`verify` found. ``ok`` is true when ``problems`` is empty. ``counted``
    is false when the records were not read (damaged meta or page structure): the counts
    are then 0 because they are unknown, not because the journal is empty."""

    ok: bool
    problems: tuple[str, ...]
    facts: int
    live: int
    done: int
    epoch: int
    last_seq: int
    counted: bool = True


def _uncounted(problems: list[str]) -> VerifyReport:
    """The report of a journal whose records were not read because of ``problems``."""
    collected = _Problems()
    for problem in problems:
        collected.add(problem)
    return VerifyReport(False, collected.result(), 0, 0, 0, 0, 0, counted=False)


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


def verify(path: Path | str, *, structure: bool = True, references: bool = True) -> VerifyReport:
    """Check the journal in ``path`` and report every problem found; change nothing.

    Checks the pair of LMDB meta pages (:mod:`.meta_pages`: a damaged transaction id
    would make LMDB open the previous transaction), the LMDB page structure
    (``structure=True``; only meaningful with the controller stopped, as a writer
    reuses pages under an outside reader), every record's CRC, the meta keys, that
    sequence numbers run without gaps up to ``last_seq`` (counting the facts
    compaction removed), that every index row points to an existing fact of its job
    and that every fact has its index row (``references=True``: one lookup per fact
    and per index row, most of the cost), and that no job is both live and done. When
    the meta pages or the page structure are damaged the record checks are skipped
    (reading would see an older transaction or walk the damaged pages) and the report
    is not ``counted``. Damage is reported, not raised; :class:`JournalError` only means
    the file
    cannot be opened at all (missing, not LMDB, truncated, newer schema).
    """
    path = Path(path).absolute()
    if not (path / DATA_FILE).is_file():
        # As Journal.open says it; and the page walk would block forever reading a
        # FIFO named data.mdb.
        raise JournalError(f"{path / DATA_FILE}: no journal here (missing, or not a regular file)")
    metas = meta_pair_problems(path / DATA_FILE)
    if metas:
        return _uncounted(metas)  # LMDB would show an older transaction's records
    problems = _Problems()
    if structure:
        found = structure_problems(path)
        if found:
            # Reading records would walk the damaged pages: stop at the structure.
            return _uncounted(found)
    with Journal.open(path, readonly=True) as journal:
        try:
            counts = journal._read(lambda txn: _Check(journal, txn, problems, references).run())
        except JournalError as exc:
            # The problem without "Journal error: <data file>: ": a caller (the check at
            # start) puts its own prefix before it.
            problems.add((exc.detail or str(exc)).removeprefix(f"{path / DATA_FILE}: "))
            counts = (0, 0, 0, 0, 0)
    facts, live, done, epoch, last_seq = counts
    result = problems.result()
    return VerifyReport(not result, result, facts, live, done, epoch, last_seq)


class _Check:
    """All record checks, in one read transaction so that they see one snapshot."""

    def __init__(
        self, journal: Journal, txn: _Txn, problems: _Problems, references: bool = True
    ) -> None:
        self.txn = txn
        self.add = problems.add
        self.references = references
        self.facts_db, self.index_db, self.jobs_db, self.done_db, self.meta_db, self.history_db = (
            journal._db(name) for name in DB_NAMES
        )

    def run(self) -> tuple[int, int, int, int, int]:
        """``(facts, live, done, epoch, last_seq)``, problems added as found."""
        epoch = self._meta_int(EPOCH_KEY, required=True)
        last_seq = self._meta_int(LAST_SEQ_KEY, required=True)
        removed = self._meta_int(REMOVED_KEY, required=False)
        self._meta_int(SCHEMA_KEY, required=True)
        n_facts = self._facts(last_seq, removed)
        if self.references:
            self._index()
        n_live = self._live()
        n_done = self._done()
        self._history()
        return n_facts, n_live, n_done, epoch, last_seq

    def _meta_int(self, key: bytes, *, required: bool) -> int:
        raw = self.txn.get(key, db=self.meta_db)
        if raw is None:
            if required:
                self.add(f"meta: {key.decode()} is missing")
            return 0
        if len(raw) != U64.size:
            self.add(f"meta: {key.decode()} is {len(raw)} bytes, not 8")
            return 0
        value: int = U64.unpack(raw)[0]
        return value

    def _facts(self, last_seq: int, removed: int) -> int:
        """Every fact: key, CRC, index row (with :attr:`references`); and kept + removed
        accounting for last_seq."""
        n_facts = 0
        expected = 1  # the next sequence number if there were no gap
        gaps: list[str] = []
        for key, value in self.txn.cursor(self.facts_db):
            if len(key) != U64.size:
                self.add(f"facts: malformed key {key!r}")
                continue
            seq = key_seq(key)
            n_facts += 1
            if seq > expected and len(gaps) <= _MAX_GAPS:  # compaction may leave very many
                gaps.append(f"{expected}..{seq - 1}" if seq - 1 > expected else str(expected))
            expected = seq + 1
            if seq > last_seq:
                self.add(f"fact {seq}: after meta last_seq {last_seq}")
            try:
                if self.references:
                    self._index_row(seq, key, decode_fact(value)[0])
                else:
                    unseal(value)  # the CRC alone: decoding the job id costs as much again
            except BadRecord as exc:
                self.add(f"fact {seq}: {exc}")
        if last_seq > expected - 1 and len(gaps) <= _MAX_GAPS:
            gaps.append(f"{expected}..{last_seq}" if last_seq > expected else str(expected))
        # Compaction removes finished jobs' facts wherever they are, so gaps are expected;
        # what must hold is that kept + removed accounts for every sequence number issued.
        if n_facts + removed != last_seq:
            shown = ", ".join(gaps[:_MAX_GAPS]) + (", ..." if len(gaps) > _MAX_GAPS else "")
            self.add(
                f"facts: {n_facts} kept + {removed} compacted != last_seq {last_seq}"
                + (f"; missing: {shown}" if gaps else "")
            )
        return n_facts

    def _index_row(self, seq: int, key: bytes, job_id: str) -> None:
        if self.txn.get(index_prefix(job_key(job_id)) + key, db=self.index_db) is None:
            self.add(f"fact {seq}: job {job_id!r} has no index row for it")

    def _index(self) -> None:
        """Every index row names an existing fact of its own job."""
        for key, _value in self.txn.cursor(self.index_db):
            try:
                job_id, seq = split_index_key(key)
            except BadRecord as exc:
                self.add(f"index: {exc}")
                continue
            fact = self.txn.get(seq_key(seq), db=self.facts_db)
            if fact is None:
                self.add(f"index: job {job_id!r} lists fact {seq}, which does not exist")
                continue
            try:
                owner, _ = decode_fact(fact)
            except BadRecord:
                continue  # already reported with the fact
            if owner != job_id:
                self.add(f"index: job {job_id!r} lists fact {seq}, which belongs to {owner!r}")

    def _live(self) -> int:
        n_live = 0
        for key, value in self.txn.cursor(self.jobs_db):
            n_live += 1
            try:
                job_id = decode_job_key(key)
                unseal(value)
            except BadRecord as exc:
                self.add(f"jobs: live state of job {key.decode(errors='replace')!r}: {exc}")
                continue
            if self.txn.get(key, db=self.done_db) is not None:
                self.add(f"jobs: job {job_id!r} is both live and done")
        return n_live

    def _done(self) -> int:
        n_done = 0
        for key, value in self.txn.cursor(self.done_db):
            n_done += 1
            try:
                decode_job_key(key)
                decode_done(value)
            except BadRecord as exc:
                self.add(f"done: state of job {key.decode(errors='replace')!r}: {exc}")
        return n_done

    def _history(self) -> None:
        """Every history row: a well-formed key of a job that has a state, a good CRC,
        and each sequence numbered from 0 without a gap."""
        txn = self.txn
        expected: dict[tuple[str, str], int] = {}
        for key, value in txn.cursor(self.history_db):
            try:
                job_id, name, index = split_history_key(key)
            except BadRecord as exc:
                self.add(f"history: {exc}")
                continue
            where = (job_id, name)
            if where not in expected:
                job = job_key(job_id)
                if txn.get(job, db=self.jobs_db) is None and txn.get(job, db=self.done_db) is None:
                    self.add(f"history: job {job_id!r} has {name} but no state")
                expected[where] = 0
            if index != expected[where]:
                self.add(
                    f"history: {name} of job {job_id!r}: row {index} where {expected[where]} "
                    "was due"
                )
            expected[where] = index + 1
            try:
                unseal(value)
            except BadRecord as exc:
                self.add(f"history: {name} {index} of job {job_id!r}: {exc}")
