"""The LMDB journal: real LMDB files in tmp_path, no mocks."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xce_resize_plugin.errors import FencedError, JournalError
from xce_resize_plugin.journal import (
    SCHEMA,
    Entry,
    GroupCommitter,
    Journal,
    StoredState,
    Tail,
    Ticket,
    compact,
    export,
    verify,
)

DAY = 86400.0


@pytest.fixture
def jdir(tmp_path: Path) -> Path:
    return tmp_path / "journal"


@pytest.fixture
def journal(jdir: Path) -> Iterator[Journal]:
    # sync=False: durability is not what these tests look at, and fsyncs cost time.
    with Journal.open(jdir, sync=False) as j:
        j.start()
        yield j


def _live(journal: Journal) -> dict[str, bytes]:
    """Live jobs' state payloads (these tests write no history)."""
    return {job_id: stored.state for job_id, stored in journal.live_states()}


def _state(journal: Journal, job_id: str) -> bytes | None:
    stored = journal.state(job_id)
    return None if stored is None else stored.state


def data_file(jdir: Path) -> str:
    return str((jdir / "data.mdb").absolute())


def raw_env(jdir: Path) -> lmdb.Environment:
    """The journal's environment opened directly, to damage it the way a disk would."""
    return lmdb.open(str(jdir), max_dbs=8)


def seal(body: bytes) -> bytes:
    return zlib.crc32(body).to_bytes(4, "big") + body


# --------------------------------------------------------------------------- basics


def test_round_trip(journal: Journal) -> None:
    seqs = journal.commit(
        [
            Entry("1", (b"grow-requested", b"placed"), b"state-1a"),
            Entry("2", (b"release",), b"state-2"),
        ]
    )
    assert seqs == [1, 2, 3]
    assert list(journal.facts()) == [
        (1, "1", b"grow-requested"),
        (2, "1", b"placed"),
        (3, "2", b"release"),
    ]
    assert list(journal.facts(start=3)) == [(3, "2", b"release")]
    assert list(journal.job_facts("1")) == [(1, b"grow-requested"), (2, b"placed")]
    assert list(journal.job_facts("unknown")) == []
    assert _live(journal) == {"1": b"state-1a", "2": b"state-2"}
    assert _state(journal, "1") == b"state-1a"
    assert _state(journal, "unknown") is None
    assert journal.last_seq == 3
    stats = journal.stats()
    assert stats["facts"] == 3 and stats["index"] == 3 and stats["jobs"] == 2
    assert stats["done"] == 0 and stats["last_seq"] == 3 and stats["epoch"] == 1
    assert stats["map_size"] >= 64 * 1024 * 1024


def test_data_survives_reopen_and_seqs_continue(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        assert j.start() == 1
        assert j.commit([Entry("a", (b"x", b"y"), b"s1")]) == [1, 2]
        assert j.commit([Entry("b", (b"z",), b"s2"), Entry("a", (), b"s3")]) == [3]
    with Journal.open(jdir) as j:
        assert j.start() == 2
        assert j.epoch == 2
        assert j.last_seq == 3
        assert j.commit([Entry("a", (b"w",), b"s4")]) == [4]
        assert [seq for seq, _, _ in j.facts()] == [1, 2, 3, 4]
        assert _state(j, "a") == b"s4"


def test_state_only_entry_and_empty_commit(journal: Journal) -> None:
    assert journal.commit([]) == []
    assert journal.commit([Entry("a", (), b"only-state")]) == []
    assert _state(journal, "a") == b"only-state"
    assert journal.last_seq == 0


def test_live_to_done_and_back(journal: Journal) -> None:
    journal.commit([Entry("a", (b"f1",), b"running"), Entry("b", (b"g1",), b"running")])
    journal.commit([Entry("a", (b"f2",), b"finished", ended_at=1000.5)])
    assert _live(journal) == {"b": b"running"}
    assert _state(journal, "a") == b"finished"
    assert journal.ended_at("a") == 1000.5
    assert journal.ended_at("b") is None
    stats = journal.stats()
    assert (stats["jobs"], stats["done"]) == (1, 1)
    # A job coming back to life (e.g. requeued) leaves `done` again.
    journal.commit([Entry("a", (), b"requeued")])
    assert _live(journal) == {"a": b"requeued", "b": b"running"}
    assert journal.ended_at("a") is None
    assert journal.stats()["done"] == 0
    assert list(journal.job_facts("a")) == [(1, b"f1"), (3, b"f2")]


def test_prefix_job_ids_keep_their_own_facts(journal: Journal) -> None:
    journal.commit([Entry("1", (b"one",), b""), Entry("10", (b"ten",), b"")])
    journal.commit([Entry("1\x01", (b"odd",), b""), Entry("1", (b"one-again",), b"")])
    assert [p for _, p in journal.job_facts("1")] == [b"one", b"one-again"]
    assert [p for _, p in journal.job_facts("10")] == [b"ten"]


def test_iterators_span_many_chunks(journal: Journal) -> None:
    # More rows than one read transaction takes (1024), to cover the resumption.
    for start in range(0, 3000, 500):
        journal.commit(
            [Entry(f"job{i:05d}", (b"f%d" % i,), b"s") for i in range(start, start + 500)]
        )
    journal.commit([Entry("job00000", tuple(b"g%d" % i for i in range(2500)), b"s")])
    assert [seq for seq, _, _ in journal.facts()] == list(range(1, 5501))
    assert len(_live(journal)) == 3000
    assert [p for _, p in journal.job_facts("job00000")][:2] == [b"f0", b"g0"]
    assert len(list(journal.job_facts("job00000"))) == 2501


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"job_id": ""}, ValueError),
        ({"job_id": "a\0b"}, ValueError),
        ({"job_id": "x" * 501}, ValueError),
        ({"job_id": 7}, TypeError),
        ({"facts": ("text",)}, TypeError),
        ({"state": "text"}, TypeError),
        ({"ended_at": float("nan")}, ValueError),
        ({"ended_at": True}, ValueError),
    ],
)
def test_entry_validation(kwargs: dict[str, object], error: type[Exception]) -> None:
    args: dict[str, object] = {"job_id": "j", "facts": (b"f",), "state": b"s"} | kwargs
    with pytest.raises(error):
        Entry(**args)  # type: ignore[arg-type]


