"""Built-in site policies, registered ``trylast`` so a site's own hooks come first.

Each answers the policy question the way LSF users expect when nobody configured
anything (docs/hooks.md). A site overrides one by implementing the same hook in a policy
file (docs/admin-guide.md; examples in hooks/).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from xce_resize_plugin import hookimpl
from xce_resize_plugin.core.models import JobInfo, Task
from xce_resize_plugin.core.placement import GrowHostView, default_grow_order
from xce_resize_plugin.core.reclaim import (
    ReclaimCandidate,
    ReclaimHead,
    Selection,
    default_selection,
)
from xce_resize_plugin.host import Principal


@hookimpl(trylast=True)
def xce_resize_select_release(
    job: JobInfo, candidates: Sequence[Task], count: int
) -> Sequence[int] | None:
    """Newest tasks first: they hold the least state and were the last to be promised."""
    newest = sorted(candidates, key=lambda t: t.id, reverse=True)
    return [t.id for t in newest[:count]]


@hookimpl(trylast=True)
def xce_resize_order_grow_hosts(job: JobInfo, hosts: GrowHostView) -> Iterable[str] | None:
    """The job's own hosts first (by its grow_hosts rule), then most free slots, then name."""
    return default_grow_order(job, hosts)


@hookimpl(trylast=True)
def xce_resize_authorize(principal: Principal, job: JobInfo, action: str) -> bool | None:
    """The owner, an administrator, or the job's own token (for that job only)."""
    return principal.may_act_on(job.id, job.user)


@hookimpl(trylast=True)
def xce_resize_select_reclaim(
    head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
) -> Selection | None:
    """The largest excess over min_tasks first, newest tasks first: the jobs that lose
    the least of their guaranteed size, and the tasks that hold the least state."""
    return default_selection(head, candidates)


@hookimpl(trylast=True)
def xce_resize_host_lost(job: JobInfo, lost_task_ids: Sequence[int]) -> str | None:
    """End the job: a rigid job's run is lost with any of its hosts (as in LSF)."""
    return "exit"
