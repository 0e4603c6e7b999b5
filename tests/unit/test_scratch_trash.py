"""Ended jobs' scratch directories: moved aside at once, removed in a thread of their
own (controllers/live/scratch_trash.py), and swept at a controller's start."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from xce_resize_plugin.controllers.live import scratch_trash
from xce_resize_plugin.controllers.live.scratch_trash import (
    TRASH_PREFIX,
    TrashRemover,
    discard_scratch,
)
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

    def held_back(path: Path) -> None:
        removing.append(path)
        release.wait(30)
        real(path)

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
