"""The runtime's reclaim: shrinking running jobs for the blocked queue head.

The second of the runtime's layers (:mod:`xce_resize_plugin.runtime`): with
``[resize] reclaim = "shrink"`` (docs/admin-guide.md, "Reclaim"), resizable jobs are
asked to release tasks, through the ordinary release path, when that starts the head
the host could not start now; each job is asked at most once per head (a veto is final
for that head).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from operator import attrgetter

from xce_resize_plugin.core import engine
from xce_resize_plugin.core.facts import Fact
from xce_resize_plugin.core.models import ChangeKind, JobState, ReleaseRequest, Task, TasksInIdOrder
from xce_resize_plugin.core.reclaim import (
    QueueHead,
    ReclaimCandidate,
    ReclaimHead,
    Selection,
    check_selection,
    same_head,
    short_after,
    tasks_short,
)
from xce_resize_plugin.errors import ResizeError
from xce_resize_plugin.host import ClusterView, Controller, Principal
from xce_resize_plugin.runtime.transitions import Transitions

log = logging.getLogger(__name__)

#: Who asks when the plugin reclaims slots for the queue head (resize history shows it).
RECLAIM = Principal("reclaim", admin=True)


_task_id = attrgetter("id")


#: What a reclaim's candidates depend on: the head, the host's resizable jobs, the
#: runtime's state counter and how many jobs were asked for this head.
_CandidatesKey = tuple[str, tuple[str, ...], int, int]


def _plus(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Per-host sums of two slot counts."""
    out = dict(a)
    for host, n in b.items():
        out[host] = out.get(host, 0) + n
    return out


