"""Reclaim by shrinking: which running jobs give tasks back so the blocked queue head
starts now (``[resize] reclaim = "shrink"``, docs/admin-guide.md).

Everything here is decided on slot counts, as the host's scheduler decides. A slot freed
on a host counts for the head when the head may use that host and, for a head with a
``ptile``, only up to ``ptile`` slots of that host in all (free now, plus being freed,
plus reclaimed): the head fits when those counts add up to the tasks it needs.

- :class:`QueueHead` is what the host tells the plugin of its blocked head (through
  ``ClusterView.blocked_head``);
- :class:`ReclaimHead` and :class:`ReclaimCandidate` are what the policy hook
  ``xce_resize_select_reclaim`` is given;
- :func:`default_selection` is the built-in policy (largest excess over ``min_tasks``
  first, newest tasks first, only tasks whose slots count for the head), made of
  :func:`default_order` and :func:`reclaim_in_order`, which a site policy may reuse
  with its own order;
- :func:`check_selection` holds a policy's answer to the rules that never bend (task 0
  stays, no job below ``min_tasks``, only the candidates' own tasks).

Pure: no I/O, no clock; the runtime (``runtime.Runtime``) asks, in the same way as any
release.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from attrs import field, frozen

from xce_resize_plugin.core.allocations import describe_ids, id_range, plain_ints
from xce_resize_plugin.core.models import JobInfo, Task
from xce_resize_plugin.errors import PolicyRejected

__all__ = [
    "MODES",
    "QueueHead",
    "ReclaimCandidate",
    "ReclaimHead",
    "Selection",
    "check_selection",
    "default_order",
    "default_selection",
    "freed_by",
    "reclaim_in_order",
    "same_head",
    "short_after",
    "tasks_short",
]

#: The values of ``[resize] reclaim``.
MODES = ("off", "shrink")

#: A policy's answer: job id -> the task ids that job releases.
Selection = Mapping[str, Sequence[int]]


@frozen
class QueueHead:
    """The host's blocked queue head, in the host's terms (``ClusterView.blocked_head``).

    :param job_id: the job the host's pass could not start for lack of slots (the job
        holding the reservation).
    :param tasks: tasks it needs to start (its ``min_tasks``).
    :param ptile: at most this many of its tasks on one host (``None``: no limit).
    :param shadow: when the host expects to start it (``math.inf``: unknown).
    :param free: free slots now, per host it may use; hosts without free slots may be
        left out.
    :param unusable: hosts it may not use at all (closed, down, not matching the job's
        requirements): slots freed there do not count for it.
    :param resizable: the running resizable jobs that hold more than their
        ``min_tasks`` (any order; the plugin ignores ids it cannot resize).
    :param free_total: the sum of ``free``, when the host knows it without adding it
        up (``None``: the plugin adds it up when it needs it); a head without
        ``ptile`` is then judged on this count alone, whatever the number of hosts.
    :param resizable_excess: the slots the ``resizable`` jobs hold above their
        ``min_tasks``, summed, when the host knows it (``None``: unknown). A head
        short of more tasks than that is not started by any reclaim: the plugin then
        decides so without looking the jobs up one by one.
    """

    job_id: str
    tasks: int
    ptile: int | None
    shadow: float = math.inf
    free: Mapping[str, int] = field(factory=dict)
    unusable: frozenset[str] = frozenset()
    resizable: tuple[str, ...] = ()
    free_total: int | None = None
    resizable_excess: int | None = None


@frozen
class ReclaimHead:
    """The blocked head as ``xce_resize_select_reclaim`` sees it.

    ``free`` counts, per host the head may use, the slots free now plus those being
    freed by changes already in flight (hosts not listed have none, or are
    ``unusable``).
    """

    job: JobInfo
    tasks: int
    ptile: int | None
    free: Mapping[str, int] = field(factory=dict)
    unusable: frozenset[str] = frozenset()
    #: The sum of ``free`` when known (see :class:`QueueHead`).
    free_total: int | None = None

    def gain(self, host: str, freed: Mapping[str, int]) -> int:
        """How many more of the head's tasks fit if one more slot is freed on ``host``,
        with ``freed`` slots already reclaimed (0 or 1)."""
        if host in self.unusable:
            return 0
        if self.ptile is None:
            return 1
        have = self.free.get(host, 0) + freed.get(host, 0)
        return 1 if have < self.ptile else 0

    def short(self, freed: Mapping[str, int] | None = None) -> int:
        """Tasks of the head that still do not fit once ``freed`` (host -> slots) are
        free too; 0 means it starts."""
        return tasks_short(
            self.tasks, self.ptile, self.free, self.unusable, self.free_total, freed or {}
        )


def tasks_short(
    tasks: int,
    ptile: int | None,
    free: Mapping[str, int],
    unusable: frozenset[str],
    free_total: int | None,
    freed: Mapping[str, int],
) -> int:
    """:meth:`ReclaimHead.short` on the head's counts alone: the runtime asks it before
    it looks the head's job up, which most decisions then do not need."""
    if ptile is None and free_total is not None:
        more = sum(n for host, n in freed.items() if host not in unusable)
        return max(0, tasks - free_total - more)
    fit = 0
    for host in free.keys() | freed.keys():
        if host in unusable:
            continue
        n = free.get(host, 0) + freed.get(host, 0)
        fit += n if ptile is None or n < ptile else ptile
    return max(0, tasks - fit)


