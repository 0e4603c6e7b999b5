"""The journal under faults and garbled input: real LMDB files, real processes, no mocks.

Each test here reproduces a defect that was found and fixed: what it shows failed
before the fix.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest

from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal import (
    Entry,
    GroupCommitter,
    Journal,
    Tail,
    compact,
    export,
    verify,
)

DAY = 86400.0
U64_MAX = 2**64 - 1


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


def _put_raw(jdir: Path, db: bytes, key: bytes, value: bytes) -> None:
    """Write one value straight into the journal's files, as damage would."""
    env = lmdb.open(str(jdir), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, value, db=env.open_db(db, txn=txn))
    finally:
        env.close()


def _strict_json(line: str) -> object:
    def reject(constant: str) -> object:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(line, parse_constant=reject)


def _kill_a_reader_in_a_transaction(jdir: Path) -> None:
    """Run, then ``kill -9``, a process inside a read transaction of the journal (a
    ``journal verify`` stopped by a timeout): its reader slot stays in the lock table."""
    script = (
        "import sys, time, lmdb\n"
        "env = lmdb.open(sys.argv[1], max_dbs=8, readonly=True)\n"
        "txn = env.begin()\n"
        "print('reading', flush=True)\n"
        "time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(jdir)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reading"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


# --------------------------------------------------------------------------- export


@pytest.mark.parametrize(
    "payload",
    [
        b'{"at":1e999}',  # parses to inf: written back it was the non-JSON Infinity
        b'{"user":"\\ud800"}',  # a lone surrogate: no utf-8 file can hold it
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the parser: RecursionError
    ],
    ids=["float-overflow", "lone-surrogate", "deep-nesting"],
)
def test_export_writes_strict_utf8_json_whatever_the_payload(
    jdir: Path, tmp_path: Path, payload: bytes
) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("a", (payload, b'{"ok":1}'), b"s")])
    out = tmp_path / "export.jsonl"
    with out.open("w", encoding="utf-8") as fh:
        assert export(jdir, fh) == 2
    first, second = (_strict_json(line) for line in out.read_text("utf-8").splitlines())
    assert first == {"seq": 1, "job": "a", "fact": {"hex": payload.hex()}}
    assert second == {"seq": 2, "job": "a", "fact": {"ok": 1}}


# --------------------------------------------------------------------------- compact


def test_compact_archives_each_fact_once_when_the_map_grows(
    jdir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # More than the 64 MiB map compact opens with: LMDB maps just what is in use, so
    # the compaction's transaction fills the map and runs again after it grows.
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("big", (b"x" * (70 << 20),), b"s")])
        for i in range(20):
            facts = tuple(b'{"n":%d,"pad":"%s"}' % (k, b"p" * 200) for k in range(500))
            j.commit([Entry(f"old{i}", facts, b"s", ended_at=0.0)])
    archive = tmp_path / "archive.jsonl"
    logger = "xce_resize_plugin.journal.lmdb_env"
    with caplog.at_level(logging.INFO, logger), archive.open("a", encoding="utf-8") as fh:
        removed = compact(jdir, 1, 10 * DAY, fh)
    assert "map full" in caplog.text  # the transaction did run twice
    seqs = [_strict_json(line)["seq"] for line in archive.read_text("utf-8").splitlines()]  # type: ignore[index]
    assert removed == 10_000
    assert sorted(seqs) == list(range(2, 10_002))  # each once


def _old_jobs(jdir: Path, jobs: int = 3) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        for i in range(jobs):
            j.commit([Entry(f"old{i}", (b'{"n":1}', b'{"n":2}'), b"s", ended_at=0.0)])


