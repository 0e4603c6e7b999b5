"""The engine's view of site policy, forwarded to the policy hooks.

Typed forwarding methods around ``pm.hook`` (as tox 4 does) so that every call site is
checked by mypy, and so that a site hook that raises something unexpected becomes a
clear ``PolicyRejected`` instead of a 500.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pluggy

from xce_resize_plugin.core.models import JobInfo, ResizeRecord, ResizeRequest, Task
from xce_resize_plugin.core.placement import GrowHostView, default_grow_order
from xce_resize_plugin.core.reclaim import ReclaimCandidate, ReclaimHead, Selection
from xce_resize_plugin.errors import PolicyRejected, ResizeError
from xce_resize_plugin.host import Principal


class HookPolicy:
    """Implements :class:`xce_resize_plugin.core.engine.Policy` through the policy hooks."""

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self._hook = pm.hook

    def authorize(self, principal: Principal, job: JobInfo, action: str) -> bool:
        result = self._hook.xce_resize_authorize(principal=principal, job=job, action=action)
        return bool(result)

    def validate(self, job: JobInfo, request: ResizeRequest) -> None:
        try:
            self._hook.xce_resize_validate(job=job, request=request)
        except ResizeError:
            raise
        except Exception as exc:  # a site rule's own exception carries the site's message
            raise PolicyRejected(str(exc) or type(exc).__name__) from exc

    def select_release(self, job: JobInfo, candidates: Sequence[Task], count: int) -> Sequence[int]:
        result = self._hook.xce_resize_select_release(job=job, candidates=candidates, count=count)
        return list(result) if result is not None else []

    def order_grow_hosts(self, job: JobInfo, hosts: GrowHostView) -> Iterable[str]:
        result = self._hook.xce_resize_order_grow_hosts(job=job, hosts=hosts)
        return result if result is not None else default_grow_order(job, hosts)

    def host_lost(self, job: JobInfo, lost_task_ids: Sequence[int]) -> str:
        """``"exit"`` or ``"requeue"`` for a job a failed host took tasks from; a site
        answer that is neither is refused with the hook's name."""
        result = self._hook.xce_resize_host_lost(job=job, lost_task_ids=tuple(lost_task_ids))
        answer = "exit" if result is None else result
        if answer not in ("exit", "requeue"):
            raise PolicyRejected(f"xce_resize_host_lost returned {answer!r}, not exit or requeue")
        return str(answer)

    def committed(self, job: JobInfo, change: ResizeRecord) -> None:
        """Tell the sites' ``xce_resize_committed`` hooks about a committed change."""
        self._hook.xce_resize_committed(job=job, change=change)

    # -- reclaim ------------------------------------------------------------------------

    def select_reclaim(
        self, head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
    ) -> Selection:
        """The tasks to reclaim for ``head`` (job id -> task ids; empty: none)."""
        result = self._hook.xce_resize_select_reclaim(head=head, candidates=candidates)
        return dict(result) if result is not None else {}
