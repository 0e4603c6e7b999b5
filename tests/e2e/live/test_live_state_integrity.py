"""The live controller refuses a damaged state directory at start, with real processes
and real LMDB files (docs/live-controller.md, "Checks at start"): exit status 1 and one
line naming the file, nothing changed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import lmdb

from tests.e2e.live.startup import refused_start, resized_job, stop_cleanly
from xce_resize_plugin.testing.live import LiveCluster


def _state_with_a_resized_job(factory: Any) -> tuple[LiveCluster, str]:
    """A stopped controller whose state holds a running job grown once (so both the
    controller's store and the plugin's journal hold it)."""
    live, job_id = resized_job(factory)
    stop_cleanly(live)
    return live, job_id


def _used_bytes(data_file: Path) -> int:
    env = lmdb.open(str(data_file.parent), readonly=True, lock=False)
    try:
        return int((env.info()["last_pgno"] + 1) * env.stat()["psize"])
    finally:
        env.close()


def test_truncated_controller_store_is_refused(resize_live_factory: Any) -> None:
    """Issue #13 §5: LMDB maps the file, and a page past its end killed the controller
    with SIGBUS and no message."""
    live, _ = _state_with_a_resized_job(resize_live_factory)
    data = live.state / "controller" / "data.mdb"
    os.truncate(data, _used_bytes(data) // 2)
    size = data.stat().st_size
    line = refused_start(live)
    assert line.startswith(f"xce-resize controller: {data}: truncated: {size} bytes on disk")
    assert data.stat().st_size == size


def test_empty_controller_store_is_refused(resize_live_factory: Any) -> None:
    """An empty data file would silently become a new, empty state: every job lost."""
    live, _ = _state_with_a_resized_job(resize_live_factory)
    data = live.state / "controller" / "data.mdb"
    os.truncate(data, 0)
    line = refused_start(live)
    assert line.startswith(f"xce-resize controller: {data}: the file is empty")
    assert data.stat().st_size == 0


def test_truncated_journal_is_refused_with_the_documented_status(resize_live_factory: Any) -> None:
    """The journal's own truncation check exited 2 ("bad usage") where the controller's
    documentation says 1 (error); and it stops the start before anything is touched."""
    live, _ = _state_with_a_resized_job(resize_live_factory)
    journal = live.state / "resize" / "data.mdb"
    store = live.state / "controller" / "data.mdb"
    os.truncate(journal, _used_bytes(journal) // 2)
    before = store.read_bytes()
    line = refused_start(live)
    assert line.startswith(f"xce-resize controller: Journal error: {journal}: truncated: ")
    assert store.read_bytes() == before  # not even a new epoch


def _rewrite(env_dir: Path, db: bytes, key: bytes, change: Any) -> None:
    """Rewrite one value through LMDB, as a stray tool would: ``change(old) -> new``."""
    env = lmdb.open(str(env_dir), max_dbs=8)
    try:
        handle = env.open_db(db, create=False)
        with env.begin(write=True) as txn:
            old = txn.get(key, db=handle)
            assert old is not None, (db, key)
            txn.put(key, change(old), db=handle)
    finally:
        env.close()


def test_edited_job_owner_in_the_store_is_refused(resize_live_factory: Any) -> None:
    """Issue #13 §6: a same-length edit of the raw file changed a job's owner silently."""
    live, job_id = _state_with_a_resized_job(resize_live_factory)
    data = live.state / "controller" / "data.mdb"
    raw = data.read_bytes()
    assert b'"user":"alice"' in raw
    data.write_bytes(raw.replace(b'"user":"alice"', b'"user":"mallo"'))
    line = refused_start(live)
    assert line.startswith(f"xce-resize controller: {data}: job record '{job_id}': CRC mismatch")
    assert "edited outside the controller" in line


def test_value_rewritten_through_lmdb_is_refused(resize_live_factory: Any) -> None:
    """The same edit made through LMDB (the pages are sound, only the record changed)."""
    live, job_id = _state_with_a_resized_job(resize_live_factory)
    _rewrite(
        live.state / "controller",
        b"jobs",
        job_id.encode(),
        lambda old: old.replace(b'"user":"alice"', b'"user":"mallo"'),
    )
    line = refused_start(live)
    data = live.state / "controller" / "data.mdb"
    assert line.startswith(f"xce-resize controller: {data}: job record '{job_id}': CRC mismatch")