def same_head(a: QueueHead, b: QueueHead | None) -> bool:
    """``a == b``, with the fields that tell most heads apart compared first: on a
    machine of many hosts the free slots of two heads are maps of thousands of hosts,
    and a host that rebuilds its head only when its ledger changed hands the same
    object back meanwhile."""
    if a is b:
        return True
    return (
        b is not None
        and a.job_id == b.job_id
        and a.free_total == b.free_total
        and a.resizable_excess == b.resizable_excess
        and a.shadow == b.shadow
        and a == b
    )


@frozen
class ReclaimCandidate:
    """A running resizable job that may give tasks back for the head.

    :param job: the job (its ``tasks`` are the committed allocation).
    :param releasable: its tasks other than task 0, in id order (oldest first: a grow's
        tasks take the next ids).
    :param excess: how many it may give (its tasks above ``min_tasks``).
    :param pending_grow: it has a grow waiting for slots; a reclaim cancels it.
    """

    job: JobInfo
    releasable: Sequence[Task]
    excess: int
    pending_grow: bool = False


def short_after(
    head: ReclaimHead, selection: Selection, candidates: Iterable[ReclaimCandidate]
) -> int:
    """``head.short(freed_by(selection, candidates))``: the head's tasks that still do
    not fit once the selection is freed. When every freed slot counts (no ``ptile``,
    every host usable, the free total known) that is a count, and the selected tasks'
    hosts are not looked up (a reclaim from jobs of many hosts selects thousands)."""
    if head.ptile is None and head.free_total is not None and not head.unusable:
        freed = sum(map(len, selection.values()))
        return max(0, head.tasks - head.free_total - freed)
    return head.short(freed_by(selection, candidates))


def freed_by(selection: Selection, candidates: Iterable[ReclaimCandidate]) -> dict[str, int]:
    """Slots per host a selection frees."""
    by_id = {c.job.id: c for c in candidates}
    out: dict[str, int] = {}
    for job_id, ids in selection.items():
        hosts = _hosts_of(by_id[job_id], ids)
        for tid in ids:
            host = hosts[tid]
            out[host] = out.get(host, 0) + 1
    return out


def _hosts_of(cand: ReclaimCandidate, ids: Iterable[int]) -> dict[int, str]:
    """The hosts of those of ``ids`` that are releasable tasks of ``cand``.

    Read newest first, and only until every id is found: a selection takes the newest
    tasks of a job that may hold many thousands (the default policy does)."""
    wanted = set(ids)
    out: dict[int, str] = {}
    if not wanted:
        return out
    for task in reversed(cand.releasable):
        if task.id in wanted:
            out[task.id] = task.host
            if len(out) == len(wanted):
                break
    return out