def test_an_archive_that_cannot_be_made_durable_compacts_nothing(
    jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fsync of the archive failing with EIO was ignored and the facts deleted, while
    their only copy might not be on disk. (No real disk fails on demand: fsync is made
    to fail as a failing disk's does.)"""

    from xce_resize_plugin.journal import compaction

    _old_jobs(jdir)

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(compaction.os, "fsync", failing)
    with (tmp_path / "a.jsonl").open("a") as fh, pytest.raises(JournalError, match="durable"):
        compact(jdir, 1, 10 * DAY, fh)
    monkeypatch.undo()
    with Journal.open(jdir) as j:
        assert sum(1 for _ in j.facts()) == 6  # nothing was removed


def test_an_archive_on_a_pipe_compacts(jdir: Path) -> None:
    """A pipe has nothing to make durable (fsync: EINVAL): the archive's reader has it."""
    _old_jobs(jdir)
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader:
        with os.fdopen(write_end, "w", encoding="utf-8") as fh:
            assert compact(jdir, 1, 10 * DAY, fh) == 6
        assert len(reader.read().splitlines()) == 6


@pytest.mark.parametrize("archive", [True, False])
def test_compact_refuses_an_index_row_naming_another_jobs_fact(
    jdir: Path, tmp_path: Path, archive: bool
) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("old", (b'{"o":1}',), b"s", ended_at=0.0)])
        j.commit([Entry("live", (b'{"l":1}', b'{"l":2}'), b"s")])
    # A damaged index row: the finished job "lists" fact 3, the live job's.
    _put_raw(jdir, b"index", b"old\0" + (3).to_bytes(8, "big"), b"")
    out = (tmp_path / "archive.jsonl").open("a", encoding="utf-8") if archive else None
    try:
        with pytest.raises(JournalError, match=r"fact 3: damaged: .* belongs to 'live'") as err:
            compact(jdir, 1, 10 * DAY, out)
    finally:
        if out is not None:
            out.close()
    assert str(jdir / "data.mdb") in str(err.value)
    with Journal.open(jdir, readonly=True) as j:
        assert [seq for seq, _ in j.job_facts("live")] == [2, 3]  # nothing deleted
        assert j.stats()["removed"] == 0


def test_compact_refuses_a_damaged_removed_count(jdir: Path) -> None:
    """meta.removed, the count of earlier compactions, of the wrong length (verify
    flags it): compaction wrote 0 + its own count over it, and the damage went."""
    _old_jobs(jdir)
    _put_raw(jdir, b"meta", b"removed", b"\x00\x01\x02")
    archive = jdir.parent / "archive.jsonl"
    with (
        archive.open("a", encoding="utf-8") as fh,
        pytest.raises(JournalError, match=r"damaged: meta removed is 3 bytes, not 8; run verify"),
    ):
        compact(jdir, 1, 10 * DAY, fh)
    assert archive.read_text() == ""  # nothing archived either: a rerun adds no duplicates
    env = lmdb.open(str(jdir), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            assert txn.get(b"removed", db=env.open_db(b"meta", txn=txn)) == b"\x00\x01\x02"
    finally:
        env.close()
    with Journal.open(jdir, readonly=True) as j:
        assert len(list(j.facts())) == 6  # nothing deleted


# --------------------------------------------------------------------------- entries


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tail("records", 0.5, (b"r",), 1),  # type: ignore[arg-type]
        lambda: Tail("records", True, (b"r",), True),
        lambda: Tail("charges", 2**64, (b"c",), 2**64 + 1),
        lambda: Tail("charges", U64_MAX, (b"c", b"d"), U64_MAX),
        lambda: Entry("a", (b"x",), b"s", ended_at=float("inf")),
        lambda: Entry("a", (b"x",), b"s", ended_at=10**400),
    ],
    ids=["float-start", "bool-bounds", "start-past-u64", "rows-past-u64", "inf-end", "huge-end"],
)
def test_an_entry_that_cannot_be_written_fails_when_built(make: Callable[[], object]) -> None:
    """Not in the commit: there it failed its whole group-commit batch and, fail-stop,
    every entry queued after it."""
    with pytest.raises((TypeError, ValueError)):
        make()


