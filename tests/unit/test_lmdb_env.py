"""The one LMDB helper (journal/lmdb_env.py): real LMDB files in tmp_path, no mocks."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.controllers.store import LmdbStore
from xce_resize_plugin.errors import FencedError, JournalError
from xce_resize_plugin.journal.lmdb_env import Fence, LmdbEnv

SMALL = 64 * 1024
#: A value that does not fit in a SMALL map, so that writing it needs growths.
BIG = b"x" * (512 * 1024)


class StateError(Exception):
    """A store's own error class, to show that the helper raises the one it is given."""


@pytest.fixture
def env(tmp_path: Path) -> Iterator[LmdbEnv]:
    opened = LmdbEnv.open(
        tmp_path / "env", noun="the test state", error=StateError, map_size=SMALL, max_dbs=2
    )
    yield opened
    opened.close()


def _get(env: LmdbEnv, key: bytes) -> bytes | None:
    return env.read(lambda txn: txn.get(key))


def _in_another_process(path: Path, *lines: str) -> str:
    """Run ``lines`` in a new interpreter with ``where`` = ``path``; what it printed.
    LMDB allows one handle per environment and process: a second one needs another."""
    head = ("import sys; from pathlib import Path", "where = Path(sys.argv[1])")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join((*head, *lines)), str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def test_open_creates_the_directory_with_durable_defaults(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b"
    env = LmdbEnv.open(path, noun="the test state", max_dbs=1)
    try:
        assert (path / "data.mdb").is_file()
        flags = env.env.flags()
        assert flags["sync"] and flags["metasync"]
        assert env.name == str(path / "data.mdb")
    finally:
        env.close()


def test_map_grows_and_the_whole_transaction_runs_again(env: LmdbEnv) -> None:
    calls = 0

    def put(txn: lmdb.Transaction[bytes]) -> int:
        nonlocal calls
        calls += 1
        counter = int(txn.get(b"counter") or b"0") + 1
        txn.put(b"counter", str(counter).encode())
        txn.put(b"big", BIG)
        return counter

    assert env.write(put) == 1
    assert calls > 1  # retried after growing, from a fresh transaction each time
    assert env.map_size > SMALL
    assert _get(env, b"counter") == b"1"  # the aborted attempts left nothing behind
    assert _get(env, b"big") == BIG


def test_the_number_of_growths_is_bounded(tmp_path: Path) -> None:
    env = LmdbEnv.open(
        tmp_path / "env",
        noun="the test state",
        error=StateError,
        map_size=SMALL,
        max_growths=2,
        max_dbs=0,
    )
    try:
        env.write(lambda txn: txn.put(b"before", b"1"))

        def put(txn: lmdb.Transaction[bytes]) -> None:
            txn.put(b"first", b"1")
            txn.put(b"big", BIG)

        with pytest.raises(StateError) as info:
            env.write(put)
        message = str(info.value)
        assert message.startswith(f"{tmp_path / 'env' / 'data.mdb'}: ")
        assert "growing the map 2 times" in message
        assert "nothing of it was written" in message
        # Nothing half-written: not even the rows put before the map filled up.
        assert _get(env, b"first") is None
        assert _get(env, b"big") is None
        assert _get(env, b"before") == b"1"
    finally:
        env.close()


def test_the_map_size_is_bounded(tmp_path: Path) -> None:
    env = LmdbEnv.open(
        tmp_path / "env",
        name=str(tmp_path / "env" / "data.mdb"),
        noun="the test state",
        error=StateError,
        map_size=SMALL,
        max_map_size=4 * SMALL,
        max_dbs=0,
    )
    try:
        with pytest.raises(StateError) as info:
            env.write(lambda txn: txn.put(b"big", BIG))
        message = str(info.value)
        assert message.startswith(f"{tmp_path / 'env' / 'data.mdb'}: the map is full at ")
        assert "the most it may grow to; nothing of this transaction was written" in message
        assert env.map_size == 4 * SMALL  # grown up to the bound, not beyond
        assert _get(env, b"big") is None
        env.write(lambda txn: txn.put(b"small", b"fits"))  # still usable
        assert _get(env, b"small") == b"fits"
    finally:
        env.close()


def test_fencing_between_two_handles(env: LmdbEnv) -> None:
    meta = env.open_db(b"meta")
    older = env.take_epoch(Fence(meta, subject="the test state"))
    newer = env.take_epoch(Fence(meta, subject="the test state"))
    assert (older.epoch, newer.epoch) == (1, 2)

    env.write(lambda txn: txn.put(b"k", b"newer"), newer)
    with pytest.raises(FencedError) as info:
        env.write(lambda txn: txn.put(b"k", b"older"), older)
    assert info.value.detail == (
        f"{env.name}: this controller holds epoch 1 but the test state is at epoch 2: "
        "a newer controller has started on this state directory"
    )
    assert _get(env, b"k") == b"newer"  # the stale writer wrote nothing
    env.read(lambda txn: env.check_fence(txn, newer))
    with pytest.raises(FencedError, match="epoch 2"):
        env.read(lambda txn: env.check_fence(txn, older))


def test_fencing_by_another_process(env: LmdbEnv, tmp_path: Path) -> None:
    meta = env.open_db(b"meta")
    fence = env.take_epoch(Fence(meta, subject="the journal", advice="; stop this one"))
    printed = _in_another_process(
        tmp_path / "env",
        "from xce_resize_plugin.journal.lmdb_env import Fence, LmdbEnv",
        "env = LmdbEnv.open(where, noun='the test state', max_dbs=2)",
        "print(env.take_epoch(Fence(env.open_db(b'meta'))).epoch)",
        "env.close()",
    )
    assert printed == "2"
    with pytest.raises(FencedError, match=r"at epoch 2: .*; stop this one$"):
        env.write(lambda txn: txn.put(b"k", b"v"), fence)
    assert _get(env, b"k") is None


def test_a_required_epoch_that_is_missing_is_damage(env: LmdbEnv) -> None:
    meta = env.open_db(b"meta")
    with pytest.raises(StateError, match=r": damaged: meta epoch is missing or invalid"):
        env.write(lambda txn: txn.put(b"k", b"v"), Fence(meta, epoch=1, required=True))
    assert _get(env, b"k") is None


def test_a_map_grown_by_another_process_is_adopted(env: LmdbEnv, tmp_path: Path) -> None:
    env.write(lambda txn: txn.put(b"mine", b"1"))
    _in_another_process(
        tmp_path / "env",
        "from xce_resize_plugin.journal.lmdb_env import LmdbEnv",
        f"env = LmdbEnv.open(where, noun='the test state', map_size={SMALL}, max_dbs=2)",
        f"env.write(lambda txn: txn.put(b'big', b'x' * {len(BIG)}))",
        "env.close()",
    )
    assert _get(env, b"big") == BIG
    env.write(lambda txn: txn.put(b"after", b"2"))
    assert _get(env, b"after") == b"2"


def test_open_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"not an LMDB file at all" * 512)
    with pytest.raises(StateError) as info:
        LmdbEnv.open(path, noun="the test state", error=StateError, max_dbs=1)
    assert str(info.value).startswith(f"{path / 'data.mdb'}: cannot open the test state (")
    with pytest.raises(JournalError, match=r"data.mdb: not a usable LMDB environment \("):
        LmdbEnv.open(
            path,
            name=str(path / "data.mdb"),
            noun="the journal",
            unusable="not a usable LMDB environment",
            max_dbs=1,
        )
    with pytest.raises(StateError, match=r"cannot create the directory"):
        LmdbEnv.open(path / "data.mdb", noun="the test state", error=StateError, max_dbs=1)