def test_entry_accepts_a_list_of_facts() -> None:
    assert Entry("j", [b"a", b"b"], b"s").facts == (b"a", b"b")


def test_commit_requires_start(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j:
        assert j.epoch == 0
        with pytest.raises(JournalError, match="start"):
            j.commit([Entry("a", (b"x",), b"s")])


def test_readonly_handle_refuses_writes(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
    with Journal.open(jdir, readonly=True) as ro:
        assert list(ro.facts()) == [(1, "a", b"x")]
        with pytest.raises(JournalError, match="read-only"):
            ro.start()
        with pytest.raises(JournalError, match="read-only"):
            ro.commit([Entry("a", (b"y",), b"s")])


def test_handles_in_one_process_share_the_environment(jdir: Path) -> None:
    with Journal.open(jdir) as rw:
        rw.start()
        rw.commit([Entry("a", (b"x",), b"s")])
        with Journal.open(jdir, readonly=True) as ro:
            assert ro.last_seq == 1
        rw.commit([Entry("a", (b"y",), b"s")])  # closing `ro` left `rw` working
        assert rw.last_seq == 2
    # A read-only handle first, then a writable one: the environment is reopened for
    # writing underneath, and the read-only handle keeps reading.
    with Journal.open(jdir, readonly=True) as ro:
        with Journal.open(jdir) as rw:
            rw.start()
            rw.commit([Entry("a", (b"z",), b"s")])
        assert ro.last_seq == 3
        assert [p for _, p in ro.job_facts("a")] == [b"x", b"y", b"z"]
        with pytest.raises(JournalError, match="read-only"):
            ro.start()


def test_closed_handle_raises(jdir: Path) -> None:
    j = Journal.open(jdir)
    j.close()
    j.close()
    with pytest.raises(JournalError, match="closed"):
        _ = j.last_seq


def test_readonly_open_of_missing_journal(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    with pytest.raises(JournalError, match="does not exist") as err:
        Journal.open(missing, readonly=True)
    assert str(missing / "data.mdb") in str(err.value)
    assert not missing.exists()


# --------------------------------------------------------------------------- fencing


def test_fencing_between_two_handles(jdir: Path) -> None:
    old = Journal.open(jdir)
    new = Journal.open(jdir)
    try:
        assert old.start() == 1
        old.commit([Entry("a", (b"x",), b"s1")])
        assert new.start() == 2
        with pytest.raises(FencedError) as err:
            old.commit([Entry("a", (b"stale",), b"stale-state"), Entry("b", (b"y",), b"s")])
        message = str(err.value)
        assert data_file(jdir) in message
        assert "epoch 1" in message and "epoch 2" in message
        # The wording docs/admin-guide.md shows.
        assert err.value.detail == (
            f"{data_file(jdir)}: this controller holds epoch 1 but the journal is at epoch 2: "
            "a newer controller has started on this state directory; stop this one"
        )
        # Nothing of the fenced transaction was written.
        assert new.last_seq == 1
        assert list(new.facts()) == [(1, "a", b"x")]
        assert _state(new, "a") == b"s1" and _state(new, "b") is None
        assert new.commit([Entry("a", (b"z",), b"s2")]) == [2]
    finally:
        old.close()
        new.close()


def test_fencing_by_another_process(jdir: Path) -> None:
    with Journal.open(jdir) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
        script = (
            "import sys; from xce_resize_plugin.journal import Journal\n"
            "with Journal.open(sys.argv[1]) as j: print(j.start())\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, str(jdir)], capture_output=True, text=True, check=True
        )
        assert out.stdout.strip() == "2"
        with pytest.raises(FencedError, match="epoch 2"):
            j.commit([Entry("a", (b"y",), b"s")])
        assert j.last_seq == 1


# --------------------------------------------------------------------------- map growth


def test_map_grows_and_retries_the_whole_transaction(jdir: Path) -> None:
    with Journal.open(jdir, map_size=64 * 1024, sync=False) as j:
        j.start()
        before = j.stats()["map_size"]
        # ~3 MB in one transaction, far beyond the map, then several smaller ones.
        big = [
            Entry(f"j{i}", tuple(os.urandom(300) for _ in range(10)), b"s" * 300)
            for i in range(1000)
        ]
        seqs = j.commit(big)
        assert seqs == list(range(1, 10001))
        for round_ in range(5):
            j.commit([Entry(f"k{round_}", (os.urandom(4000),), os.urandom(2000))])
        stats = j.stats()
        assert stats["map_size"] > before
        assert stats["facts"] == stats["index"] == 10005
        assert stats["jobs"] == 1005
        assert [p for _, p in j.job_facts("j999")] == list(big[999].facts)
        assert _state(j, "j5") == b"s" * 300
    assert verify(jdir).ok


def test_iteration_survives_map_growth(jdir: Path) -> None:
    with Journal.open(jdir, map_size=64 * 1024, sync=False) as j:
        j.start()
        j.commit([Entry(f"j{i:04d}", (b"%d" % i,), b"s") for i in range(3000)])
        size = j.stats()["map_size"]
        it = j.facts()
        head = [next(it) for _ in range(10)]
        j.commit([Entry("big", tuple(os.urandom(500) for _ in range(4000)), b"s")])
        assert j.stats()["map_size"] > size
        rest = list(it)
        assert [seq for seq, _, _ in head + rest] == list(range(1, 7001))


def test_readers_in_other_threads_during_map_growth(jdir: Path) -> None:
    # A remap under a reader in another thread would crash the process, not raise; and
    # readers in tight loops must not keep the writer out (py-lmdb's own lock is unfair).
    with Journal.open(jdir, map_size=64 * 1024, sync=False) as j:
        j.start()
        j.commit([Entry(f"j{i:03d}", (b"x" * 100,), b"s" * 100) for i in range(200)])
        stop = threading.Event()
        seen: list[int] = []
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                while not stop.is_set():
                    seen.append(sum(1 for _ in j.facts()))
                    assert len(_live(j)) >= 200
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        readers = [threading.Thread(target=reader) for _ in range(3)]
        for thread in readers:
            thread.start()
        try:
            for round_ in range(12):
                j.commit([Entry(f"k{round_}", tuple(os.urandom(800) for _ in range(300)), b"s")])
            deadline = time.monotonic() + 30
            while len(seen) < 6 and not errors and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            for thread in readers:
                thread.join()
        assert not errors
        assert j.stats()["map_size"] >= 4 * 1024 * 1024
        assert seen and all(200 <= n <= 200 + 12 * 300 for n in seen)


def test_reader_adopts_a_map_grown_by_another_process(jdir: Path) -> None:
    with Journal.open(jdir, map_size=64 * 1024) as j:
        j.start()
        j.commit([Entry("a", (b"x",), b"s")])
        script = (
            "import os, sys\n"
            "from xce_resize_plugin.journal import Entry, Journal\n"
            "with Journal.open(sys.argv[1], map_size=64 * 1024, sync=False) as j:\n"
            "    j.start()\n"
            "    j.commit([Entry('b', tuple(os.urandom(1000) for _ in range(2000)), b's')])\n"
        )
        subprocess.run([sys.executable, "-c", script, str(jdir)], check=True)
        assert j.last_seq == 2001
        assert sum(1 for _ in j.facts()) == 2001


# --------------------------------------------------------------------------- damage


def make_journal(jdir: Path, jobs: int = 300) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit(
            [Entry(f"job{i}", (os.urandom(200), os.urandom(200)), b"s" * 100) for i in range(jobs)]
        )


def damage_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(50_000))


def damage_overwrite_head(path: Path) -> None:
    with path.open("r+b") as f:
        f.write(b"\xa5" * 8192)


def damage_truncate_half(path: Path) -> None:
    """Half of the pages in use (a journal written without sync is as long as its map,
    mostly unused: cutting that part would lose nothing)."""
    env = lmdb.open(str(path.parent), readonly=True, lock=False)
    used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    env.close()
    os.truncate(path, used // 2)


def damage_truncate_tiny(path: Path) -> None:
    os.truncate(path, 100)


def damage_truncate_empty(path: Path) -> None:
    os.truncate(path, 0)


@pytest.mark.parametrize(
    "damage",
    [
        damage_garbage,
        damage_overwrite_head,
        damage_truncate_half,
        damage_truncate_tiny,
        damage_truncate_empty,
    ],
)
@pytest.mark.parametrize("readonly", [False, True])
def test_damaged_file_is_refused_with_its_name(
    jdir: Path, damage: Callable[[Path], None], readonly: bool
) -> None:
    make_journal(jdir)
    damage(jdir / "data.mdb")
    size = (jdir / "data.mdb").stat().st_size
    with pytest.raises(JournalError) as err:
        Journal.open(jdir, readonly=readonly)
    assert data_file(jdir) in str(err.value)
    # Never a silent reset: the file is left as it was.
    assert (jdir / "data.mdb").stat().st_size == size


def test_truncated_file_is_refused_and_not_extended_without_sync(jdir: Path) -> None:
    """Without sync too, a truncated file is refused as it is, not extended to the map
    size first (as LMDB did when the journal wrote through its map)."""
    make_journal(jdir)
    damage_truncate_half(jdir / "data.mdb")
    size = (jdir / "data.mdb").stat().st_size
    with pytest.raises(JournalError, match="truncated") as err:
        Journal.open(jdir, sync=False)
    assert data_file(jdir) in str(err.value)
    assert (jdir / "data.mdb").stat().st_size == size


def test_garbage_file_in_a_fresh_directory(jdir: Path) -> None:
    jdir.mkdir()
    (jdir / "data.mdb").write_bytes(b"this is not an LMDB file\n" * 400)
    with pytest.raises(JournalError, match="not a usable LMDB environment") as err:
        Journal.open(jdir)
    assert data_file(jdir) in str(err.value)


def test_other_lmdb_environment_is_not_a_journal(jdir: Path) -> None:
    env = lmdb.open(str(jdir))
    with env.begin(write=True) as txn:
        txn.put(b"key", b"value")
    env.close()
    with pytest.raises(JournalError, match="not a journal") as err:
        Journal.open(jdir)
    assert data_file(jdir) in str(err.value)


def test_newer_schema_is_refused(jdir: Path) -> None:
    make_journal(jdir, jobs=3)
    env = raw_env(jdir)
    meta = env.open_db(b"meta", create=False)
    with env.begin(write=True) as txn:
        txn.put(b"schema", (SCHEMA + 1).to_bytes(8, "big"), db=meta)
    env.close()
    for readonly in (False, True):
        with pytest.raises(JournalError, match="newer") as err:
            Journal.open(jdir, readonly=readonly)
        assert data_file(jdir) in str(err.value)
    with pytest.raises(JournalError, match="newer"):
        verify(jdir)


def flip_byte(jdir: Path, db_name: bytes, key: bytes, offset: int = 10) -> None:
    env = raw_env(jdir)
    db = env.open_db(db_name, create=False)
    with env.begin(write=True) as txn:
        stored = txn.get(key, db=db)
        assert stored is not None
        value = bytearray(stored)
        value[offset] ^= 0x40
        txn.put(key, bytes(value), db=db)
    env.close()


def test_flipped_byte_in_a_fact_names_the_seq(jdir: Path) -> None:
    make_journal(jdir, jobs=3)
    flip_byte(jdir, b"facts", (4).to_bytes(8, "big"), offset=50)
    with Journal.open(jdir, readonly=True) as j:
        it = j.facts()
        assert [seq for seq, _, _ in (next(it), next(it), next(it))] == [1, 2, 3]
        with pytest.raises(JournalError, match=r"fact 4: CRC mismatch") as err:
            next(it)
        assert data_file(jdir) in str(err.value)
        with pytest.raises(JournalError, match="fact 4"):
            list(j.job_facts("job1"))
        assert list(j.job_facts("job0")) != []


def test_flipped_byte_in_a_state_names_the_job(jdir: Path) -> None:
    make_journal(jdir, jobs=3)
    flip_byte(jdir, b"jobs", b"job2", offset=6)
    with Journal.open(jdir, readonly=True) as j:
        with pytest.raises(JournalError, match="job2") as err:
            list(j.live_states())
        assert "CRC" in str(err.value) and data_file(jdir) in str(err.value)
        with pytest.raises(JournalError, match="job2"):
            _state(j, "job2")
        assert _state(j, "job1") == b"s" * 100


# --------------------------------------------------------------------------- group commit


def _run_threads(worker: Callable[[int], None], n: int) -> None:
    """Run ``worker(0..n-1)`` in ``n`` threads and wait for them (30 s at most each)."""
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive(), "a caller is stuck"


def test_group_commit_many_threads(jdir: Path) -> None:
    threads_n, per_thread = 16, 20
    with Journal.open(jdir) as j:  # durable: the batching comes from waiting on fsync
        j.start()
        results: dict[int, list[list[int]]] = {}
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads_n)
        with GroupCommitter(j) as gc:

            def worker(t: int) -> None:
                try:
                    barrier.wait()
                    results[t] = [
                        gc.submit(
                            Entry(f"t{t}", (b"%d-%d-a" % (t, i), b"%d-%d-b" % (t, i)), b"%d" % i)
                        )
                        for i in range(per_thread)
                    ]
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            _run_threads(worker, threads_n)
            assert not errors
            assert gc.entries == threads_n * per_thread
            assert gc.transactions < threads_n * per_thread
        all_seqs = [seq for seqs in results.values() for pair in seqs for seq in pair]
        assert sorted(all_seqs) == list(range(1, 2 * threads_n * per_thread + 1))
        facts = {seq: (job, payload) for seq, job, payload in j.facts()}
        for t, seqs in results.items():
            for i, (a, b) in enumerate(seqs):
                assert b == a + 1  # one entry's facts stay together
                assert facts[a] == (f"t{t}", b"%d-%d-a" % (t, i))
                assert facts[b] == (f"t{t}", b"%d-%d-b" % (t, i))
            assert _state(j, f"t{t}") == b"%d" % (per_thread - 1)


def test_group_commit_error_reaches_every_caller_of_the_batch(jdir: Path) -> None:
    callers = 8
    with Journal.open(jdir, sync=False) as j, Journal.open(jdir, sync=False) as newer:
        j.start()
        newer.start()  # fences `j`: every commit of `j` fails from now on
        gc = GroupCommitter(j)
        outcomes: list[BaseException | list[int]] = []
        lock = threading.Lock()
        submitting = threading.Barrier(callers + 1)

        def worker(i: int) -> None:
            submitting.wait()
            try:
                result: BaseException | list[int] = gc.submit(Entry(f"j{i}", (b"x",), b"s"))
            except BaseException as exc:
                result = exc
            with lock:
                outcomes.append(result)

        # Hold the journal's turn while everyone submits: the writer thread stalls
        # on its first batch and the other submissions queue up for one more batch.
        with j._shared.turn:
            threads = [threading.Thread(target=worker, args=(i,)) for i in range(callers)]
            for thread in threads:
                thread.start()
            submitting.wait()
            time.sleep(0.2)
        for thread in threads:
            thread.join()
        gc.close()
        assert len(outcomes) == callers
        assert all(isinstance(o, FencedError) for o in outcomes), outcomes
        assert len({id(o) for o in outcomes}) < callers  # shared by a batch's callers
        assert gc.transactions < callers
        assert gc.entries == 0
        assert newer.last_seq == 0


def test_group_commit_a_failed_batch_fails_every_entry_queued_after_it(jdir: Path) -> None:
    """Entries queued behind a batch whose write failed may rest on it (their
    submitters decided them on a state that included it): they fail with the same
    error, and so does every later submission; nothing more is written."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        entered, go_on = threading.Event(), threading.Event()
        failure = JournalError("mdb_txn_commit: No space left on device")

        class FailsOnce:
            path = j.path
            calls = 0

            def commit(self, entries: list[Entry]) -> list[int]:
                self.calls += 1
                if self.calls == 1:
                    entered.set()
                    go_on.wait(10)
                    raise failure
                return j.commit(entries)

        gc = GroupCommitter(FailsOnce())  # type: ignore[arg-type]
        first = gc.enqueue(Entry("a", (b"1",), b"s"))
        assert entered.wait(10)  # the writer is inside the first batch's write
        queued = [gc.enqueue(Entry(f"b{i}", (b"2",), b"s")) for i in range(3)]
        go_on.set()
        for ticket in [first, *queued]:
            with pytest.raises(JournalError) as caught:
                ticket.wait()
            assert caught.value is failure
        with pytest.raises(JournalError) as caught:
            gc.submit(Entry("c", (b"3",), b"s"))
        assert caught.value is failure
        gc.close()
        assert j.last_seq == 0


def _writers(j: Journal) -> tuple[GroupCommitter, list[bool]]:
    """A committer whose transactions record whether the main thread wrote them."""
    written_here: list[bool] = []

    def observe(seconds: float, entries: int) -> None:
        written_here.append(threading.current_thread() is threading.main_thread())

    return GroupCommitter(j, observe=observe), written_here


def test_group_commit_a_lone_submit_is_written_by_its_own_thread(jdir: Path) -> None:
    """No concurrency: each submit writes its own transaction in the caller's thread
    (no hand-off to the writer thread and back)."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        gc, written_here = _writers(j)
        seqs = [gc.submit(Entry(f"j{i}", (b"f%d" % i,), b"s")) for i in range(5)]
        gc.close()
        assert seqs == [[1], [2], [3], [4], [5]]
        assert written_here == [True] * 5
        assert [payload for _, _, payload in j.facts()] == [b"f%d" % i for i in range(5)]


def test_group_commit_after_a_shared_batch_the_writer_thread_writes(jdir: Path) -> None:
    """Once a batch was shared (concurrency seen), the next entry goes to the writer
    thread, which batches; after a lone batch, callers write their own again."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        gc, written_here = _writers(j)
        # Hold the journal's turn: the writer thread stalls inside the first entry's
        # write while two more queue up, so that they are written as one batch.
        with j._shared.turn:
            first = gc.enqueue(Entry("a", (b"1",), b"s"))
            deadline = time.monotonic() + 10
            while gc.transactions == 0 and time.monotonic() < deadline:
                time.sleep(0.001)  # the writer thread took the first entry
            queued = [gc.enqueue(Entry(f"b{i}", (b"2",), b"s")) for i in range(2)]
        assert first.wait() == [1]
        assert [t.wait() for t in queued] == [[2], [3]]
        assert gc.submit(Entry("c", (b"3",), b"s")) == [4]  # after a batch of two
        assert gc.submit(Entry("d", (b"4",), b"s")) == [5]  # after a batch of one
        gc.close()
        assert gc.transactions == 4
        assert written_here == [False, False, False, True]


def test_group_commit_an_entry_promised_a_wait_is_written_without_one(jdir: Path) -> None:
    """``will_wait`` leaves a lone entry to its caller; an entry whose ticket is never
    waited on still goes with the next batch, or at close."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        gc = GroupCommitter(j)
        unwaited = gc.enqueue(Entry("a", (b"1",), b"s"), will_wait=True)
        assert gc.submit(Entry("b", (b"2",), b"s")) == [2]  # writes both, in order
        assert unwaited.done and unwaited.wait() == [1]
        last = gc.enqueue(Entry("c", (b"3",), b"s"), will_wait=True)
        gc.close()  # drains the queue
        assert last.done and last.wait() == [3]
        assert [payload for _, _, payload in j.facts()] == [b"1", b"2", b"3"]


def test_group_commit_a_caller_whose_own_write_fails(jdir: Path) -> None:
    """A write the caller made itself fails as the writer thread's would: the caller
    gets the error, so does every later submission, nothing more is written, and
    closing does not hang."""
    with Journal.open(jdir, sync=False) as j:
        j.start()
        failure = JournalError("mdb_txn_commit: No space left on device")

        tried_here: list[bool] = []

        class Fails:
            path = j.path

            def commit(self, entries: list[Entry]) -> list[int]:
                tried_here.append(threading.current_thread() is threading.main_thread())
                raise failure

        gc, written_here = _writers(Fails())  # type: ignore[arg-type]
        with pytest.raises(JournalError) as caught:
            gc.submit(Entry("a", (b"1",), b"s"))
        assert caught.value is failure
        with pytest.raises(JournalError) as caught:
            gc.submit(Entry("b", (b"2",), b"s"))
        assert caught.value is failure
        gc.close()
        assert gc.transactions == 1 and gc.entries == 0
        assert tried_here == [True]  # the caller's own write, tried once
        assert written_here == []  # no transaction committed
        assert j.last_seq == 0


@pytest.mark.parametrize("seed", range(3))
def test_group_commit_mixed_waiters_write_everything_once_in_queue_order(
    jdir: Path, seed: int
) -> None:
    """Threads mixing ``submit``, a promised wait, a later wait and a promised wait that
    never comes: whoever writes each batch (a caller or the writer thread), every entry
    is written exactly once, each thread's entries in the order it queued them, and
    every ticket is done after ``close``."""
    threads_n, ops = 8, 30
    with Journal.open(jdir, sync=False) as j:
        j.start()
        pause = random.Random(seed)
        counting = threading.Lock()

        class Slow:
            """The journal, with a short pause (the GIL released) in every write, so
            that a second writer would overlap: none may."""

            path = j.path
            writing = overlaps = 0

            def commit(self, entries: list[Entry]) -> list[int]:
                with counting:
                    self.writing += 1
                    self.overlaps += self.writing > 1
                time.sleep(pause.random() * 0.002)
                try:
                    return j.commit(entries)
                finally:
                    with counting:
                        self.writing -= 1

        slow = Slow()
        gc = GroupCommitter(slow, max_batch=4)  # type: ignore[arg-type]
        tickets: list[Ticket] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(threads_n)

        def worker(t: int) -> None:
            rng = random.Random(seed * 100 + t)
            later = []
            try:
                barrier.wait()
                for i in range(ops):
                    entry = Entry(f"t{t}", (b"%d-%d" % (t, i),), b"%d" % i)
                    mode = rng.randrange(4)
                    if mode == 0:
                        gc.submit(entry)
                    elif mode == 1:
                        gc.enqueue(entry, will_wait=True).wait()
                    elif mode == 2:
                        later.append(gc.enqueue(entry))
                    else:
                        tickets.append(gc.enqueue(entry, will_wait=True))  # never waited
                for ticket in later:
                    ticket.wait()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        _run_threads(worker, threads_n)
        gc.close()
        assert not errors
        assert slow.overlaps == 0
        assert all(t.done for t in tickets)
        assert gc.entries == threads_n * ops
        rows = list(j.facts())
        assert [seq for seq, _, _ in rows] == list(range(1, threads_n * ops + 1))
        for t in range(threads_n):
            mine = [payload for _, job, payload in rows if job == f"t{t}"]
            assert mine == [b"%d-%d" % (t, i) for i in range(ops)]
            assert _state(j, f"t{t}") == b"%d" % (ops - 1)


def test_group_commit_close(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        gc = GroupCommitter(j, max_batch=2)
        assert gc.submit(Entry("a", (b"x", b"y"), b"s")) == [1, 2]
        gc.close()
        gc.close()
        with pytest.raises(JournalError, match="closed"):
            gc.submit(Entry("a", (b"z",), b"s"))
        with pytest.raises(TypeError):
            GroupCommitter(j).submit("not an entry")  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            GroupCommitter(j, max_batch=0)


# --------------------------------------------------------------------------- tools


def test_verify_good_journal(jdir: Path) -> None:
    make_journal(jdir, jobs=50)
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("job1", (b"end",), b"done", ended_at=5.0)])
    report = verify(jdir)
    assert report.ok, report.problems
    assert (report.facts, report.live, report.done) == (101, 49, 1)
    assert (report.epoch, report.last_seq) == (2, 101)


def test_verify_reports_damage_without_raising(jdir: Path) -> None:
    make_journal(jdir, jobs=10)
    flip_byte(jdir, b"facts", (3).to_bytes(8, "big"), offset=40)  # bad CRC
    flip_byte(jdir, b"jobs", b"job7", offset=5)
    env = raw_env(jdir)
    dbs = {name: env.open_db(name, create=False) for name in (b"facts", b"index", b"done")}
    with env.begin(write=True) as txn:
        txn.delete((5).to_bytes(8, "big"), db=dbs[b"facts"])  # fact lost, index row dangles
        txn.delete(b"job4\0" + (9).to_bytes(8, "big"), db=dbs[b"index"])  # fact without index
        txn.put(b"job9\0" + (1).to_bytes(8, "big"), b"", db=dbs[b"index"])  # wrong owner
        txn.put(b"job8", seal(b"\0" * 8 + b"x"), db=dbs[b"done"])  # both live and done
    env.close()
    report = verify(jdir)
    assert not report.ok
    text = "\n".join(report.problems)
    assert "fact 3: CRC mismatch" in text
    assert "job 'job2' lists fact 5, which does not exist" in text
    assert "fact 9: job 'job4' has no index row" in text
    assert "job 'job9' lists fact 1, which belongs to 'job0'" in text
    assert "job 'job8' is both live and done" in text
    assert "live state of job 'job7'" in text
    assert "19 kept + 0 compacted != last_seq 20; missing: 5" in text
    assert (report.facts, report.live, report.done, report.last_seq) == (19, 10, 1, 20)


def test_verify_reports_page_damage(jdir: Path) -> None:
    marker = b"MARKER-7f3a" * 8
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry(f"job{i}", (os.urandom(200),), b"s") for i in range(200)])
        j.commit([Entry("marked", (marker,), b"s")])
    path = jdir / "data.mdb"
    content = path.read_bytes()
    assert content.count(marker) == 1
    page = content.index(marker) // 4096
    with path.open("r+b") as f:  # scribble over the header of the leaf page holding it
        f.seek(page * 4096)
        f.write(b"\xff" * 16)
    report = verify(jdir)
    assert not report.ok
    assert report.problems[0].startswith("structure:")


