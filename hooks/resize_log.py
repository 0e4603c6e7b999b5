"""Site policy: append every committed resize to a CSV file for the site's accounting.

Why a site wants it: external chargeback tools read flat files, not the controller's
journal. One line per committed change: time, job, user, grow/shrink, tasks before,
delta and after, and the hosts of the delta (LSF's ``JOB_RESIZE`` record, flattened).

The file is ``$XCE_RESIZE_LOG`` (default ``resize-log.csv`` in the working directory).
Enable with ``[resize] policy_files = ["hooks/resize_log.py"]``.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from xce_resize_plugin import JobInfo, ResizeRecord, format_hosts, hookimpl

FIELDS = ["time", "job", "user", "type", "before", "delta", "after", "delta_hosts", "version"]


@hookimpl
def xce_resize_committed(job: JobInfo, change: ResizeRecord) -> None:
    path = Path(os.environ.get("XCE_RESIZE_LOG", "resize-log.csv"))
    new = not path.exists()
    with path.open("a", newline="") as fh:
        writer = csv.writer(fh)
        if new:
            writer.writerow(FIELDS)
        writer.writerow(
            [
                f"{change.time:g}",
                job.id,
                job.user,
                change.kind.value,
                len(change.before),
                len(change.delta),
                len(change.after),
                format_hosts(change.delta),
                change.version,
            ]
        )
