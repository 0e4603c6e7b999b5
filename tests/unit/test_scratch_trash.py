"""Ended jobs' scratch directories: moved aside at once, removed in a thread of their
own (controllers/live/scratch_trash.py), and swept at a controller's start."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live import scratch_trash
from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.controllers.live.scratch_trash import (
    TRASH_PREFIX,
    TrashRemover,
    discard_scratch,
)
from xce_resize_plugin.controllers.live.task_env import Budget, make_scratch
from xce_resize_plugin.testing.live import wait_until


def _scratch(job_dir: Path, deep: int = 50) -> None:
    here = job_dir / "scratch"
    for _ in range(deep):
        here = here / "d"
    here.mkdir(parents=True)
    (here / "f").write_text("x")
    (job_dir / "scratch" / "outside").symlink_to(job_dir.parent / "keep")


def test_a_scratch_is_moved_aside_at_once_and_removed_by_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller (the controller, its lock held) only renames; the removal, held back
    here until released, happens in the remover's thread, and follows no link."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("y")
    job_dir = tmp_path / "7"
    _scratch(job_dir)
    release, removing = threading.Event(), []
    real = scratch_trash.remove_tree

    def held_back(path: Path, budget: Budget | None = None) -> bool:
        removing.append(path)
        release.wait(30)
        return real(path, budget)

    monkeypatch.setattr(scratch_trash, "remove_tree", held_back)
    remover = TrashRemover()
    trash = discard_scratch(job_dir)
    assert trash is not None and trash.name.startswith(TRASH_PREFIX)
    assert not (job_dir / "scratch").exists() and trash.is_dir()
    remover.put(trash)  # returns while the removal waits
    wait_until(lambda: removing == [trash], 10, "the removal began")
    assert trash.is_dir()
    release.set()
    wait_until(lambda: not trash.exists(), 10, "the moved scratch removed")
    assert (keep / "precious").read_text() == "y"
    assert discard_scratch(job_dir) is None  # none left to move


def test_what_an_earlier_controller_left_is_swept(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for job in ("1", "2"):
        left = jobs / job / f"{TRASH_PREFIX}abc"
        left.mkdir(parents=True)
        (left / "f").write_text("x")
    (jobs / "2" / "task-0.out").write_text("log")
    TrashRemover().sweep(jobs)
    wait_until(lambda: not any(jobs.glob(f"*/{TRASH_PREFIX}*")), 10, "the sweep")
    assert (jobs / "2" / "task-0.out").read_text() == "log"


#: A process of the job's owner inside its scratch ``tmp`` (started there), making
#: directories and going down into one of them, for ever: the tree under removal keeps
#: growing. If its directory is removed under it, it starts again at the top of the
#: tree (a descriptor it holds follows the tree's renames). It keeps ``LEAD`` levels
#: ahead of the removal, no more (the directory that many levels up still has a link),
#: so that the tree stays small enough to go in a second once it stops.
GROWER = """
import os, time
top = os.open("..", os.O_RDONLY | os.O_DIRECTORY)
chain = []
n = 0
while True:
    if len(chain) >= LEAD:
        if os.fstat(chain[0]).st_nlink:
            time.sleep(0.001)
            continue
        os.close(chain.pop(0))
    try:
        for k in range(8):
            os.mkdir(str(k))
        os.chdir("0")
        chain.append(os.open(".", os.O_RDONLY | os.O_DIRECTORY))
    except OSError:
        n += 1
        try:
            os.fchdir(top)
            os.mkdir("g%d" % n)
            os.chdir("g%d" % n)
        except OSError:
            time.sleep(0.01)
"""


def _account() -> Account:
    if os.geteuid() == 0:
        return Account("nobody", 65534, 65534, (65534,), "/nonexistent")
    name = pwd.getpwuid(os.geteuid()).pw_name
    return Account(name, os.geteuid(), os.getegid(), (os.getegid(),), "/")


def _trash_of(jobs: Path, job: str, account: Account) -> Path:
    job_dir = jobs / job
    job_dir.mkdir(mode=0o711)
    make_scratch(job_dir, account, as_root=os.geteuid() == 0)
    return job_dir / "scratch"


def _grower(scratch: Path, account: Account) -> subprocess.Popen[bytes]:
    run_as = {"user": account.uid, "group": account.gid, "extra_groups": []}
    # This interpreter may be in root's home, which another user cannot reach.
    python = sys.executable if os.geteuid() != 0 else shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no python3 in /usr/bin or /bin for another user")
    return subprocess.Popen(
        [python, "-I", "-S", "-c", GROWER.replace("LEAD", "50")],
        cwd=scratch / "tmp",
        stdin=subprocess.DEVNULL,
        **(run_as if os.geteuid() == 0 else {}),
    )


def test_a_tree_kept_growing_holds_back_no_other_removal_and_no_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review 29b, finding 4: a process of job A's owner keeps making directories
    inside A's scratch while it is removed. Job B's scratch, queued after A's, goes
    within seconds all the same (A goes back to the end of the queue after each turn);
    the remover's memory does not grow with A (what is left is found again on disk,
    not listed in memory); A is logged once as kept growing; once the process stops, A
    goes too."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o711)
    account = _account()
    scratch_a = _trash_of(jobs, "A", account)
    scratch_b = _trash_of(jobs, "B", account)
    (scratch_b / "tmp" / "f").write_text("B's")
    grower = _grower(scratch_a, account)
    remover = TrashRemover(turn_seconds=0.5)
    tracemalloc.start()
    try:
        wait_until(lambda: (scratch_a / "tmp" / "0").exists(), 10, "the grower at work")
        caplog.set_level(logging.WARNING, scratch_trash.__name__)
        trash_a = discard_scratch(jobs / "A")
        trash_b = discard_scratch(jobs / "B")
        assert trash_a is not None and trash_b is not None
        remover.put(trash_a)
        remover.put(trash_b)
        wait_until(lambda: not trash_b.exists(), 5, "B removed while A grows")
        assert grower.poll() is None and trash_a.exists()
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        time.sleep(8)
        _, peak = tracemalloc.get_traced_memory()
        assert grower.poll() is None and trash_a.exists()
        assert peak - before < 512 * 1024, (before, peak)
    finally:
        tracemalloc.stop()
        os.kill(grower.pid, signal.SIGKILL)
        grower.wait()
    warned = [r for r in caplog.records if "keeps getting new directories" in r.message]
    assert len(warned) == 1 and "job A" in warned[0].message, caplog.text
    assert f"user {account.name}" in warned[0].message
    wait_until(lambda: not trash_a.exists(), 60, "A removed once its grower stopped")
    assert sorted(p.name for p in jobs.iterdir()) == ["A", "B"]