class Reclaiming(Transitions):
    """Reclaim for the blocked queue head (see the module docstring)."""

    def __init__(self, controller: Controller) -> None:
        super().__init__(controller)
        # The head the jobs in _reclaim_asked were asked for. Kept in memory only: after
        # a failover a job may be asked again.
        self._reclaim_on = self.values["reclaim"] == "shrink"
        self._reclaim_min_delay = float(self.values["reclaim_min_delay"])
        self._reclaim_for: str | None = None
        self._reclaim_asked: set[str] = set()
        self._reclaim_seen: tuple[QueueHead, int, int] | None = None
        self._reclaim_answer = False
        self._candidates_kept: tuple[_CandidatesKey, tuple[ReclaimCandidate, ...]] | None = None
        self._releasables: dict[str, tuple[Sequence[Task], Sequence[Task]]] = {}

    def _reclaim(self, cluster: ClusterView) -> bool:
        """Ask resizable jobs to release tasks when that starts the blocked head now
        (docs/admin-guide.md, "Reclaim"). ``True`` while slots are being freed for it:
        grows then wait, so that what is freed goes to the head."""
        queued = cluster.blocked_head()
        with self._lock:
            if queued is None:
                self._reclaim_for, self._reclaim_asked = None, set()
                self._reclaim_seen = self._candidates_kept = None
                self._releasables = {}
                return False
            if queued.job_id != self._reclaim_for:
                self._reclaim_for, self._reclaim_asked = queued.job_id, set()
                self._reclaim_seen = self._candidates_kept = None
            now = self.controller.now()
            if queued.shadow - now < self._reclaim_min_delay:
                return False
            # Most cycles find the same head, the same states and the same jobs asked
            # as the last one (a job arriving behind the head changes none of them):
            # the decision would be the same, so the last one stands. Only a decision
            # that changed nothing is kept; the time counts only in the check above.
            seen = (queued, self._version, len(self._reclaim_asked))
            last = self._reclaim_seen
            if last is not None and last[1:] == seen[1:] and same_head(queued, last[0]):
                return self._reclaim_answer
            answer = self._reclaim_decide(queued, now)
            unchanged = self._version == seen[1] and len(self._reclaim_asked) == seen[2]
            self._reclaim_seen = seen if unchanged else None
            self._reclaim_answer = answer
            return answer

    def _reclaim_decide(self, queued: QueueHead, now: float) -> bool:
        """:meth:`_reclaim` for a head whose start is far enough away."""
        coming = self._being_freed(queued.unusable)
        free = _plus(queued.free, coming) if coming else queued.free
        total = queued.free_total
        if total is not None:
            total += sum(coming.values())  # none on unusable hosts
        short = tasks_short(queued.tasks, queued.ptile, free, queued.unusable, total, {})
        if short == 0:
            # What is being freed starts it: nothing to ask (grows wait for it).
            return bool(coming) and self.controller.get_job(queued.job_id) is not None
        bound = queued.resizable_excess
        if bound is not None and short > bound:
            # The candidates are some of those jobs, each giving at most what it holds
            # above its minimum: not one lookup, not even the head's job, when all of
            # it would not be enough (on HPC2N, four decisions in five end here).
            return False
        job = self.controller.get_job(queued.job_id)
        if job is None:
            return False
        head = ReclaimHead(job, queued.tasks, queued.ptile, free, queued.unusable, total)
        candidates = self._reclaim_candidates(queued)
        if short > sum(c.excess for c in candidates):
            return False  # even every job at its minimum would not start it
        # A list of its own: the policy may reorder what it is given.
        try:
            selection = self.policy.select_reclaim(head, list(candidates))
            check_selection(selection, candidates)
        except ResizeError as exc:
            # The site's selection is wrong: nothing is asked for this head (logged,
            # once: the same decision is not made again until something changes). The
            # cycle goes on; a failed cycle stalled every job's dispatch and events.
            log.error("reclaim for job %s: nothing asked: %s", queued.job_id, exc)
            return False
        if short_after(head, selection, candidates) > 0:
            return False  # a reconfiguration that starts nobody only costs
        return self._ask_reclaim(head, selection, candidates, now)

    def _being_freed(self, unusable: frozenset[str]) -> dict[str, int]:
        """Slots per host that shrinks in flight will free (not yet stopped)."""
        out: dict[str, int] = {}
        for job_id in self._busy:
            change = self.states[job_id].change
            if change is None or change.kind is not ChangeKind.SHRINK:
                continue
            for task in change.tasks:
                if task.id not in change.stopped and task.host not in unusable:
                    out[task.host] = out.get(task.host, 0) + 1
        return out

    def _reclaim_candidates(self, queued: QueueHead) -> tuple[ReclaimCandidate, ...]:
        """The host's running resizable jobs above their minimum with nothing in
        flight, not yet asked for this head.

        Kept while the head, the host's resizable jobs, the states and the jobs asked
        stay the same: half of the decisions that are made again (see _reclaim) differ
        only in the free slots, and a job's view changes only with its state or its
        end (the host then lists other resizable jobs)."""
        key = (queued.job_id, queued.resizable, self._version, len(self._reclaim_asked))
        kept = self._candidates_kept
        if kept is not None and kept[0] == key:
            return kept[1]
        out: list[ReclaimCandidate] = []
        # The allocations of this listing's candidates (those of the last listing are
        # dropped with it: a job no longer listed has ended or changed).
        releasables: dict[str, tuple[Sequence[Task], Sequence[Task]]] = {}
        for job_id in queued.resizable:
            if job_id in self._reclaim_asked or job_id == queued.job_id:
                continue
            state = self.states.get(job_id)
            if state is not None and state.change is not None:
                continue
            job = self.controller.get_job(job_id)
            if job is None or job.state is not JobState.RUN or not job.resizable:
                continue
            tasks = state.tasks if state is not None else job.tasks
            excess = len(tasks) - job.min_tasks
            if excess > 0:
                releasable = self._releasable_of(job_id, tasks, releasables)
                pending = state is not None and state.pending is not None
                out.append(ReclaimCandidate(job, releasable, excess, pending))
        found = tuple(out)
        self._candidates_kept = (key, found)
        self._releasables = releasables
        return found

    def _releasable_of(
        self,
        job_id: str,
        tasks: Sequence[Task],
        into: dict[str, tuple[Sequence[Task], Sequence[Task]]],
    ) -> Sequence[Task]:
        """A job's tasks but task 0, in id order (:class:`ReclaimCandidate`), made once
        per allocation: the candidates are listed again after every transition of any
        job, and a job of many hosts would be copied and sorted each time."""
        kept = self._releasables.get(job_id)
        if kept is not None and kept[0] is tasks:
            into[job_id] = kept
            return kept[1]
        # Task 0 comes first in a committed allocation: then the rest is a slice.
        first = tasks[0]
        if isinstance(tasks, TasksInIdOrder) and first.id == 0:
            # The host's own list, in id order: read only from the end, if at all.
            releasable: Sequence[Task] = tasks[1:]
        else:
            # Mostly in id order already: the sort then only checks it, in C.
            rest = tasks[1:] if first.id == 0 else [t for t in tasks if t.id != 0]
            releasable = tuple(sorted(rest, key=_task_id))
        into[job_id] = (tasks, releasable)
        return releasable

    def _ask_reclaim(
        self,
        head: ReclaimHead,
        selection: Selection,
        candidates: Sequence[ReclaimCandidate],
        now: float,
    ) -> bool:
        """Release the selection through the ordinary path (the job's notification may
        veto); a job a site rule refuses is left out, and if the rest no longer starts
        the head nothing is asked. ``True`` when releases were asked."""
        jobs = {c.job.id: c.job for c in candidates}
        decided: list[tuple[str, Sequence[int], Sequence[Fact]]] = []
        for job_id, ids in selection.items():
            if not ids:
                continue
            # A pending grow is cancelled: it could not be placed before the head.
            request = ReleaseRequest(task_ids=tuple(sorted(ids)), cancel_pending=True)
            state = self.states.get(job_id)
            try:
                facts = engine.decide_request(
                    state, jobs[job_id], RECLAIM, request, now, self.policy, self.settings
                )
            except ResizeError:
                self._reclaim_asked.add(job_id)  # refused by a site rule: not for this head
                continue
            except Exception:
                # A site hook failing (an xce_resize_authorize that does not know the
                # plugin's own principal "reclaim"): that job is not asked, and the
                # cycle goes on rather than fail every cycle for every job.
                log.exception("reclaim: job %s not asked (a site hook failed)", job_id)
                self._reclaim_asked.add(job_id)
                continue
            decided.append((job_id, ids, facts))
        if short_after(head, {j: ids for j, ids, _ in decided}, candidates) > 0:
            return False
        for job_id, _, chosen in decided:
            self._reclaim_asked.add(job_id)
            self._transition(job_id, chosen)
        return bool(decided)