def test_verify_raises_only_when_unopenable(tmp_path: Path) -> None:
    with pytest.raises(JournalError):
        verify(tmp_path / "missing")
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "data.mdb").write_bytes(os.urandom(20_000))
    with pytest.raises(JournalError) as err:
        verify(garbage)
    assert str(garbage / "data.mdb") in str(err.value)


def test_export_writes_json_lines(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit(
            [
                Entry("a", (json.dumps({"type": "grow", "add": 4}).encode(), b"\xff\x00"), b"s"),
                Entry("b", (b"NaN", "é".encode(), b'"text"'), b"s"),
            ]
        )
    out = io.StringIO()
    assert export(jdir, out) == 5
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines == [
        {"seq": 1, "job": "a", "fact": {"type": "grow", "add": 4}},
        {"seq": 2, "job": "a", "fact": {"hex": "ff00"}},
        {"seq": 3, "job": "b", "fact": {"hex": b"NaN".hex()}},
        {"seq": 4, "job": "b", "fact": {"hex": "é".encode().hex()}},
        {"seq": 5, "job": "b", "fact": "text"},
    ]


def test_compact_removes_only_old_finished_jobs(jdir: Path) -> None:
    now = 1_700_000_000.0
    with Journal.open(jdir, sync=False) as j:
        j.start()
        j.commit([Entry("live", (b"l1",), b"s"), Entry("old", (b"o1", b"o2"), b"s")])
        j.commit([Entry("recent", (b"r1",), b"s"), Entry("old", (b"o3",), b"s")])
        j.commit([Entry("old", (b"o4",), b"end", ended_at=now - 30 * DAY)])
        j.commit([Entry("recent", (b"r2",), b"end", ended_at=now - 1 * DAY)])
        j.commit([Entry("live", (b"l2",), b"s2")])
    assert compact(jdir, keep_days=7, now=now) == 4
    with Journal.open(jdir, readonly=True) as j:
        assert [(job, p) for _, job, p in j.facts()] == [
            ("live", b"l1"),
            ("recent", b"r1"),
            ("recent", b"r2"),
            ("live", b"l2"),
        ]
        assert list(j.job_facts("old")) == []
        assert _state(j, "old") == b"end"  # the final state (the accounting) is kept
        assert _state(j, "recent") == b"end"
        assert _live(j) == {"live": b"s2"}
        stats = j.stats()
        assert (stats["index"], stats["done"], stats["removed"], stats["last_seq"]) == (4, 2, 4, 8)
    report = verify(jdir)
    assert report.ok, report.problems
    assert compact(jdir, keep_days=7, now=now) == 0
    assert compact(jdir, keep_days=0, now=now) == 2
    assert verify(jdir).ok
    # Sequence numbers are never reused after compaction.
    with Journal.open(jdir, sync=False) as j:
        j.start()
        assert j.commit([Entry("new", (b"n",), b"s")]) == [9]


def test_compact_needs_an_existing_journal(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="does not exist"):
        compact(tmp_path / "none", keep_days=1, now=0)
    assert not (tmp_path / "none").exists()


# --------------------------------------------------------------------------- property


job_ids = st.sampled_from(["1", "10", "1\x01", "a b", "é"]) | st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=6
)
entries = st.builds(
    Entry,
    job_id=job_ids,
    facts=st.lists(st.binary(max_size=80), max_size=4).map(tuple),
    state=st.binary(max_size=40),
    ended_at=st.none() | st.floats(0, 2e9),
)


