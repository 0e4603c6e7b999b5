"""Scratch directories of ended jobs, removed in the background.

A job's scratch directory (``XCE_JOB_DIR``) goes when the job ends or is requeued, and
the controller decides that with its lock held. What the job left there is the job's
choice: millions of files take minutes to remove, and the controller would answer
nobody meanwhile. So the directory is first moved aside, one rename in the job's
directory (which only the controller writes), and then removed by one thread of its
own, without following links or recursing (:func:`.task_env.remove_tree`). A
controller that stops or crashes meanwhile leaves the moved directory; the next one
removes what it finds at its start (:meth:`TrashRemover.sweep`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from xce_resize_plugin.controllers.live.task_env import SCRATCH, remove_tree

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


class TrashRemover:
    """Removes what it is given, one removal after another, in a daemon thread started
    at the first."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, path: Path) -> None:
        """Remove ``path``, a directory :func:`discard_scratch` moved aside."""
        self._add(partial(remove_tree, path))

    def sweep(self, jobs_dir: Path) -> None:
        """Remove what an earlier controller moved aside and did not remove (it
        stopped first), found under ``jobs_dir/*/``; the listing is the thread's."""
        self._add(partial(_sweep, jobs_dir))

    def _add(self, work: Callable[[], None]) -> None:
        self._queue.put(work)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="scratch-remover", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            work = self._queue.get()
            try:
                work()
            except Exception:  # a bug here must not end the removals to come
                log.exception("removing a scratch directory")


def _sweep(jobs_dir: Path) -> None:
    for found in jobs_dir.glob(f"*/{TRASH_PREFIX}*"):
        remove_tree(found)
