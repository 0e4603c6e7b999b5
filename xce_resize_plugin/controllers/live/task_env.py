"""What a task learns about itself and its job, besides the allocation: its place on
its host, the job's size bounds, where task 0 is, a scratch directory of the job's own.

Frameworks inside a resizable job need these to find each other and to bind tasks to
a host's devices (docs/in-job-api.md, "Task identity"); a task id is not a rank (ids
have gaps after a shrink), so a rank is derived from the task file, never assumed.

The scratch directory (``XCE_JOB_DIR``, with ``TMPDIR`` inside) belongs to the job's
owner and goes away when the job ends; it lives in the job's directory, which the
controller owns and the job cannot write, so no job can plant a link where the
controller (root, in a real install) creates or removes it; what the job puts inside
it is removed without following a link and without recursion (:func:`remove_tree`).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from xce_resize_plugin.controllers.live.proc import Account
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import Task

#: The key of a task's place on its host in its recorded launch environment.
LOCAL_ID = "XCE_LOCAL_TASK_ID"
SCRATCH = "scratch"


def local_task_id(taken: Iterable[int]) -> int:
    """The lowest per-host index no other live task of the job holds there: unique
    among the job's tasks on the host at any instant (a device index, a port offset),
    and reused once its task is gone, so indexes stay below the tasks on the host."""
    used = set(taken)
    index = 0
    while index in used:
        index += 1
    return index


def identity_env(
    task: Task,
    local_id: int,
    hosts: Sequence[str],
    bounds: tuple[int, int],
    head_addr: str,
    scratch: Path,
) -> dict[str, str]:
    """The variables of :mod:`this module <.task_env>` for one task being launched:
    ``hosts`` is the allocation it is launched into (``LSB_HOSTS``, a name per task),
    ``bounds`` the job's ``(min, max)`` tasks."""
    return {
        LOCAL_ID: str(local_id),
        "XCE_TASKS_ON_HOST": str(sum(1 for h in hosts if h == task.host)),
        "XCE_MIN_TASKS": str(bounds[0]),
        "XCE_MAX_TASKS": str(bounds[1]),
        "XCE_HEAD_ADDR": head_addr,
        "XCE_JOB_DIR": str(scratch),
        "TMPDIR": str(scratch / "tmp"),
    }


def task_file(tasks: Iterable[Task]) -> str:
    """``XCE_TASKFILE``: one line per task, ``ID HOST``, in allocation order. The LSF
    hostfile keeps LSF's format (a host name per line), which MPI launchers read."""
    return "".join(f"{t.id} {t.host}\n" for t in tasks)


def make_scratch(job_dir: Path, account: Account, as_root: bool) -> Path:
    """The job's scratch directory and its ``tmp``, the owner's, mode 0700 (made once;
    a relaunch finds them)."""
    scratch = job_dir / SCRATCH
    for path in (scratch, scratch / "tmp"):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
            if as_root:
                _give(path, account)
    return scratch


