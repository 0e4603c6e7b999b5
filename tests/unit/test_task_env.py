"""The task identity variables (controllers/live/task_env.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.controllers.live.task_env import (
    SCRATCH,
    Budget,
    identity_env,
    local_task_id,
    make_scratch,
    recorded_local_ids,
    remove_tree,
    task_file,
)
from xce_resize_plugin.core.models import Task


@given(st.sets(st.integers(0, 20)))
def test_local_id_is_the_lowest_free_index(taken: set[int]) -> None:
    index = local_task_id(taken)
    assert index not in taken
    assert all(i in taken for i in range(index))


def test_local_ids_stay_unique_through_releases() -> None:
    live: dict[int, int] = {}  # task id -> local index on one host
    for tid in range(4):
        live[tid] = local_task_id(live.values())
    del live[0], live[2]  # indexes 0 and 2 free again
    live[4] = local_task_id(live.values())
    live[5] = local_task_id(live.values())
    assert live == {1: 1, 3: 3, 4: 0, 5: 2}


def test_recorded_ids_skip_what_is_not_a_launch() -> None:
    records = [
        {"launch": {"env": {"XCE_LOCAL_TASK_ID": "2"}}},
        {"launch": {"env": {"XCE_LOCAL_TASK_ID": "x"}}},
        {"launch": {"env": {}}},
        {"launch": None},
        None,
    ]
    assert recorded_local_ids(records) == [2]


def test_identity_env_and_task_file(tmp_path: Path) -> None:
    env = identity_env(Task(3, "b"), 1, ["a", "b", "b"], (2, 8), "10.0.0.1", tmp_path)
    assert env == {
        "XCE_LOCAL_TASK_ID": "1",
        "XCE_TASKS_ON_HOST": "2",
        "XCE_MIN_TASKS": "2",
        "XCE_MAX_TASKS": "8",
        "XCE_HEAD_ADDR": "10.0.0.1",
        "XCE_JOB_DIR": str(tmp_path),
        "TMPDIR": str(tmp_path / "tmp"),
    }
    assert task_file([Task(0, "a"), Task(3, "b")]) == "0 a\n3 b\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")
@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_scratch_given_to_the_owner_never_through_a_link_the_job_swapped_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: str
) -> None:
    """Run as root, the controller makes the job's scratch and ``scratch/tmp`` and gives
    them to the job's owner. ``scratch`` is the owner's by then: between the ``mkdir``
    of ``tmp`` and the change of its owner, a job's process can put a link to any file
    in its place. A change of owner by name, even one that does not follow a symbolic
    link, changes the owner of what a hard link names (a file the job may read and
    write where ``fs.protected_hardlinks`` is on; any file of the filesystem where it
    is off). Only the directory the controller made may be given."""
    account = Account("nobody", 65534, 65534, (65534,), "/nonexistent")
    victim = tmp_path / "victim"
    victim.write_text("root's")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    real_mkdir = Path.mkdir

    def racing_mkdir(self: Path, mode: int = 0o777, *args: Any, **kw: Any) -> None:
        real_mkdir(self, mode, *args, **kw)
        if self.name == "tmp":  # the job's move, made as soon as the directory exists
            self.rmdir()
            if link == "symbolic":
                self.symlink_to(victim)
            else:
                os.link(victim, self)

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    make_scratch(job_dir, account, as_root=True)
    assert victim.stat().st_uid == 0 and victim.stat().st_gid == 0
    assert (job_dir / SCRATCH).stat().st_uid == account.uid


def test_scratch_removed_however_deep_and_never_through_a_link(tmp_path: Path) -> None:
    """What the job leaves in its scratch directory goes at its end: directories nested
    deeper than Python's recursion limit (``shutil.rmtree`` raised ``RecursionError``
    through ``ignore_errors``, in the controller's cycle that ends the job), a FIFO, a
    directory nobody may read; links go, not what they name."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not the job's")
    job_dir = tmp_path / "job"
    scratch = job_dir / SCRATCH
    scratch.mkdir(parents=True)
    (scratch / "to-dir").symlink_to(outside)
    (scratch / "to-file").symlink_to(outside / "keep")
    os.link(outside / "keep", scratch / "hard")
    os.mkfifo(scratch / "fifo")
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # relative to a descriptor: no path gets too long
        os.mkdir("d", dir_fd=fd)
        os.symlink(str(outside), "up", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    (scratch / "closed").mkdir()
    (scratch / "closed" / "f").write_text("x")
    if os.geteuid() == 0:  # root removes it all the same (a user could not)
        (scratch / "closed").chmod(0)
    remove_tree(scratch)
    assert not scratch.exists() and list(job_dir.iterdir()) == []
    assert sorted(p.name for p in outside.iterdir()) == ["keep"]
    assert (outside / "keep").read_text() == "not the job's"
    remove_tree(scratch)  # none: nothing to do


def test_a_removal_in_turns_goes_on_from_what_is_on_disk(tmp_path: Path) -> None:
    """A turn stops at its budget and the next goes on from what is on disk (nothing of
    the removal is kept in memory between turns); a tree nobody adds to meets no new
    directory."""
    scratch = tmp_path / "job" / SCRATCH
    for i in range(20):
        (scratch / f"d{i}" / "e" / "f").mkdir(parents=True)
        (scratch / f"d{i}" / "e" / "file").write_text("x")
    turns = 0
    while True:
        budget = Budget(60.0, 7, time.time_ns())
        turns += 1
        if remove_tree(scratch, budget):
            break
        assert budget.new == 0 and turns < 100
    assert turns > 5 and not scratch.exists()
