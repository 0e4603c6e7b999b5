"""Site policy: to start a blocked job, its owner's own elastic jobs give tasks first.

Why a site wants it: with ``[resize] reclaim = "shrink"`` the plugin shrinks running
resizable jobs so that the job at the head of the queue starts now. Built in, the jobs
furthest above their minimum give first, whoever owns them; a site that treats each
user's share as theirs to arrange asks the head's owner first, then everyone else in
the built-in order (largest excess over ``min_tasks`` first). Each job still gives its
newest tasks first, never task 0, never below its ``min_tasks``.

Enable with ``[resize] policy_files = ["hooks/reclaim_owner_first.py"]`` and
``reclaim = "shrink"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from xce_resize_plugin import ReclaimCandidate, ReclaimHead, hookimpl, reclaim_in_order


@hookimpl
def xce_resize_select_reclaim(
    head: ReclaimHead, candidates: Sequence[ReclaimCandidate]
) -> Mapping[str, Sequence[int]] | None:
    owner = head.job.user
    order = sorted(candidates, key=lambda c: (c.job.user != owner, -c.excess, c.job.id))
    return reclaim_in_order(head, order)
