"""The controllers' stores at rest (issue #13 §5, §6), on real LMDB files: private
modes whatever the umask, truncation refused, records sealed with a CRC over key and
value, job tokens derived and never stored, and the start-up checks of the journal and
of the store against it. The same behaviours with real controller processes are in
tests/e2e/live/test_live_state_integrity.py and test_live_secrets_at_rest.py."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.live import state_check
from xce_resize_plugin.controllers.live.job_tokens import KEY_FILE, JobTokens
from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.controllers.store import SCHEMA, LmdbStore, MemoryStore
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.core.models import JobState, ResizeState, Task
from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.journal import Entry, Journal, require_intact, verify
from xce_resize_plugin.journal.lmdb_env import LmdbEnv


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask() -> Iterator[None]:
    """Restores the process's umask after a test that sets it."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield
    os.umask(previous)


# -- modes --------------------------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o000, 0o077])
def test_stores_are_private_whatever_the_umask(tmp_path: Path, umask: None, mask: int) -> None:
    os.umask(mask)
    env = LmdbEnv.open(tmp_path / "a" / "store", noun="the test state", max_dbs=1)
    env.close()
    assert _mode(tmp_path / "a" / "store") == 0o700
    assert _mode(tmp_path / "a" / "store" / "data.mdb") == 0o600
    assert _mode(tmp_path / "a" / "store" / "lock.mdb") == 0o600


def test_looser_modes_are_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "store"
    LmdbEnv.open(path, noun="the test state", max_dbs=1).close()
    os.chmod(path, 0o755)
    os.chmod(path / "data.mdb", 0o644)
    with caplog.at_level(logging.WARNING):
        LmdbEnv.open(path, noun="the test state", max_dbs=1).close()
    assert _mode(path) == 0o700 and _mode(path / "data.mdb") == 0o600
    assert f"{path}: mode was 755, open to other users; made 700" in caplog.text
    assert f"{path / 'data.mdb'}: mode was 644, open to other users; made 600" in caplog.text


def test_a_read_only_open_changes_no_mode(tmp_path: Path) -> None:
    """`journal verify` may be run by another user: it reads, and changes nothing."""
    path = tmp_path / "journal"
    with Journal.open(path):
        pass
    os.chmod(path / "data.mdb", 0o644)
    with Journal.open(path, readonly=True):
        pass
    assert _mode(path / "data.mdb") == 0o644


# -- truncation ---------------------------------------------------------------------------


def _store_with_jobs(path: Path, n: int = 40) -> None:
    store = LmdbStore(path)
    jobs = [(_job(str(100 + i), "alice", x="y" * 2000), {0: "h1"}) for i in range(n)]
    store.write({"clock": 1.0}, jobs)
    store.close()


def _job(job_id: str, user: str, version: int = 0, x: str = "") -> JobRecord:
    return JobRecord(
        id=job_id,
        user=user,
        min_tasks=1,
        max_tasks=4,
        submit_time=0.0,
        env={"X": x} if x else {},
        state=JobState.RUN,
        tasks=(Task(0, "h1"),),
        version=version,
    )