def test_journal_fact_with_a_bad_crc_is_refused_at_start(resize_live_factory: Any) -> None:
    """Issue #13 §6: `journal verify` found a damaged fact, the controller did not look
    (it would have served it later); the store is left as it was."""
    live, _ = _state_with_a_resized_job(resize_live_factory)
    flip = lambda old: old[:-1] + bytes([old[-1] ^ 0x01])  # noqa: E731
    _rewrite(live.state / "resize", b"facts", (1).to_bytes(8, "big"), flip)
    store = live.state / "controller" / "data.mdb"
    before = store.read_bytes()
    line = refused_start(live)
    journal = live.state / "resize" / "data.mdb"
    assert line.startswith(f"xce-resize controller: Journal error: {journal}: damaged: fact 1: ")
    assert "CRC mismatch" in line
    assert store.read_bytes() == before
    # Turned off, the check is skipped: the controller starts (and serves nothing of
    # the damaged fact at start: it reads only live states).
    text = live.config.read_text()
    live.config.write_text(text.replace("[controller]\n", "[controller]\nverify_journal = false\n"))
    live.start()
    stop_cleanly(live)


def _swap(live: LiveCluster, name: str, replacement: Path) -> Path:
    """Put ``replacement`` in place of the state's ``name`` directory; the current one
    is kept aside (returned) to be put back."""
    current = live.tmp / f"{name}-current"
    (live.state / name).rename(current)
    shutil.copytree(replacement, live.state / name)
    return current


def _put_back(live: LiveCluster, name: str, kept: Path) -> None:
    shutil.rmtree(live.state / name)
    kept.rename(live.state / name)


def test_store_and_journal_of_different_moments_are_refused(resize_live_factory: Any) -> None:
    """A store or a journal restored from an older backup without the other: the start
    refuses it, naming both files, instead of running jobs the journal has forgotten or
    resizing jobs the store does not know."""
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    stop_cleanly(live)
    shutil.copytree(live.state / "controller", live.tmp / "store-without-jobs")
    live.start()
    job_id = live.submit(tasks="1,3", alloc={"h1": 1}, resizable=True)
    live.running(job_id, 1)
    stop_cleanly(live)
    shutil.copytree(live.state / "resize", live.tmp / "journal-before-the-grow")
    live.start()
    assert live.grow(job_id, 1).status_code == 202
    live.idle(job_id, 1)
    stop_cleanly(live)
    store = live.state / "controller" / "data.mdb"
    journal = live.state / "resize" / "data.mdb"

    kept = _swap(live, "resize", live.tmp / "journal-before-the-grow")
    line = refused_start(live)
    assert line == (
        f"xce-resize controller: {store}: job {job_id}: resized to version 1, but the journal "
        f"{journal} knows nothing of it: the two were not written by one controller (one "
        "restored without the other?): restore both from one backup"
    )
    _put_back(live, "resize", kept)

    kept = _swap(live, "controller", live.tmp / "store-without-jobs")
    line = refused_start(live)
    assert line.startswith(
        f"xce-resize controller: {store}: job {job_id}: unknown to the controller's store, but "
        f"live in the journal {journal}: "
    )
    _put_back(live, "controller", kept)

    live.start()  # both put back: the job carries on
    live.running(job_id, 2)
    live.check_consistent(job_id)


def test_a_lost_journal_is_refused_not_started_again_empty(resize_live_factory: Any) -> None:
    """The journal's files gone (a wrong clean-up, a disk swapped): a new empty journal
    was made, and the job's resize history and version started again from nothing."""
    live, job_id = _state_with_a_resized_job(resize_live_factory)
    journal = live.state / "resize"
    aside = live.tmp / "journal-aside"
    journal.rename(aside)
    journal.mkdir(mode=0o700)
    store = live.state / "controller" / "data.mdb"
    line = refused_start(live)
    assert line == (
        f"xce-resize controller: {store}: job {job_id}: resized to version 1, but there is "
        f"no journal at {journal.absolute() / 'data.mdb'}: the two were not written by one "
        "controller (one restored without the other?): restore both from one backup"
    )
    assert not (journal / "data.mdb").exists()  # nothing was made
    shutil.rmtree(journal)
    aside.rename(journal)
    live.start()
    live.running(job_id, 2)


def test_a_lost_store_is_refused_before_it_gives_the_journals_job_ids_again(
    resize_live_factory: Any,
) -> None:
    """The controller's store gone while the journal holds a finished job: the new
    store gave job id 101 again, and the new job 101 took over the old one's history
    (the journal then failed its own verify)."""
    live, job_id = resized_job(resize_live_factory)
    assert live.call("DELETE", f"/v1/jobs/{job_id}").status_code == 202
    stop_cleanly(live)
    shutil.rmtree(live.state / "controller")
    line = refused_start(live)
    assert line == (
        f"xce-resize controller: {live.state / 'controller' / 'data.mdb'}: gives job id 101 "
        f"next, but the journal {live.state.absolute() / 'resize' / 'data.mdb'} already "
        f"holds job {job_id}: the two were not written by one controller (one restored "
        "without the other?): restore both from one backup"
    )