@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(entries, max_size=6), max_size=8))
def test_property_reads_return_what_was_committed(commits: list[list[Entry]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Journal.open(tmp, sync=False, map_size=1 << 16) as j:
        j.start()
        committed: list[tuple[str, bytes]] = []
        last: dict[str, Entry] = {}
        for batch in commits:
            seqs = j.commit(batch)
            assert seqs == list(range(len(committed) + 1, len(committed) + len(seqs) + 1))
            for entry in batch:
                committed.extend((entry.job_id, fact) for fact in entry.facts)
                last[entry.job_id] = entry
        assert list(j.facts()) == [(i + 1, job, p) for i, (job, p) in enumerate(committed)]
        for job_id, entry in last.items():
            expected = [(i + 1, p) for i, (job, p) in enumerate(committed) if job == job_id]
            assert list(j.job_facts(job_id)) == expected
            assert _state(j, job_id) == entry.state
            assert j.ended_at(job_id) == entry.ended_at
        assert _live(j) == {job_id: e.state for job_id, e in last.items() if e.ended_at is None}
        assert j.last_seq == len(committed)


# --------------------------------------------------------------------------- history


def test_history_tails_patch_the_end_of_each_sequence(journal: Journal) -> None:
    journal.commit([Entry("a", (b"f1",), b"s1", history=(Tail("charges", 0, (b"c0",), 0),))])
    journal.commit(
        [
            Entry(
                "a",
                (b"f2",),
                b"s2",
                history=(
                    Tail("charges", 1, (b"c1", b"c2"), 1),
                    Tail("records", 0, (b"r0",), 0),
                ),
            )
        ]
    )
    # The last charge step is replaced and nothing follows it: row 2 goes.
    journal.commit([Entry("a", (b"f3",), b"s3", history=(Tail("charges", 1, (b"c1'",), 3),))])
    assert journal.state("a") == StoredState(b"s3", (b"r0",), (b"c0", b"c1'"))
    assert dict(journal.live_states()) == {"a": StoredState(b"s3", (b"r0",), (b"c0", b"c1'"))}
    # The history stays with the finished job's state (its accounting).
    journal.commit([Entry("a", (b"end",), b"s4", ended_at=9.0)])
    assert journal.state("a") == StoredState(b"s4", (b"r0",), (b"c0", b"c1'"))
    assert dict(journal.live_states()) == {}
    assert journal.stats()["history"] == 3
    assert verify(journal.path.parent).ok


_HISTORIES = st.dictionaries(
    # Ids that are prefixes of each other, so one job's history keys sort among another's.
    st.sampled_from(["a", "ab", "a b", "b", "a\x7f", "\u00e9"]),
    st.tuples(
        st.lists(st.binary(max_size=3), max_size=4), st.lists(st.binary(max_size=3), max_size=4)
    ),
    max_size=6,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(histories=_HISTORIES)
def test_every_job_reads_back_its_own_history(
    histories: dict[str, tuple[list[bytes], list[bytes]]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp, Journal.open(tmp, sync=False) as j:
        j.start()
        for job, (records, charges) in histories.items():
            tails = (Tail("records", 0, tuple(records), 0), Tail("charges", 0, tuple(charges), 0))
            j.commit([Entry(job, (b"f",), b"s" + job.encode(), history=tails)])
        expected = {
            job: StoredState(b"s" + job.encode(), tuple(records), tuple(charges))
            for job, (records, charges) in histories.items()
        }
        assert dict(j.live_states()) == expected
        for job, stored in expected.items():
            assert j.state(job) == stored


def test_bad_tails_are_refused_before_anything_is_written() -> None:
    with pytest.raises(ValueError, match="unknown history sequence"):
        Tail("notes", 0, (), 0)
    with pytest.raises(ValueError, match="start <= stop"):
        Tail("charges", 3, (), 1)
    with pytest.raises(TypeError, match="Tail objects"):
        Entry("a", (), b"s", history=("charges",))  # type: ignore[arg-type]


def _with_history(jdir: Path) -> None:
    with Journal.open(jdir, sync=False) as j:
        j.start()
        for job in ("a", "b"):
            tails = (Tail("charges", 0, (b"c0", b"c1", b"c2"), 0), Tail("records", 0, (b"r0",), 0))
            j.commit([Entry(job, (b"f",), b"s", history=tails)])


def test_damaged_history_is_found_by_recovery_and_verify(jdir: Path) -> None:
    _with_history(jdir)
    env = raw_env(jdir)
    history = env.open_db(b"history", create=False)
    with env.begin(write=True) as txn:
        txn.delete(b"a\0c" + (1).to_bytes(8, "big"), db=history)  # a gap
        stored = txn.get(b"b\0r" + (0).to_bytes(8, "big"), db=history)
        assert stored is not None, "the history row to damage was not written"
        value = bytearray(stored)
        value[-1] ^= 0xFF
        txn.put(b"b\0r" + (0).to_bytes(8, "big"), bytes(value), db=history)  # bit rot
        txn.put(b"zz\0c" + (0).to_bytes(8, "big"), seal(b"x"), db=history)  # no state
        txn.put(b"a\0q" + (0).to_bytes(8, "big"), seal(b"x"), db=history)  # unknown tag
    env.close()
    with Journal.open(jdir, readonly=True) as j:
        with pytest.raises(JournalError, match="charges 1 of job 'a' is missing") as err:
            j.state("a")
        assert data_file(jdir) in str(err.value)
        with pytest.raises(JournalError, match="records 0 of job 'b': CRC mismatch"):
            j.state("b")
        with pytest.raises(JournalError, match="job 'a' is missing"):
            list(j.live_states())  # recovery stops at the first damaged job
    text = "\n".join(verify(jdir).problems)
    assert "history: charges of job 'a': row 2 where 1 was due" in text
    assert "history: records 0 of job 'b': CRC mismatch" in text
    assert "history: job 'zz' has charges but no state" in text
    assert "names no known sequence" in text


def test_schema_1_journal_is_refused_naming_the_way_out(jdir: Path) -> None:
    make_journal(jdir, jobs=2)
    env = raw_env(jdir)
    meta = env.open_db(b"meta", create=False)
    with env.begin(write=True) as txn:
        txn.put(b"schema", (1).to_bytes(8, "big"), db=meta)
    env.close()
    for readonly in (False, True):
        with pytest.raises(JournalError, match=r"schema 1.*journal export") as err:
            Journal.open(jdir, readonly=readonly)
        assert data_file(jdir) in str(err.value)


def stored_schema(jdir: Path) -> int:
    """The schema number in the journal's meta, read directly."""
    env = raw_env(jdir)
    meta = env.open_db(b"meta", create=False)
    with env.begin() as txn:
        raw = txn.get(b"schema", db=meta)
    env.close()
    assert raw is not None
    return int.from_bytes(raw, "big")


@pytest.mark.parametrize("old", [2, 3, 4])
def test_an_older_schema_journal_is_read_and_upgraded_when_written(jdir: Path, old: int) -> None:
    """A journal of schema 2 (before the facts of several tasks), 3 (before long
    allocations written as their first id and hosts) or 4 (before runs of numbered
    hosts in those) is read as it is, and marked as
    of this schema when opened for writing, before anything new is written: a version
    that reads only the old schema then refuses it as newer. Nothing is lost."""
    make_journal(jdir, jobs=3)
    with Journal.open(jdir, readonly=True) as j:
        before = list(j.facts())
    env = raw_env(jdir)
    meta = env.open_db(b"meta", create=False)
    with env.begin(write=True) as txn:
        txn.put(b"schema", old.to_bytes(8, "big"), db=meta)
    env.close()

    with Journal.open(jdir, readonly=True) as j:  # read, not changed
        assert list(j.facts()) == before
    assert stored_schema(jdir) == old
    with Journal.open(jdir) as j:
        assert list(j.facts()) == before
    assert stored_schema(jdir) == SCHEMA == 5
    assert verify(jdir).ok


@pytest.mark.parametrize("schema", [0, 1, 6])
def test_a_schema_it_does_not_read_is_refused_by_name(jdir: Path, schema: int) -> None:
    make_journal(jdir, jobs=1)
    env = raw_env(jdir)
    meta = env.open_db(b"meta", create=False)
    with env.begin(write=True) as txn:
        txn.put(b"schema", schema.to_bytes(8, "big"), db=meta)
    env.close()
    with pytest.raises(JournalError, match=f"schema {schema}|newer") as err:
        Journal.open(jdir)
    assert data_file(jdir) in str(err.value)
    assert stored_schema(jdir) == schema  # refused before anything was written
