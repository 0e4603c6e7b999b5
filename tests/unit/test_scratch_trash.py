"""Ended jobs' scratch directories: moved aside at once, removed in a thread of their
own (controllers/live/scratch_trash.py), and swept at a controller's start."""

from __future__ import annotations

import logging
import os
import pwd
import threading
import tracemalloc
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live import scratch_trash, task_env
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


def _tree(top: Path, chains: int, deep: int) -> None:
    """``chains`` chains of ``deep`` nested directories under ``top``, a file at each end."""
    for c in range(chains):
        end = top.joinpath(f"c{c}", *["d"] * deep)
        end.mkdir(parents=True)
        (end / "f").write_text("x")


def test_a_large_removal_holds_back_no_later_one_and_no_memory(tmp_path: Path) -> None:
    """Review 29b, finding 4: removals take turns. Job B's scratch, queued after A's
    much larger one, goes after A's first turn, not after all of A; the remover's memory
    does not grow with A (what is left is found again on disk, not listed in memory)."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o711)
    account = _account()
    scratch_a = _trash_of(jobs, "A", account)
    scratch_b = _trash_of(jobs, "B", account)
    _tree(scratch_a / "tmp", 20, 100)  # 2,000 directories
    (scratch_b / "tmp" / "f").write_text("B's")
    trash_a, trash_b = discard_scratch(jobs / "A"), discard_scratch(jobs / "B")
    assert trash_a is not None and trash_b is not None
    remover = TrashRemover(turn_seconds=60, turn_entries=50)
    tracemalloc.start()
    try:
        remover.put(trash_a)
        remover.put(trash_b)
        wait_until(lambda: not trash_b.exists(), 20, "B removed")
        assert trash_a.exists()  # 2,000 directories are 40 turns of 50: A waits its turn
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        wait_until(lambda: not trash_a.exists(), 120, "A removed")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - before < 256 * 1024, (before, peak)
    assert sorted(p.name for p in jobs.iterdir()) == ["A", "B"]


def test_a_tree_kept_growing_is_told_once_and_goes_once_it_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New directories met turn after turn (a process of the job's owner working
    inside the tree) are logged once, naming the job and its owner; the removal goes on
    in turn, and ends once nothing new comes. The owner's process is played by the
    turn itself: at the start of each turn, a few more directories appear."""
    jobs = tmp_path / "jobs"
    jobs.mkdir(mode=0o711)
    account = _account()
    _trash_of(jobs, "A", account)
    trash = discard_scratch(jobs / "A")
    assert trash is not None
    growing, made = [True], [0]
    spend = task_env.Budget.spend

    def spend_while_it_grows(budget: task_env.Budget) -> bool:
        if growing[0] and budget.entries == 5:  # a turn's first step
            made[0] += 1
            trash.joinpath(f"n{made[0]}", "d", "d").mkdir(parents=True)
        return spend(budget)

    monkeypatch.setattr(task_env.Budget, "spend", spend_while_it_grows)
    caplog.set_level(logging.WARNING, scratch_trash.__name__)
    removal = scratch_trash._Removal(trash)
    for _ in range(scratch_trash.GROWING_TURNS + 3):
        assert removal.turn(60, 5)  # more is left: it keeps growing
    warned = [r for r in caplog.records if "keeps getting new directories" in r.message]
    assert len(warned) == 1 and "job A" in warned[0].message, caplog.text
    assert f"user {account.name}" in warned[0].message
    growing[0] = False
    while removal.turn(60, 5):
        pass
    assert not trash.exists() and len(caplog.records) == 1
