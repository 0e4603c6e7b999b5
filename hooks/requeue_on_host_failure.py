"""Site policy: a job a host failure would end is requeued instead (rerunnable jobs).

Why a site wants it: LSF sites often make jobs rerunnable (``bsub -r``) so that a host
crash costs the run, not the user's resubmission. A job that cannot lose the failed
host's tasks — not resizable, task 0 on that host, or too few tasks left — goes back to
the queue and starts again from scratch (its place in the queue is its submit time). A
job whose environment sets ``XCE_RERUNNABLE=N`` ends ``EXIT`` as by default.

Resizable jobs that can shrink never reach this hook: they lose the tasks and go on.

Enable with ``[resize] policy_files = ["hooks/requeue_on_host_failure.py"]``.
"""

from __future__ import annotations

from collections.abc import Sequence

from xce_resize_plugin import JobInfo, hookimpl


@hookimpl
def xce_resize_host_lost(job: JobInfo, lost_task_ids: Sequence[int]) -> str | None:
    if job.env.get("XCE_RERUNNABLE", "Y").upper() == "N":
        return None  # the default decides: exit
    return "requeue"