def _all_releasable(cand: ReclaimCandidate, ids: Sequence[int]) -> bool:
    """Whether every one of ``ids`` (no id twice) is a releasable task of ``cand``. A
    list in id order whose ids have no gap holds exactly its range of ids
    (:func:`~.allocations.id_range`): then no task is read but its first and last."""
    span = id_range(cand.releasable)
    if span is not None:
        if not ids:
            return True
        if plain_ints(ids):  # the usual: the bounds at C speed
            return span.start <= min(ids) and max(ids) < span.stop
        return all(isinstance(i, int) and i in span for i in ids)
    return len(_hosts_of(cand, ids)) == len(ids)


def _ids_newest_first(tasks: Sequence[Task]) -> list[int]:
    """The tasks' ids, the newest (last) first. A list in id order whose ids have no
    gap is read as its range of ids (:func:`~.allocations.id_range`): only its first
    and last tasks are read, not the thousands a job of many hosts gives."""
    span = id_range(tasks)
    if span is not None:
        return list(reversed(span))
    return [task.id for task in reversed(tasks)]


def default_order(candidates: Iterable[ReclaimCandidate]) -> list[ReclaimCandidate]:
    """The built-in order: the largest excess over ``min_tasks`` first (the job that
    loses least of what it was promised), the newest job first on ties, then by id."""
    return sorted(candidates, key=lambda c: (-c.excess, -(c.job.start_time or 0.0), c.job.id))


def reclaim_in_order(head: ReclaimHead, candidates: Iterable[ReclaimCandidate]) -> Selection:
    """Take from the candidates in the order given, each its newest tasks first (they
    hold the least state), at most its ``excess``, only tasks whose slots count for
    the head, until the head fits. May fall short: the plugin then asks nothing."""
    freed: dict[str, int] = {}
    out: dict[str, list[int]] = {}
    need = head.short()
    # Without a ptile and with every host usable, every slot freed counts: a job gives
    # its newest tasks up to its excess, read from the end of its list in one slice
    # (a job of many hosts gives thousands; the loop below asks for each).
    every_slot_counts = head.ptile is None and not head.unusable
    for cand in candidates:
        if need <= 0:
            break
        if every_slot_counts:
            releasable = cand.releasable
            take = min(need, cand.excess, len(releasable))
            if take > 0:
                out[cand.job.id] = _ids_newest_first(releasable[len(releasable) - take :])
                need -= take
            continue
        taken = 0
        for task in reversed(cand.releasable):  # in id order: the newest last
            if need <= 0 or taken >= cand.excess:
                break
            if head.gain(task.host, freed):
                out.setdefault(cand.job.id, []).append(task.id)
                freed[task.host] = freed.get(task.host, 0) + 1
                taken += 1
                need -= 1
    return out


def default_selection(head: ReclaimHead, candidates: Iterable[ReclaimCandidate]) -> Selection:
    """The built-in policy: :func:`reclaim_in_order` in :func:`default_order`."""
    return reclaim_in_order(head, default_order(candidates))


def check_selection(selection: Selection, candidates: Sequence[ReclaimCandidate]) -> None:
    """Raise :class:`PolicyRejected` unless every job is a candidate, every id one of
    its releasable tasks (never task 0), none twice, and no job goes below its
    ``min_tasks``."""
    by_id = {c.job.id: c for c in candidates}
    for job_id, ids in selection.items():
        cand = by_id.get(job_id)
        if cand is None:
            raise PolicyRejected(
                f"xce_resize_select_reclaim chose job {job_id!r}, which is not a candidate"
            )
        chosen = list(ids)
        if len(set(chosen)) != len(chosen) or not _all_releasable(cand, chosen):
            raise PolicyRejected(
                f"xce_resize_select_reclaim returned {_shown(chosen)} for job {job_id}, "
                f"whose releasable tasks are {describe_ids(t.id for t in cand.releasable)}"
            )
        if len(chosen) > cand.excess:
            raise PolicyRejected(
                f"xce_resize_select_reclaim takes {len(chosen)} tasks from job {job_id}, "
                f"which may give {cand.excess} (its min_tasks is {cand.job.min_tasks})"
            )


def _shown(chosen: Sequence[object]) -> str:
    """A site's answer in a message: as it was, up to a few ids."""
    if len(chosen) <= 16:
        return repr(list(chosen))
    return f"{list(chosen[:16])!r}[:16] of {len(chosen):,} ids"
