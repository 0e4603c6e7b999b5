"""Per-job output of a simulation: one CSV row per job and run (``--jobs-out``).

Columns (:data:`COLUMNS`, documented in docs/simulation.md): ``run`` (``rigid`` or
``elastic``), ``job_id``, ``user``, ``submit``, ``start``, ``end`` (seconds of the
trace's clock), ``tasks_at_start``, ``min_tasks``, ``max_tasks``, ``malleable`` (``1``
when the job ran malleable in this run, else ``0``), ``resizes`` (committed size
changes, those of runs a requeue ended included), ``wait`` (start - submit),
``bounded_slowdown`` (as in the metrics: ``max(1, (wait + run) / max(run, 10 s))``)
``requeues`` (times a host failure put the job back in the queue, by a site's
policy; ``start`` is then its last start), ``state`` (``DONE`` or ``EXIT``) and
``reason`` (why it ended, as the controller says: ``done``, ``host failure`` ...).
Rows come run by run, rigid first, each in job id order, so that the two runs of a job
are easy to join. A name ending in ``.gz`` is written gzip-compressed.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
from collections.abc import Container, Iterable, Sequence
from typing import IO, cast

from xce_resize_plugin.controllers.jobs import job_id_key
from xce_resize_plugin.controllers.observer import FinishedJob, Observer
from xce_resize_plugin.core.models import Task
from xce_resize_plugin.simulation.metrics import bounded_slowdown

__all__ = ["COLUMNS", "JobRow", "JobRows", "write_jobs_csv"]

COLUMNS = (
    "run",
    "job_id",
    "user",
    "submit",
    "start",
    "end",
    "tasks_at_start",
    "min_tasks",
    "max_tasks",
    "malleable",
    "resizes",
    "wait",
    "bounded_slowdown",
    "requeues",
    "state",
    "reason",
)

#: One row, in the order of :data:`COLUMNS` (a plain tuple: a whole trace's rows are
#: sent back from the run's process).
JobRow = tuple[
    str, str, str, float, float, float, int, int, int, int, int, float, float, int, str, str
]


class JobRows(Observer):
    """Collects a run's rows as its jobs end.

    :param run: ``rigid`` or ``elastic``.
    :param malleable: ids of the jobs that run malleable in this run.
    """

    def __init__(self, run: str, malleable: Container[str]) -> None:
        self.run = run
        self._malleable = malleable
        self.rows: list[JobRow] = []
        self._requeues: dict[str, int] = {}
        # Requeued jobs: the commits of their earlier runs, which the end does not show
        # (counted: a requeued job's versions go on from its earlier run's).
        self._earlier: dict[str, int] = {}
        self._commits: dict[str, int] = {}

    def allocation_committed(
        self, job_id: str, time: float, tasks: Sequence[Task], version: int
    ) -> None:
        self._commits[job_id] = self._commits.get(job_id, 0) + 1

    def job_requeued(self, job_id: str, time: float) -> None:
        self._requeues[job_id] = self._requeues.get(job_id, 0) + 1
        self._earlier[job_id] = self._earlier.get(job_id, 0) + self._commits.pop(job_id, 0)

    def job_ended(self, job: FinishedJob) -> None:
        self._commits.pop(job.id, None)
        start = job.start_time if job.start_time is not None else job.end_time
        first = job.versions[0].tasks if job.versions else ()
        wait = start - job.submit_time
        self.rows.append(
            (
                self.run,
                job.id,
                job.user,
                job.submit_time,
                start,
                job.end_time,
                len(first),
                job.min_tasks,
                job.max_tasks,
                1 if job.id in self._malleable else 0,
                max(0, len(job.versions) - 1) + self._earlier.pop(job.id, 0),
                wait,
                bounded_slowdown(wait, job.end_time - start),
                self._requeues.pop(job.id, 0),
                job.state.value,
                job.exit_reason,
            )
        )

    def sorted_rows(self) -> tuple[JobRow, ...]:
        """The rows in job id order."""
        return tuple(sorted(self.rows, key=lambda row: job_id_key(row[1])))


def write_jobs_csv(path: str | os.PathLike[str], runs: Iterable[Sequence[JobRow]]) -> None:
    """Write the header and each run's rows to ``path`` (gzip when it ends in ``.gz``)."""
    name = os.fspath(path)
    with open(name, "wb") as raw:
        # mtime=0: the same runs give the same bytes.
        out = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) if name.endswith(".gz") else raw
        with io.TextIOWrapper(cast(IO[bytes], out), encoding="utf-8", newline="") as text:
            writer = csv.writer(text, lineterminator="\n")
            writer.writerow(COLUMNS)
            for rows in runs:
                writer.writerows(rows)