@pytest.mark.parametrize("size", ["half", "empty"])
def test_a_truncated_store_is_refused_before_lmdb_reads_it(tmp_path: Path, size: str) -> None:
    """Reading it killed the process with SIGBUS; an empty one became a new state."""
    path = tmp_path / "embedded"
    _store_with_jobs(path)
    data = path / "data.mdb"
    os.truncate(data, data.stat().st_size // 2 if size == "half" else 0)
    before = data.stat().st_size
    with pytest.raises(StoreError) as info:
        LmdbStore(path)
    word = "truncated" if size == "half" else "the file is empty"
    assert str(info.value).startswith(f"{data}: {word}")
    assert data.stat().st_size == before


# -- sealed records -----------------------------------------------------------------------


def _raw_put(path: Path, db: bytes, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=env.open_db(db, txn=txn))
    env.close()


def _raw_get(path: Path, db: bytes, key: bytes) -> bytes:
    env = lmdb.open(str(path), max_dbs=4, readonly=True)
    with env.begin() as txn:
        value = txn.get(key, db=env.open_db(db, txn=txn, create=False))
    env.close()
    assert value is not None
    return bytes(value)


def test_a_same_length_edit_of_a_job_record_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "embedded"
    _store_with_jobs(path, 2)
    raw = _raw_get(path, b"jobs", b"100")
    _raw_put(path, b"jobs", b"100", raw.replace(b'"user":"alice"', b'"user":"mallo"'))
    store = LmdbStore(path)
    with pytest.raises(StoreError) as info:
        store.load()
    store.close()
    assert str(info.value).startswith(f"{path / 'data.mdb'}: job record '100': CRC mismatch")
    assert "edited outside the controller" in str(info.value)


def test_a_record_under_another_key_is_refused(tmp_path: Path) -> None:
    """The CRC covers the key: job 101's record copied as job 100's does not pass."""
    path = tmp_path / "embedded"
    _store_with_jobs(path, 2)
    _raw_put(path, b"jobs", b"100", _raw_get(path, b"jobs", b"101"))
    store = LmdbStore(path)
    with pytest.raises(StoreError, match="job record '100': CRC mismatch"):
        store.load()
    store.close()


def test_a_store_of_the_previous_schema_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "embedded"
    _store_with_jobs(path, 1)
    _raw_put(path, b"meta", b"state", b'{"schema": 1, "clock": 1.0}')
    store = LmdbStore(path)
    with pytest.raises(StoreError) as info:
        store.load()
    store.close()
    assert str(info.value) == (
        f"{path / 'data.mdb'}: state of schema 1, written by an earlier development version "
        f"(records without CRCs; this version reads schema {SCHEMA} only): start the embedded "
        "controller on a new state directory"
    )


def test_the_memory_store_seals_too() -> None:
    store = MemoryStore()
    store.write({"clock": 2.0}, [(_job("7", "bob"), {0: "h1"})])
    snapshot = store.load()
    assert snapshot is not None and snapshot.jobs[0][0].user == "bob"
    store._jobs["7"] = store._jobs["7"].replace(b'"bob"', b'"eve"')
    with pytest.raises(StoreError, match="memory store: job record '7': CRC mismatch"):
        store.load()


def test_live_store_side_records_are_sealed_and_start_takes_the_epoch(tmp_path: Path) -> None:
    path = tmp_path / "controller"
    store = LiveStore(path)
    store.put("job:1", {"argv": ["true"]})
    store.write({"clock": 1.0}, [])
    store.close()
    quiet = LiveStore(path, start=False)  # reads and checks, takes no epoch
    assert quiet.epoch == 0 and quiet.stored_epoch() == 1 and quiet.get("job:1")
    quiet.close()
    raw = _raw_get(path, b"live", b"job:1")
    _raw_put(path, b"live", b"job:1", raw.replace(b"true", b"trUe"))
    with pytest.raises(StoreError, match=r"data.mdb: side record 'job:1': CRC mismatch"):
        LiveStore(path, start=False)
    again = lmdb.open(str(path), max_dbs=4, readonly=True)
    with again.begin() as txn:  # the refused opening took no epoch
        assert txn.get(b"epoch", db=again.open_db(b"meta", txn=txn, create=False)) == (
            (1).to_bytes(8, "big")
        )
    again.close()


# -- job tokens ---------------------------------------------------------------------------


def test_job_tokens_are_derived_and_bound_to_job_and_salt(tmp_path: Path) -> None:
    tokens = JobTokens.load(tmp_path, None)
    assert _mode(tmp_path / KEY_FILE) == 0o600
    salt = tokens.new_salt()
    token = tokens.token("101", salt)
    assert token.startswith("101.") and len(token) == len("101.") + 43
    assert tokens.job_of(token) == "101" and tokens.matches(token, "101", salt)
    assert not tokens.matches(token, "101", tokens.new_salt())
    assert not tokens.matches(token.replace("101.", "102."), "102", salt)
    assert tokens.job_of("no-dot") is None and tokens.job_of(".x") is None
    assert str(tokens.key) not in repr(tokens)
    # The same key and salt give the same token after a restart.
    again = JobTokens.load(tmp_path, tokens.fingerprint)
    assert again.token("101", salt) == token


def test_a_missing_or_other_key_is_refused(tmp_path: Path) -> None:
    fingerprint = JobTokens.load(tmp_path, None).fingerprint
    (tmp_path / KEY_FILE).write_text("something else entirely\n")
    with pytest.raises(StoreError, match="not the key this state directory's job tokens"):
        JobTokens.load(tmp_path, fingerprint)
    (tmp_path / KEY_FILE).unlink()
    with pytest.raises(StoreError, match=f"{tmp_path / KEY_FILE}: missing"):
        JobTokens.load(tmp_path, fingerprint)
    assert not (tmp_path / KEY_FILE).exists()


# -- the journal at start -----------------------------------------------------------------


def _journal(path: Path, facts: int = 5) -> None:
    with Journal.open(path, sync=False) as journal:
        journal.start()
        journal.commit([Entry("j1", tuple(b"fact %d" % i for i in range(facts)), b"{}")])


def test_require_intact_names_the_file_and_the_first_damaged_fact(tmp_path: Path) -> None:
    path = tmp_path / "resize"
    _journal(path)
    assert require_intact(path).facts == 5
    raw = _raw_get_journal(path, (3).to_bytes(8, "big"))
    _raw_put_journal(path, (3).to_bytes(8, "big"), raw[:-1] + b"X")
    with pytest.raises(JournalError) as info:
        require_intact(path)
    assert info.value.detail == (
        f"{path / 'data.mdb'}: damaged: fact 3: CRC mismatch "
        f"(stored {int.from_bytes(raw[:4], 'big'):08x}, computed "
        f"{_crc_of(raw[4:-1] + b'X'):08x}); the controller does not start on it "
        f"(`xce-resize journal verify {path}` lists every problem)"
    )


def test_the_start_check_skips_the_index_that_verify_checks(tmp_path: Path) -> None:
    """The index cross-references are most of `journal verify`'s cost; the check at start
    leaves them to it."""
    path = tmp_path / "resize"
    _journal(path)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.delete(b"j1\0" + (2).to_bytes(8, "big"), db=env.open_db(b"index", txn=txn))
    env.close()
    assert not verify(path, structure=False).ok
    assert verify(path, structure=False, references=False).ok
    require_intact(path)


def _raw_get_journal(path: Path, key: bytes) -> bytes:
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    with env.begin() as txn:
        value = txn.get(key, db=env.open_db(b"facts", txn=txn, create=False))
    env.close()
    assert value is not None
    return bytes(value)


def _raw_put_journal(path: Path, key: bytes, value: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        txn.put(key, value, db=env.open_db(b"facts", txn=txn))
    env.close()


def _crc_of(body: bytes) -> int:
    import zlib

    return zlib.crc32(body)


# -- the store against the journal --------------------------------------------------------


def _state(user: str = "alice", version: int = 1, next_task_id: int = 2) -> ResizeState:
    tasks = (Task(0, "h1"), Task(1, "h1"))[: 1 + (version > 0)]
    return ResizeState(
        job_id="101",
        user=user,
        min_tasks=1,
        max_tasks=4,
        tasks=tasks,
        started_at=0.0,
        version=version,
        next_task_id=next_task_id,
    )


def _store_job(version: int, tasks: tuple[Task, ...], state: JobState = JobState.RUN) -> JobRecord:
    job = _job("101", "alice", version)
    job.tasks, job.state = tasks, state
    return job


TWO = (Task(0, "h1"), Task(1, "h1"))
ONE = (Task(0, "h1"),)


@pytest.mark.parametrize(
    ("job", "held", "state", "problem", "repair"),
    [
        (_store_job(1, TWO), {0: "h1", 1: "h1"}, _state(), None, None),
        # The journal is ahead (a crash before the host was told): re-issued at start.
        (_store_job(0, ONE), {0: "h1"}, _state(), None, "allocation version 1 is committed again"),
        (_store_job(1, TWO, JobState.DONE), {}, _state(), None, "DONE in the store: its resize"),
        # Anything else: not one history.
        (_store_job(1, TWO), {}, _state(user="bob"), "owned by 'alice' in the store", None),
        (_store_job(2, TWO), {}, _state(), "allocation version 2 in the store, an older", None),
        (
            _store_job(1, (Task(0, "h1"), Task(1, "h2"))),
            {},
            _state(),
            "allocation version 1 is 0@h1 1@h2 in the store, 0@h1 1@h1",
            None,
        ),
        (
            _store_job(1, TWO),
            {0: "h1", 5: "h2"},
            _state(),
            "the store holds slots for task ids [5], never",
            None,
        ),
    ],
)
def test_the_rules_of_the_cross_check(
    job: JobRecord,
    held: dict[int, str],
    state: ResizeState,
    problem: str | None,
    repair: str | None,
) -> None:
    found = state_check._compare(job, held, state)
    assert (found[0] is None) == (problem is None) and (found[1] is None) == (repair is None)
    if problem is not None:
        assert found[0] is not None and found[0].startswith(problem), found
    if repair is not None:
        assert found[1] is not None and found[1].startswith(repair), found


def test_a_snapshot_read_to_check_is_not_decoded_again_unless_written_since(
    tmp_path: Path,
) -> None:
    """The start reads the store once to check it and the controller loads it again after
    taking the epoch: the first snapshot serves if only the epoch was written between,
    and not if another writer got in (a controller still running on the directory)."""
    path = tmp_path / "controller"
    first = LiveStore(path)
    first.write({"clock": 1.0}, [(_job("101", "alice"), {0: "h1"})])
    first.close()
    checking = LiveStore(path, start=False)
    seen = checking.load()
    checking.start()
    assert checking.load() is seen
    assert checking.load() is not seen  # kept once only
    checking.close()

    checking = LiveStore(path, start=False)
    seen = checking.load()
    # Another controller (another process: LMDB allows one handle per process) writes
    # between the check and the epoch.
    script = (
        "import sys; from pathlib import Path; "
        "from tests.unit.test_state_at_rest import _job; "
        "from xce_resize_plugin.controllers.live.live_store import LiveStore; "
        "s = LiveStore(Path(sys.argv[1])); s.write(None, [(_job('102', 'bob'), {0: 'h1'})]); "
        "s.close()"
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, cwd=Path.cwd())
    checking.start()
    again = checking.load()
    assert again is not None and again is not seen
    assert sorted(job.id for job, _ in again.jobs) == ["101", "102"]
    checking.close()
