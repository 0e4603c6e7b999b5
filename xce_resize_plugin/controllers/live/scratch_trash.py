"""Scratch directories of ended jobs, removed in the background.

A job's scratch directory (``XCE_JOB_DIR``) goes when the job ends or is requeued, and
the controller decides that with its lock held. What the job left there is the job's
choice: millions of files take minutes to remove, and the controller would answer
nobody meanwhile. So the directory is first moved aside, one rename in the job's
directory (which only the controller writes), and then removed by one thread of its
own, without following links or recursing (:func:`.task_env.remove_tree`), in turns
of bounded length between the jobs (:class:`TrashRemover`). A
controller that stops or crashes meanwhile leaves the moved directory; the next one
removes what it finds at its start (:meth:`TrashRemover.sweep`).
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
import time
import uuid
from collections import deque
from pathlib import Path

from xce_resize_plugin.controllers.live.task_env import SCRATCH, Budget, remove_tree

log = logging.getLogger(__name__)

#: What a scratch directory is renamed to in its job's directory before its removal.
TRASH_PREFIX = ".scratch-removing-"


def discard_scratch(job_dir: Path) -> Path | None:
    """Move the job's scratch directory aside; the path to remove, ``None`` when the job
    has none."""
    trash = job_dir / f"{TRASH_PREFIX}{uuid.uuid4().hex}"
    try:
        os.rename(job_dir / SCRATCH, trash)
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("cannot move %s aside to remove it: %s", job_dir / SCRATCH, exc)
        return None
    return trash


#: One turn of a removal: at most this long and this many entries, after which the rest
#: waits behind the other removals (round robin). One removal at a time, to the end,
#: let a process of the job's owner that keeps filling its scratch hold back every
#: other job's removal for as long as it ran (docs/live-controller.md,
#: "Jobs and tasks").
TURN_SECONDS = 1.0
TURN_ENTRIES = 100_000
#: Turns that ran out while still meeting new directories, after which the removal is
#: logged (once) as kept growing by its owner; it goes on in turn with the others, each
#: of its turns then after a pause of a turn's length, so that chasing such a tree costs
#: the controller at most about half of one core.
GROWING_TURNS = 5


class _Removal:
    """One directory :func:`discard_scratch` moved aside, removed turn by turn."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.since_ns = 0  # when its previous turn began
        self.growing = 0  # its last turns in a row that met new directories
        self.logged = False
        self.due = 0.0  # time.monotonic() before which it waits

    def turn(self, seconds: float, entries: int) -> bool:
        """One turn; whether there is more to do."""
        began = time.time_ns()
        budget = Budget(seconds, entries, self.since_ns or began)
        self.since_ns = began
        if remove_tree(self.path, budget):
            return False
        self.growing = self.growing + 1 if budget.new else 0
        if self.growing >= GROWING_TURNS and not self.logged:
            self.logged = True
            log.warning(
                "the scratch directory of job %s (%s), being removed, keeps getting new "
                "directories: a process of user %s works inside it; its removal goes on, "
                "in turn with the others",
                self.path.parent.name,
                self.path,
                _owner(self.path),
            )
        self.due = time.monotonic() + seconds if self.growing >= GROWING_TURNS else 0.0
        return True


def _owner(path: Path) -> str:
    """The name of ``path``'s owner (the job's), its uid when it has none."""
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class TrashRemover:
    """Removes what it is given in a daemon thread started at the first, in turns
    (:data:`TURN_SECONDS`, :data:`TURN_ENTRIES`): a removal not done at the end of its
    turn goes back to the end of the queue."""

    def __init__(
        self, turn_seconds: float = TURN_SECONDS, turn_entries: int = TURN_ENTRIES
    ) -> None:
        self.turn_seconds = turn_seconds
        self.turn_entries = turn_entries
        self._queue: deque[_Removal | Path] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def put(self, path: Path) -> None:
        """Remove ``path``, a directory :func:`discard_scratch` moved aside."""
        self._add(_Removal(path))

    def sweep(self, jobs_dir: Path) -> None:
        """Remove what an earlier controller moved aside and did not remove (it
        stopped first), found under ``jobs_dir/*/``; the listing is the thread's."""
        self._add(jobs_dir)

    def _add(self, work: _Removal | Path) -> None:
        with self._cond:
            self._queue.append(work)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="scratch-remover", daemon=True
                )
                self._thread.start()

    def _next(self) -> _Removal | Path:
        """The first in the queue whose time has come (waiting until one has)."""
        with self._cond:
            while True:
                now = time.monotonic()
                for i, work in enumerate(self._queue):
                    if isinstance(work, Path) or work.due <= now:
                        del self._queue[i]
                        return work
                waits = [w.due - now for w in self._queue if isinstance(w, _Removal)]
                self._cond.wait(min(waits) if waits else None)

    def _run(self) -> None:
        while True:
            work = self._next()
            try:
                if isinstance(work, Path):
                    for found in work.glob(f"*/{TRASH_PREFIX}*"):
                        self._add(_Removal(found))
                elif work.turn(self.turn_seconds, self.turn_entries):
                    self._add(work)  # the end of the queue: the others' turns first
            except Exception:  # a bug here must not end the removals to come
                log.exception("removing a scratch directory")