def _give(path: Path, account: Account) -> None:
    """Give the directory root has just made at ``path`` to the job's owner, through a
    descriptor of it. ``scratch`` is the owner's by the time ``tmp`` is made, and a job's
    process can put a symbolic or a hard link to any file in its place between the two
    calls: a change of owner by name would give the job that file. What is not a
    directory of root's there (never followed) is the job's doing, and left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symbolic link
            return
        raise
    try:
        if os.fstat(fd).st_uid == 0:
            os.fchown(fd, account.uid, account.gid)
    finally:
        os.close(fd)


#: How the removal opens a directory of the job's: never through a symbolic link, never
#: anything but a directory (a FIFO is not opened, so nothing blocks).
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Budget:
    """What one turn of a removal may still do (:func:`remove_tree`): ``entries``
    entries, until ``deadline`` (``time.monotonic``). A directory whose inode changed
    after ``since_ns`` (``time.time_ns``; the removal's previous turn) is new, made by a
    process of the job's owner that works inside the tree (docs/live-controller.md,
    "Jobs and tasks"); ``new`` counts those this turn met."""

    def __init__(self, seconds: float, entries: int, since_ns: int) -> None:
        self.deadline = time.monotonic() + seconds
        self.entries = entries
        self.since_ns = since_ns
        self.new = 0

    @classmethod
    def unlimited(cls) -> Budget:
        return cls(math.inf, sys.maxsize, time.time_ns())

    def spend(self) -> bool:
        """Take one entry; ``False`` once the turn is over (nothing was taken)."""
        if self.entries <= 0 or time.monotonic() >= self.deadline:
            self.entries = 0
            return False
        self.entries -= 1
        return True


def remove_tree(path: Path, budget: Budget | None = None) -> bool:
    """Remove the directory ``path`` (a job's scratch directory, or one moved aside:
    :mod:`.scratch_trash`) and what the job left in it; what cannot be removed is left.
    ``True`` when done (removed, or what is left cannot be); ``False`` when ``budget``
    ran out first: a later call with a new budget goes on from what is on disk.

    Every step is relative to a descriptor of a directory opened without following
    links, so no link the job made is followed. And no step recurses: the job decides
    how deep its directories nest, and ``shutil.rmtree`` recurses once per level (past
    Python's recursion limit, about 1000 levels, its ``RecursionError`` escapes
    ``ignore_errors`` and the controller's cycle that ends the job), as a walk that
    holds a descriptor per level would run out of descriptors. Instead, the
    subdirectories of each directory emptied are moved up into the scratch directory
    itself, and emptied from there in turn: two directories are open at most. What is
    left to do is never listed in memory but found again on disk, by passes over the
    scratch directory until one changes nothing: a process of the owner's that keeps
    making directories inside would otherwise grow that list, and the controller's
    memory, for as long as it runs."""
    budget = budget or Budget.unlimited()
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return True  # none (the job's directory is the controller's: nobody else made one)
    try:
        done = _empty(top, budget)
    finally:
        os.close(top)
    if done:
        with contextlib.suppress(OSError):
            os.rmdir(path)
    return done


def _empty(top: int, budget: Budget) -> bool:
    """Passes over ``top`` until one changes nothing (``True``), or until the budget is
    spent (``False``)."""
    while True:
        changed = False
        try:
            with os.scandir(top) as entries:
                for entry in entries:
                    if not budget.spend():
                        return False
                    changed = _remove_entry(top, entry.name, budget) or changed
                    if budget.entries <= 0:
                        return False
        except OSError:
            return True
        if not changed:
            return True


def _remove_entry(top: int, name: str, budget: Budget) -> bool:
    """Remove ``name`` of the directory ``top``: anything but a directory at once (a
    symbolic link itself, not what it names); a directory once its entries are gone,
    its subdirectories moved up into ``top`` under new names. Whether anything
    changed."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=top)
    except OSError:
        try:
            os.unlink(name, dir_fd=top)
        except OSError:
            return False
        return True
    changed = False
    try:
        with os.scandir(fd) as entries:
            for entry in entries:
                if not budget.spend():
                    return changed  # the rest at the next turn
                changed = _clear(entry, fd, top, budget) or changed
    except OSError:
        pass
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=top)
    except OSError:
        return changed
    return True


def _clear(entry: os.DirEntry[str], fd: int, top: int, budget: Budget) -> bool:
    """Unlink ``entry`` of the directory ``fd``, or move it up into ``top`` if it is a
    directory; whether that was done."""
    try:
        if entry.is_dir(follow_symlinks=False):
            if entry.stat(follow_symlinks=False).st_ctime_ns > budget.since_ns:
                budget.new += 1
            os.rename(entry.name, f".removing-{uuid.uuid4().hex}", src_dir_fd=fd, dst_dir_fd=top)
        else:
            os.unlink(entry.name, dir_fd=fd)
    except OSError:
        return False
    return True


def recorded_local_ids(
    records: Iterable[Mapping[str, object] | None],
) -> list[int]:
    """The per-host indexes in recorded launch commands (``task:JOB:ID`` records)."""
    out = []
    for record in records:
        launch = record.get("launch") if record else None
        env = launch.get("env") if isinstance(launch, Mapping) else None
        value = env.get(LOCAL_ID) if isinstance(env, Mapping) else None
        index = read_decimal(value) if isinstance(value, str) else None
        if index is not None:
            out.append(index)
    return out