def test_an_environment_still_open_in_this_process(env: LmdbEnv, tmp_path: Path) -> None:
    with pytest.raises(StateError) as info:
        LmdbEnv.open(tmp_path / "env", noun="the test state", error=StateError, max_dbs=2)
    assert str(info.value) == (
        f"{tmp_path / 'env' / 'data.mdb'}: the test state is still open in this process; "
        "close() the old controller or drop every reference to it first"
    )


def test_an_environment_nobody_refers_to_is_collected_and_opened(tmp_path: Path) -> None:
    class Holder:
        def __init__(self) -> None:
            self.env = LmdbEnv.open(tmp_path / "env", noun="the test state", max_dbs=1)
            self.me = self  # a cycle: only the cycle collector frees it

    Holder()  # dropped without close(), as a simulated crash drops a controller
    again = LmdbEnv.open(tmp_path / "env", noun="the test state", max_dbs=1)
    again.close()


def test_the_controller_store_grows_its_map(tmp_path: Path) -> None:
    store = LmdbStore(tmp_path / "embedded", durable=False, map_size=SMALL)
    try:
        meta = {"clock": 1.0, "note": "x" * len(BIG)}
        store.write(meta, [])
        assert store._env.map_size > SMALL
        snapshot = store.load()
        assert snapshot is not None and snapshot.meta["note"] == meta["note"]
    finally:
        store.close()


def test_the_live_store_is_fenced_through_the_helper(tmp_path: Path) -> None:
    path = tmp_path / "controller"
    store = LiveStore(path, durable=False)
    try:
        assert store.epoch == store.stored_epoch() == 1
        _in_another_process(
            path,
            "from xce_resize_plugin.controllers.live.live_store import LiveStore",
            "LiveStore(where).close()",
        )
        assert store.stored_epoch() == 2
        store.put("job:1", {"argv": ["true"]})
        with pytest.raises(FencedError) as info:
            store.write({"clock": 2.0}, [])
        assert info.value.detail == (
            f"{path / 'data.mdb'}: this controller holds epoch 1 but the state is at epoch 2: "
            "a newer controller has started on this state directory"
        )
        with pytest.raises(FencedError):
            store.check_epoch()
    finally:
        store.close()
    again = LiveStore(path)
    try:
        assert again.epoch == 3 and again.get("job:1") is None and again.load() is None
    finally:
        again.close()