def test_a_bad_tail_no_longer_reaches_the_group_committer(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j, GroupCommitter(j) as committer:
        j.start()
        with pytest.raises(TypeError):
            committer.submit(Entry("a", (b"x",), b"s", history=(Tail("records", 0.5, (), 1),)))  # type: ignore[arg-type]
        assert committer.submit(Entry("b", (b"y",), b"s")) == [1]


def test_the_largest_tail_index_is_accepted() -> None:
    assert Tail("records", U64_MAX, (b"r",), U64_MAX).start == U64_MAX


# --------------------------------------------------------------------------- counters


@pytest.mark.parametrize("key", [b"epoch", b"last_seq"])
def test_a_counter_at_its_limit_is_refused_by_name(jdir: Path, key: bytes) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
    _put_raw(jdir, b"meta", key, U64_MAX.to_bytes(8, "big"))
    with Journal.open(jdir, sync=False) as j, pytest.raises(JournalError) as err:
        j.start()
        j.commit([Entry("a", (b"y",), b"s")])
    message = str(err.value)
    assert str(jdir / "data.mdb") in message
    assert f"{key.decode()} cannot go to {U64_MAX + 1}" in message
    with Journal.open(jdir, readonly=True) as j:
        assert sum(1 for _ in j.facts()) == 1  # nothing written


# --------------------------------------------------------------------------- readers


def test_a_reader_killed_in_its_transaction_does_not_make_the_map_grow(jdir: Path) -> None:
    """LMDB keeps every page a dead reader's snapshot could see: the map doubled again
    and again (to 32 MiB for these 3 MiB of rewrites) instead of reusing them."""
    with Journal.open(jdir, map_size=1 << 20) as j:
        j.start()
        j.commit([Entry("job", (), b"s")])
        _kill_a_reader_in_a_transaction(jdir)
        for i in range(1500):
            j.commit([Entry("job", (), bytes([i % 256]) * 2000)])
        assert j.stats()["map_size"] == 1 << 20


@pytest.fixture
def two_reader_slots(jdir: Path) -> Iterator[None]:
    """The journal's lock table made with two reader slots: LMDB sizes it when the
    first process opens the files, and a process opening them while another has them
    open takes its size. The process that made it stays until stdin closes."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
    os.remove(jdir / "lock.mdb")
    script = (
        "import sys, lmdb\n"
        "env = lmdb.open(sys.argv[1], max_dbs=8, max_readers=2, mode=0o600)\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(jdir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "open"
        yield
    finally:
        holder.stdin.close()
        holder.stdout.close()
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()


@pytest.mark.usefixtures("two_reader_slots")
def test_slots_of_dead_readers_do_not_stop_reading(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        # This process keeps the files open, so the killed readers' slots are not
        # cleared by an opening: they filled the table and every read failed.
        assert j._shared.env.env.max_readers() == 2
        for _ in range(2):
            _kill_a_reader_in_a_transaction(jdir)
        assert [seq for seq, _, _ in j.facts()] == [1]


# --------------------------------------------------------------------------- verify


def test_verify_of_a_fifo_named_data_mdb_is_refused_not_hung(jdir: Path) -> None:
    jdir.mkdir()
    os.mkfifo(jdir / "data.mdb")
    script = (
        "import sys\n"
        "from xce_resize_plugin.errors import JournalError\n"
        "from xce_resize_plugin.journal import verify\n"
        "try:\n"
        "    verify(sys.argv[1])\n"
        "except JournalError as exc:\n"
        "    print(exc)\n"
    )
    # In another process: the hang this shows was a blocking open() of the FIFO.
    done = subprocess.run(
        [sys.executable, "-c", script, str(jdir)], capture_output=True, text=True, timeout=20
    )
    assert f"{jdir / 'data.mdb'}: no journal here" in done.stdout


def test_verify_still_checks_a_good_journal(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
    report = verify(jdir)
    assert report.ok and report.facts == 1


def test_an_unsynced_journal_writes_with_write_not_through_its_map(jdir: Path) -> None:
    """Without sync the journal wrote through its memory map (LMDB's writemap) into a
    sparse file: a page a full disk could not back killed the process with SIGBUS (a
    simulation on a full TMPDIR: exit 135, no message). Written with write(2), a full
    disk is LMDB's error, a JournalError naming the file. And the file stays as large
    as what is in use: a whole map reserved took 22 GB of disk for the test suite."""
    from xce_resize_plugin.journal.files import _lmdb

    data = jdir / "data.mdb"
    for sync in (False, True):
        env = _lmdb(jdir, data, readonly=False, map_size=64 << 20, sync=sync)
        try:
            assert env.env.flags()["writemap"] is False
        finally:
            env.close()
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("1", (b'{"n":1}',), b"s")])
    assert data.stat().st_blocks * 512 < 1 << 20  # not the 64 MiB map


def test_a_journal_that_cannot_be_initialised_is_a_failed_write(jdir: Path) -> None:
    """Its first write did not happen: a failing disk's error, as every other write
    (the live controller then serves, failing, and retries, rather than stop)."""
    from xce_resize_plugin.journal import files
    from xce_resize_plugin.journal.lmdb_env import is_failed_write

    jdir.mkdir()
    lmdb.open(str(jdir)).close()
    env = lmdb.open(str(jdir), readonly=True, max_dbs=8)
    try:
        with pytest.raises(JournalError, match="cannot initialise a new journal") as info:
            files._create_dbs(env, jdir / "data.mdb")
        assert is_failed_write(info.value)
    finally:
        env.close()


# --------------------------------------------------------------------------- meta pages

PAGE = 4096
TXNID_AT, LAST_PG_AT = 16 + 128, 16 + 120  # in a meta page: header, then MDB_meta


def _meta(jdir: Path, page: int, at: int) -> int:
    raw = (jdir / "data.mdb").read_bytes()
    return int.from_bytes(raw[page * PAGE + at : page * PAGE + at + 8], sys.byteorder)


def _set_txnid(jdir: Path, page: int, txnid: int) -> None:
    """Overwrite one meta page's transaction id in place, as a flipped bit would."""
    with (jdir / "data.mdb").open("r+b") as fh:
        fh.seek(page * PAGE + TXNID_AT)
        fh.write(txnid.to_bytes(8, sys.byteorder))


def _journal_of_commits(jdir: Path, *, grow_last: bool = False) -> tuple[int, int]:
    """A journal after a few commits; (page of the newest meta, its txnid). With
    ``grow_last`` the last commit makes the file longer."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        for n in range(3):
            j.commit([Entry(f"j{n}", (b'{"n":1}',), b"s")])
        if grow_last:
            j.commit([Entry("big", (b"x" * 40_000,), b"s")])
    newest = max((0, 1), key=lambda page: _meta(jdir, page, TXNID_AT))
    return newest, _meta(jdir, newest, TXNID_AT)


def _opened_txnid(jdir: Path) -> int:
    env = lmdb.open(str(jdir), max_dbs=8, readonly=True, lock=False)
    try:
        return int(env.info()["last_txnid"])
    finally:
        env.close()


def test_a_lowered_newest_txnid_is_caught_not_opened_as_the_previous_transaction(
    jdir: Path,
) -> None:
    """A bit flip lowering the newest meta's txnid made LMDB open the previous
    transaction, and verify said OK: the journal silently rolled back."""
    from xce_resize_plugin.journal import require_intact

    newest, txnid = _journal_of_commits(jdir)
    _set_txnid(jdir, newest, txnid & ~4 if txnid & 4 else txnid - 8)  # bit 2 or bit 3
    assert _opened_txnid(jdir) == txnid - 1  # what LMDB now shows: the older page
    report = verify(jdir)
    assert not report.ok and not report.counted
    assert report.problems[0].startswith("meta pages: ")
    assert "not two consecutive ones" in " ".join(report.problems)
    with pytest.raises(JournalError) as err:
        require_intact(jdir)
    message = str(err.value)
    assert f"{jdir / 'data.mdb'}: damaged: meta pages: " in message
    assert "\n" not in message and message.count("data.mdb") == 1


def test_a_txnid_on_the_page_of_the_other_parity_is_caught(jdir: Path) -> None:
    """The page walk of verify saw this; the check at start did not."""
    newest, txnid = _journal_of_commits(jdir)
    from xce_resize_plugin.journal import require_intact

    _set_txnid(jdir, newest, txnid ^ 1)  # bit 0: now on the wrong page for its parity
    with pytest.raises(JournalError, match="which LMDB never writes to page"):
        require_intact(jdir)


def test_an_older_meta_raised_past_the_newest_is_caught_by_its_last_page(jdir: Path) -> None:
    """Raised by 2, the older meta's txnid makes a consecutive pair of the right
    parities: only the file end it records (before the newest commit grew the file)
    tells it apart."""
    newest, txnid = _journal_of_commits(jdir, grow_last=True)
    older = 1 - newest
    assert _meta(jdir, older, LAST_PG_AT) < _meta(jdir, newest, LAST_PG_AT)
    _set_txnid(jdir, older, txnid + 1)
    assert _opened_txnid(jdir) == txnid + 1
    report = verify(jdir)
    assert not report.ok
    assert "the one LMDB opens) ends at page" in " ".join(report.problems)


def test_healthy_meta_pairs_pass(jdir: Path, tmp_path: Path) -> None:
    """A new environment (0 and 0), a journal after commits, and a compacted copy
    (0 and 1) are all healthy pairs."""
    from xce_resize_plugin.journal.meta_pages import meta_pair_problems

    fresh = tmp_path / "fresh"
    lmdb.open(str(fresh)).close()
    assert _meta(fresh, 0, TXNID_AT) == _meta(fresh, 1, TXNID_AT) == 0
    assert meta_pair_problems(fresh / "data.mdb") == []
    _journal_of_commits(jdir)
    assert verify(jdir).ok
    copy = tmp_path / "copy"
    copy.mkdir()
    env = lmdb.open(str(jdir), max_dbs=8, readonly=True, lock=False)
    try:
        env.copy(str(copy), compact=True)
    finally:
        env.close()
    assert (_meta(copy, 0, TXNID_AT), _meta(copy, 1, TXNID_AT)) == (0, 1)
    assert verify(copy).ok


def test_a_first_transaction_whose_id_went_to_0_is_not_taken_for_a_new_file(
    tmp_path: Path,
) -> None:
    from xce_resize_plugin.journal.meta_pages import meta_pair_problems

    env = lmdb.open(str(tmp_path))
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    assert meta_pair_problems(tmp_path / "data.mdb") == []
    _set_txnid(tmp_path, 1, 0)  # LMDB would now open the empty environment
    assert meta_pair_problems(tmp_path / "data.mdb")


# --------------------------------------------------------------------------- damaged pages


def _damaged_leaf(jdir: Path) -> None:
    """A journal whose ``facts`` leaf page says its first fact is 1 MiB long: reading
    it through LMDB runs past the end of the file, and the reader dies with SIGBUS."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("old", tuple(b'{"n":%d}' % n for n in range(16)), b"s", ended_at=0.0)])
    raw = (jdir / "data.mdb").read_bytes()
    # The facts' only leaf: the page holding their payloads (index rows hold none).
    page = next(
        n for n in range(2, len(raw) // PAGE) if b'{"n":15}' in raw[n * PAGE : (n + 1) * PAGE]
    )
    node = page * PAGE + int.from_bytes(raw[page * PAGE + 16 : page * PAGE + 18], sys.byteorder)
    with (jdir / "data.mdb").open("r+b") as fh:
        fh.seek(node)  # the node's data size: 16 low bits, then 16 high bits
        fh.write((0).to_bytes(2, sys.byteorder) + (16).to_bytes(2, sys.byteorder))


def _in_child(code: str, jdir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, str(jdir)], capture_output=True, text=True, timeout=60
    )


def test_export_and_compact_of_a_damaged_page_refuse_instead_of_dying(
    jdir: Path, tmp_path: Path
) -> None:
    """They read through LMDB at once: the process died with SIGBUS (exit 135)."""
    _damaged_leaf(jdir)
    code = (
        "import io, sys\n"
        "from xce_resize_plugin.errors import JournalError\n"
        "from xce_resize_plugin.journal import compact, export\n"
        "for run in (lambda: export(sys.argv[1], io.StringIO()),\n"
        "            lambda: compact(sys.argv[1], 0, 1e9, io.StringIO())):\n"
        "    try:\n"
        "        run()\n"
        "    except JournalError as exc:\n"
        "        print(exc)\n"
    )
    done = _in_child(code, jdir)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for line, undone in zip(lines, ("nothing was exported", "nothing was compacted"), strict=True):
        assert f"{jdir / 'data.mdb'}: damaged: structure: " in line and undone in line


def test_the_start_check_of_a_damaged_page_refuses_instead_of_dying(tmp_path: Path) -> None:
    """The review's journal: the scenario's, its ``facts`` leaf's first node pointer
    flipped. The check at start died with SIGBUS (the live controller exited -7
    without a word)."""
    scenario = Path(__file__).parents[1] / "data" / "scenarios" / "grow_limits.toml"
    cli = [sys.executable, "-m", "xce_resize_plugin.cli.main"]
    run = [*cli, "scenario", "run", str(scenario), "--state-dir", str(tmp_path)]
    subprocess.run(run, check=True, capture_output=True, timeout=120)
    jdir = tmp_path / "resize"
    with (jdir / "data.mdb").open("r+b") as fh:
        fh.seek(9 * PAGE + 16)
        pointer = fh.read(1)[0]
        fh.seek(9 * PAGE + 16)
        fh.write(bytes([pointer ^ 0xFF]))
    code = (
        "import sys\n"
        "from xce_resize_plugin.errors import JournalError\n"
        "from xce_resize_plugin.journal import require_intact\n"
        "try:\n"
        "    require_intact(sys.argv[1])\n"
        "except JournalError as exc:\n"
        "    print(exc)\n"
    )
    done = _in_child(code, jdir)
    assert done.returncode == 0, done.stderr
    assert f"{jdir / 'data.mdb'}: damaged: reading it killed the checking process" in done.stdout
    assert done.stdout.count("\n") == 1


# --------------------------------------------------------------------------- compact, damaged


def _delete_raw(jdir: Path, db: bytes, key: bytes) -> None:
    env = lmdb.open(str(jdir), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            assert txn.delete(key, db=env.open_db(db, txn=txn))
    finally:
        env.close()


def test_compact_stops_at_an_index_row_naming_a_missing_fact(jdir: Path, tmp_path: Path) -> None:
    """verify reported the dangling row, but compaction deleted it and the rest: "removed
    5 facts", and verify then listed a wrong gap."""
    _old_jobs(jdir, jobs=3)
    _delete_raw(jdir, b"facts", (4).to_bytes(8, "big"))  # old1's second fact
    archive = tmp_path / "archive.jsonl"
    with (
        archive.open("a", encoding="utf-8") as fh,
        pytest.raises(JournalError, match=r"lists fact 4 for job 'old1', but there is no such"),
    ):
        compact(jdir, 1, 10 * DAY, fh)
    assert archive.read_text() == ""  # old0's facts were checked, not archived
    with Journal.open(jdir, readonly=True) as j:
        assert [seq for seq, _, _ in j.facts()] == [1, 2, 3, 5, 6]  # nothing deleted
    assert "lists fact 4, which does not exist" in " ".join(verify(jdir).problems)


def test_compact_refused_on_a_bad_crc_leaves_no_archive_lines(jdir: Path, tmp_path: Path) -> None:
    """It said "nothing was compacted", but the facts of the jobs before the damaged one
    were already in the archive."""
    _old_jobs(jdir, jobs=3)
    _put_raw(jdir, b"facts", (6).to_bytes(8, "big"), b"garbage")  # old2's last fact
    archive = tmp_path / "archive.jsonl"
    with archive.open("a", encoding="utf-8") as fh, pytest.raises(JournalError, match="fact 6"):
        compact(jdir, 1, 10 * DAY, fh)
    assert archive.read_text() == ""


# --------------------------------------------------------------------------- messages


def test_messages_name_the_file_once_and_job_ids_as_text(jdir: Path, tmp_path: Path) -> None:
    from xce_resize_plugin.journal import require_intact

    _old_jobs(jdir, jobs=1)
    _put_raw(jdir, b"done", b"old0", b"garbage")
    problems = " ".join(verify(jdir).problems)
    assert "done: state of job 'old0'" in problems and "b'old0'" not in problems
    unreadable = tmp_path / "unreadable"
    _damaged_leaf(unreadable)  # LMDB's CorruptedError, read in the start check's child
    with pytest.raises(JournalError, match="cannot read the journal") as err:
        require_intact(unreadable)
    assert str(err.value).count("data.mdb") == 1
    assert str(err.value).count("Journal error") == 1


def test_without_a_child_process_the_start_check_is_made_in_process(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no child may be started, the start check is still made, in the
    controller's own process, rather than refuse the start."""
    from xce_resize_plugin.journal import require_intact, start_check

    def no_child(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(start_check.subprocess, "run", no_child)
    _journal_of_commits(jdir)
    assert require_intact(jdir).last_seq == 3
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("late", (b'{"n":1}',), b"s")])
    _put_raw(jdir, b"facts", (4).to_bytes(8, "big"), b"not a fact")
    with pytest.raises(JournalError, match="damaged"):
        require_intact(jdir)


def test_another_lmdb_store_is_not_called_a_damaged_journal(jdir: Path) -> None:
    """The live controller's own store has a meta database too: verify of its
    directory said "damaged: meta has no valid schema version"."""
    env = lmdb.open(str(jdir), max_dbs=4)
    try:
        with env.begin(write=True) as txn:
            txn.put(b"x", b"y", db=env.open_db(b"meta", txn=txn))
            env.open_db(b"jobs", txn=txn)
    finally:
        env.close()
    with pytest.raises(JournalError, match=r"data\.mdb: not a plugin journal"):
        verify(jdir)


def test_a_lock_file_that_is_a_directory_is_named(jdir: Path) -> None:
    _journal_of_commits(jdir)
    (jdir / "lock.mdb").unlink()
    (jdir / "lock.mdb").mkdir()
    with pytest.raises(JournalError) as err:
        Journal.open(jdir, sync=False)
    assert str(err.value).endswith(
        f"{jdir / 'lock.mdb'}: not a regular file; LMDB keeps its reader table there"
    )


def test_the_start_check_child_imports_nothing_from_the_working_directory(
    jdir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child ran with ``-m``, which puts the working directory first on its path:
    a json.py lying there ran in a process that, in production, is root."""
    from xce_resize_plugin.journal import require_intact

    _journal_of_commits(jdir)
    planted = tmp_path / "planted"
    planted.mkdir()
    marker = tmp_path / "ran"
    (planted / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.setenv("PYTHONSTARTUP", str(planted / "json.py"))
    assert require_intact(jdir).last_seq == 3
    assert not marker.exists()


@pytest.mark.parametrize(
    ("returncode", "expect"),
    [
        (-7, r"damaged: reading it killed the checking process \(SIGBUS\)"),
        (-11, r"damaged: reading it killed the checking process \(SIGSEGV\)"),
        (-9, r"the check at start was stopped \(SIGKILL\)"),
        (-2, r"the check at start was stopped \(SIGINT\)"),
        (-40, r"the check at start was stopped \(signal 40\)"),
    ],
)
def test_only_a_fault_of_the_reading_child_is_damage(
    jdir: Path, monkeypatch: pytest.MonkeyPatch, returncode: int, expect: str
) -> None:
    """An OOM kill or Ctrl-C said "damaged"; a real-time signal was a traceback."""
    from xce_resize_plugin.journal import require_intact, start_check

    def killed(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(args, returncode, "", "")

    monkeypatch.setattr(start_check.subprocess, "run", killed)
    _journal_of_commits(jdir)
    with pytest.raises(JournalError, match=expect) as err:
        require_intact(jdir)
    assert "\n" not in str(err.value)


def test_a_start_check_that_hangs_is_bounded(jdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from xce_resize_plugin.journal import require_intact, start_check

    def hangs(args: list[str], **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(args, float(str(kwargs["timeout"])))

    monkeypatch.setattr(start_check.subprocess, "run", hangs)
    _journal_of_commits(jdir)
    with pytest.raises(JournalError, match=r"did not end within 900 s"):
        require_intact(jdir)


def test_without_a_python_to_run_the_check_is_made_in_process(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sys.executable may be None or empty (an embedding interpreter): a TypeError
    stopped the controller."""
    from xce_resize_plugin.journal import require_intact, start_check

    monkeypatch.setattr(start_check.sys, "executable", None)
    _journal_of_commits(jdir)
    assert require_intact(jdir).last_seq == 3


def test_a_walk_that_saw_a_commit_is_not_taken_for_damage(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """export walked the pages of a journal a running controller was writing: pages
    the writer reused looked damaged, and an online export was refused."""
    from xce_resize_plugin.journal import page_walk

    _journal_of_commits(jdir)
    walks: list[int] = []

    def walk_during_a_commit(path: Path) -> list[str]:
        walks.append(1)
        with Journal.open(jdir, sync=False) as j:
            j.start()
            j.commit([Entry(f"w{len(walks)}", (b'{"n":1}',), b"s")])
        return ["structure: what a reused page looks like"]

    monkeypatch.setattr(page_walk, "structure_problems", walk_during_a_commit)
    page_walk.require_readable(jdir, "nothing was exported")
    assert len(walks) == 3

    def damaged(path: Path) -> list[str]:
        return ["structure: leaf page 9 node 0 key overruns page"]

    monkeypatch.setattr(page_walk, "structure_problems", damaged)
    with pytest.raises(JournalError, match="overruns page; nothing was exported"):
        page_walk.require_readable(jdir, "nothing was exported")


def test_meta_pages_that_change_at_every_read_are_a_writer_not_damage(
    jdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xce_resize_plugin.journal import meta_pages
    from xce_resize_plugin.journal.meta_pages import MetaPage

    _journal_of_commits(jdir)
    reads = iter(range(100))

    def torn(data_file: Path) -> tuple[MetaPage, MetaPage]:
        n = 2 * next(reads)  # each read a different pair, each one odd-looking
        return MetaPage(0, n, n + 5), MetaPage(1, n + 3, n)

    monkeypatch.setattr(meta_pages, "read_metas", torn)
    assert meta_pages.meta_pair_problems(jdir / "data.mdb") == []
    monkeypatch.setattr(meta_pages, "read_metas", lambda f: (MetaPage(0, 4, 9), MetaPage(1, 7, 3)))
    assert meta_pages.meta_pair_problems(jdir / "data.mdb")[0].startswith("meta pages: ")
