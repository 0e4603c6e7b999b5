"""What the live controller checks in its state directory before it starts
(docs/live-controller.md, "Checks at start").

Both checks only read, and run before the controller takes an epoch, so a refused
start changes nothing (and leaves a controller still running on the directory alone):

1. :func:`check_journal`: the plugin's journal (``state_dir/resize``), every record's
   CRC, its meta keys and sequence numbers
   (:func:`~xce_resize_plugin.journal.require_intact`), so that a damaged fact or state
   stops the controller with a message instead of being served later;
2. :func:`cross_check`: the controller's store against the journal's live jobs. The
   plugin writes its journal before it tells the host (docs/failover.md), so after a
   crash the journal may be *ahead* of the store by what the host had not been told
   yet; the plugin re-issues that at start (a commit, a reservation, the end of a
   job's resize state). Anything else means the two were not written by one
   controller's history (one restored from a backup without the other, lost writes)
   and is fatal: :class:`StoreError` naming both files.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from xce_resize_plugin.controllers.jobs import JobRecord
from xce_resize_plugin.controllers.store import Held, Snapshot
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.decimal_text import read_decimal
from xce_resize_plugin.core.models import JobState, ResizeState, Task
from xce_resize_plugin.journal import Journal, require_intact
from xce_resize_plugin.journal.lmdb_env import DATA_FILE

__all__ = ["JOURNAL_DIR", "check_journal", "cross_check"]

log = logging.getLogger(__name__)

#: The plugin's journal, in the state directory.
JOURNAL_DIR = "resize"
#: What a fatal disagreement tells the administrator.
_ADVICE = (
    "the two were not written by one controller (one restored without the other?): "
    "restore both from one backup"
)


def check_journal(journal_dir: Path) -> None:
    """Refuse a damaged journal (:class:`~xce_resize_plugin.errors.JournalError` naming
    its data file); nothing to check in a state directory without one yet."""
    if (journal_dir / DATA_FILE).exists():
        require_intact(journal_dir)


def cross_check(
    snapshot: Snapshot | None, journal_dir: Path, store_file: str, next_job_id: int = 101
) -> list[str]:
    """Compare the store's jobs (``snapshot``, read from ``store_file``; the store gives
    ``next_job_id`` next) with the journal's jobs; raise :class:`StoreError` on a
    disagreement the crash rules cannot explain, and return what the plugin will repair
    at start (one line each)."""
    records = {job.id: (job, held) for job, held in snapshot.jobs} if snapshot else {}
    journal_file = journal_dir.absolute() / DATA_FILE
    if not journal_file.exists():
        _no_journal(records, store_file, journal_file)
        return []
    repairs: list[str] = []
    with Journal.open(journal_dir, readonly=True) as journal:
        for state in _live_states(journal):
            where = f"{store_file}: job {state.job_id}"
            found = records.get(state.job_id)
            if found is None:
                raise StoreError(
                    f"{where}: unknown to the controller's store, but live in the journal "
                    f"{journal_file}: {_ADVICE}"
                )
            problem, repair = _compare(*found, state)
            if problem is not None:
                raise StoreError(f"{where}: {problem} in the journal {journal_file}: {_ADVICE}")
            if repair is not None:
                repairs.append(f"job {state.job_id}: {repair}")
        for job, _held in records.values():
            if job.state is JobState.RUN and job.version and journal.state(job.id) is None:
                raise StoreError(
                    f"{store_file}: job {job.id}: resized to version {job.version}, but the "
                    f"journal {journal_file} knows nothing of it: {_ADVICE}"
                )
        # Last: the checks above name a job the two disagree on, when there is one.
        _ids_ahead(journal, next_job_id, store_file, journal_file)
    for line in repairs:
        log.info("at start the plugin repairs %s", line)
    return repairs


def _no_journal(
    records: Mapping[str, tuple[JobRecord, Held]], store_file: str, journal_file: Path
) -> None:
    """No journal: a store that has resized a job had one (it was lost or moved). A
    new journal would start that job's resize history again, silently."""
    for job, _held in records.values():
        if job.version:
            raise StoreError(
                f"{store_file}: job {job.id}: resized to version {job.version}, but there is "
                f"no journal at {journal_file}: {_ADVICE}"
            )


def _ids_ahead(journal: Journal, next_job_id: int, store_file: str, journal_file: Path) -> None:
    """The journal holds no job whose id the store has not given yet: a store lost
    (started again empty) would give the journal's ids again, and a new job would
    continue a finished one's history."""
    for job_id in journal.job_ids():
        number = read_decimal(job_id)
        if number is not None and number >= next_job_id:
            raise StoreError(
                f"{store_file}: gives job id {next_job_id} next, but the journal "
                f"{journal_file} already holds job {job_id}: {_ADVICE}"
            )


def _live_states(journal: Journal) -> Iterator[ResizeState]:
    for _job_id, stored in journal.live_states():
        yield converters.decode_state(stored)


def _compare(job: JobRecord, held: Held, state: ResizeState) -> tuple[str | None, str | None]:
    """``(fatal problem, repair)`` of one job live in the journal, each ``None`` if none."""
    if job.user != state.user:
        return f"owned by {job.user!r} in the store, by {state.user!r}", None
    if job.finished:
        return None, f"{job.state.value} in the store: its resize state is ended"
    if job.version > state.version:
        return (
            f"allocation version {job.version} in the store, an older one ({state.version})",
            None,
        )
    if job.version == state.version and tuple(job.tasks) != tuple(state.tasks):
        return (
            f"allocation version {job.version} is {_tasks(job.tasks)} in the store, "
            f"{_tasks(state.tasks)}",
            None,
        )
    unissued = sorted(tid for tid in held if tid >= state.next_task_id)
    if unissued:
        return f"the store holds slots for task ids {unissued}, never issued", None
    if job.version < state.version:
        return None, f"allocation version {state.version} is committed again"
    return None, None


def _tasks(tasks: Sequence[Task]) -> str:
    return " ".join(f"{t.id}@{t.host}" for t in tasks)
