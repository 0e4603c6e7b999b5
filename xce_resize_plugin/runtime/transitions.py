"""The runtime's core: the journal, the live states, and the one path every change takes.

Every transition follows the same path (docs/journal-format.md): the engine decides
facts from the current state; the facts and the new materialised state are written in
one journal transaction; only once that is durable does the cache change and the host
get told what to do (reserve, launch, stop, notify, commit). A crash anywhere leaves
either the old state or the new one in the journal, and recovery re-issues the effects
of the new one (all idempotent on the host), so nothing is lost or done twice.

The first of the runtime's layers (:mod:`xce_resize_plugin.runtime`): reclaim
(:mod:`.reclaiming`) and the hook phases (:mod:`.phases`) build on it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import attrs

from xce_resize_plugin.core import config as config_mod
from xce_resize_plugin.core import converters, engine
from xce_resize_plugin.core.allocations import joined
from xce_resize_plugin.core.facts import Fact, JobEnded, JobTracked
from xce_resize_plugin.core.models import ResizeState, allocation_env, format_hosts
from xce_resize_plugin.errors import JournalError
from xce_resize_plugin.host import Controller, resize_observer_of, wake_at
from xce_resize_plugin.journal import Entry, GroupCommitter, Journal, StoredState, Ticket
from xce_resize_plugin.policy import HookPolicy

#: LSF's notification exit values (reference: not documented by LSF; we use 0 and 1).
NOTIFY_OK, NOTIFY_FAIL = "0", "1"


@attrs.define
class _Deferred:
    """Transitions of one job waiting for the next write (``journal_defer``)."""

    job_id: str
    before: ResizeState | None
    facts: list[Fact]
    after: ResizeState


def _entry(
    job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
) -> Entry:
    """The journal entry of the transition(s) from ``before`` to ``after``."""
    return Entry(
        job_id=job_id,
        facts=tuple(converters.encode_fact(f) for f in facts),
        state=converters.encode_state(after),
        ended_at=after.ended_at,
        history=converters.history_tails(before, after),
    )


class Transitions:
    """The journal, the live states and the transition path (see the module
    docstring). Not used on its own: :class:`~.phases.Runtime` is."""

    def __init__(self, controller: Controller) -> None:
        # Weak: the plugin maps controller -> runtime weakly (plugin.py), so a strong
        # reference back would keep a dropped (crashed) controller, its runtime and its
        # journal handle alive for the life of the process.
        self._controller = weakref.ref(controller)
        #: The ``[resize]`` section, checked (core/config.py).
        self.values = values = config_mod.check(controller.config)
        self.settings = config_mod.settings(controller.config)
        self.policy = HookPolicy(controller.plugin_manager)
        self.journal = Journal.open(
            controller.state_dir / "resize",
            map_size=values["journal_map_size"],
            sync=values["journal_sync"],
        )
        # The host's observer (metrics), if it offers one; None costs one test per
        # transition.
        self._observer = resize_observer_of(controller)
        # Durable mode shares fsyncs between concurrent requests (group commit); with
        # journal_sync off (throw-away simulations) a direct commit is cheaper.
        self._committer = (
            GroupCommitter(
                self.journal,
                observe=None if self._observer is None else self._observer.journal_committed,
            )
            if values["journal_sync"]
            else None
        )
        self._failed: BaseException | None = None
        # journal_defer: entries of transitions that need not be written yet; they go
        # first in the next commit, in the same transaction.
        self._defer: bool = values["journal_defer"]
        # journal_batch: every transition is deferred, and written this many at a time.
        self._batch: int = values["journal_batch"]
        self._deferred: list[_Deferred] = []
        # journal_batch: where each job's entry is in _deferred (one entry per job).
        self._batched: dict[str, _Deferred] = {}
        self.states: dict[str, ResizeState] = {}
        # Jobs whose run ended for a requeue while this runtime ran: their ended state
        # is held for a next run (engine.decide_requeued_end lets it go). Kept here so
        # that the end of every other untracked job costs no lookup.
        self._held: set[str] = set()
        # Jobs with a pending grow or a change in flight: the only ones the scheduler
        # and dispatch hooks look at, so an idle cycle costs nothing per tracked job.
        self._busy: set[str] = set()
        # Why one lock: decisions read the state they change; group commit across
        # concurrent requesters is the journal's GroupCommitter's job (live controller).
        self._lock = threading.RLock()
        # Bumped whenever a job's state is stored (what a kept decision compares: see
        # .reclaiming).
        self._version = 0

    @property
    def controller(self) -> Controller:
        """The controller this runtime serves (while it exists)."""
        controller = self._controller()
        if controller is None:
            raise ReferenceError("the controller of this resize runtime is gone")
        return controller

    def _check_failed(self) -> None:
        if self._failed is not None:
            raise JournalError(
                f"the resize journal failed earlier ({self._failed}); restart the controller"
            ) from self._failed

    def _wait(self, ticket: Ticket) -> None:
        try:
            ticket.wait()
        except BaseException as exc:
            # The in-memory state ran ahead of a commit that failed: nothing more may be
            # decided on it. The host must stop (a FencedError says why).
            self._failed = exc
            raise

    def _transition(self, job_id: str, facts: Sequence[Fact], wait: bool = True) -> Ticket | None:
        """Apply facts: new state in memory, the entry committed, then the effects.

        With ``wait=False`` (effect-free transitions only) the entry is queued for group
        commit and its ticket returned: the caller waits for it after releasing the lock.
        Transitions with effects wait here, under the lock, so effects always reach the
        host in commit order and only once durable.
        """
        if not facts:
            return None
        self._check_failed()
        before = self.states.get(job_id)
        if (
            before is None
            and isinstance(facts[0], JobTracked | JobEnded)
            and (job_id in self._held or self._requeued(job_id))
        ):
            # A job requeued after a host failure starts again with the history of its
            # earlier run (engine: JobTracked on an ended state). Only such a job is
            # looked up: a journal read waits for the write in progress, fsync included,
            # and every job's first fact comes here (under the host's lock). A job this
            # runtime holds is one too, whatever the host says: a requeue the host did
            # not carry out (the job was being killed) ends while it "waits".
            before = self._ended_state(job_id)
        state, effects = engine.transition(before, facts)
        assert state is not None
        if self._observer is not None:
            self._observer.resize_transition(before, state, facts)
        if self._committer is None:
            if self._batch:
                # journal_batch (simulations never resumed): effects go ahead of their
                # facts' write; a crash loses the run, which cannot be resumed anyway.
                self._defer_entry(job_id, before, facts, state)
                if len(self._deferred) >= self._batch:
                    self._commit([])
            elif self._defer and (
                not effects or all(isinstance(f, engine.DEFERRABLE) for f in facts)
            ):
                # journal_defer (simulations): what the host has not acted on can wait
                # for the next write, and so can a fact whose loss recovery repairs
                # (engine.DEFERRABLE). The facts and their order stay the same; a
                # process crash loses what was not yet written (docs/failover.md).
                self._defer_entry(job_id, before, facts, state)
            else:
                self._commit_with_deferred(job_id, before, facts, state)
            self._store(state)
        else:
            entry = _entry(job_id, before, facts, state)
            # Stored before it is durable so that the next decision sees it; nothing
            # is acknowledged or done on the host until the ticket says durable.
            self._store(state)
            # Every ticket is waited on, here or by the caller once it released its
            # lock (Runtime.request): a lone request's entry is written by its own
            # thread then (journal/group_commit.py).
            ticket = self._committer.enqueue(entry, will_wait=True)
            if not wait and not effects:
                return ticket
            self._wait(ticket)
        self._execute(effects)
        return None

    def _stored(self, job_id: str) -> StoredState | None:
        """A job's state as the journal has it, deferred writes included."""
        with self._lock:
            if self._deferred and self._failed is None:
                self._commit([])
        return self.journal.state(job_id)

    def _requeued(self, job_id: str) -> bool:
        job = self.controller.get_job(job_id)
        return job is not None and job.requeued

    def _ended_state(self, job_id: str) -> ResizeState | None:
        """The job's ended state, if the journal (or a deferred write) holds one."""
        deferred = self._deferred_of(job_id)
        if deferred is not None:
            return deferred.after
        stored = self.journal.state(job_id)
        return converters.decode_state(stored) if stored is not None else None

    def _deferred_of(self, job_id: str) -> _Deferred | None:
        """The job's latest deferred entry, if any (a batch has one per job: found at
        once; otherwise the few deferred entries are looked through)."""
        if self._batch:
            return self._batched.get(job_id)
        for deferred in reversed(self._deferred):
            if deferred.job_id == job_id:
                return deferred
        return None

    def _defer_entry(
        self, job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
    ) -> None:
        if self._batch:
            # A batch holds one entry per job: its facts in order and its latest state
            # (a job's state is encoded once per batch, not once per transition).
            # Different jobs' facts may then be written in another order than decided;
            # each job's facts keep theirs, and no job's facts depend on another's.
            last: _Deferred | None = self._batched.get(job_id)
        else:
            last = self._deferred[-1] if self._deferred else None
        if last is not None and last.job_id == job_id:
            # The same job again (a release, then its launch): one entry, the facts of
            # both in order and the latest state; the intermediate one would be
            # overwritten in the same transaction anyway.
            last.facts.extend(facts)
            last.after = after
        else:
            entry = _Deferred(job_id, before, list(facts), after)
            self._deferred.append(entry)
            if self._batch:
                self._batched[job_id] = entry

    def _commit_with_deferred(
        self, job_id: str, before: ResizeState | None, facts: Sequence[Fact], after: ResizeState
    ) -> None:
        """Write a transition now, with what was deferred; when the last deferred one is
        the same job's (a grow's launch, then its commit), as one entry, as
        :meth:`_defer_entry` joins them: its state is written once."""
        last = self._deferred[-1] if self._deferred else None
        if last is not None and last.job_id == job_id:
            self._deferred.pop()
            before, facts = last.before, [*last.facts, *facts]
        self._commit([_entry(job_id, before, facts, after)])

    def _commit(self, entries: list[Entry]) -> None:
        """Write the deferred entries, then ``entries``, in one transaction."""
        deferred, self._deferred = self._deferred, []
        self._batched = {}
        batch = [_entry(d.job_id, d.before, d.facts, d.after) for d in deferred] + entries
        try:
            self.journal.commit(batch)
        except BaseException as exc:
            self._failed = exc
            raise

    def _store(self, state: ResizeState) -> None:
        job_id = state.job_id
        self._version += 1
        if not state.live:
            self.states.pop(job_id, None)
            self._busy.discard(job_id)
            if state.requeued:
                self._held.add(job_id)
            else:
                self._held.discard(job_id)
            return
        if self._held:
            self._held.discard(job_id)  # tracked again: its next run
        self.states[job_id] = state
        if state.pending is not None or state.change is not None:
            self._busy.add(job_id)
        else:
            self._busy.discard(job_id)

    def _execute(self, effects: Sequence[engine.Effect]) -> None:
        ctl = self.controller
        for effect in effects:
            if isinstance(effect, engine.Reserve):
                if effect.tasks:
                    ctl.reserve_slots(effect.job_id, effect.tasks)
            elif isinstance(effect, engine.Free):
                if effect.task_ids:
                    ctl.free_slots(effect.job_id, effect.task_ids)
            elif isinstance(effect, engine.Launch):
                if effect.tasks:
                    state = self.states[effect.job_id]
                    after = joined(state.tasks, effect.tasks)
                    # Only a resizable job changes size (hence resizable=True, here and
                    # in the notification's environment).
                    ctl.launch_tasks(
                        effect.job_id,
                        effect.tasks,
                        allocation_env(after, state.version + 1, resizable=True),
                    )
            elif isinstance(effect, engine.Stop):
                if effect.task_ids:
                    ctl.stop_tasks(effect.job_id, effect.task_ids, self.settings.stop_grace)
            elif isinstance(effect, engine.Notify):
                self._notify(effect)
            elif isinstance(effect, engine.DrainUntil):
                wake_at(ctl, effect.deadline)
            elif isinstance(effect, engine.CommitAllocation):
                ctl.commit_allocation(effect.job_id, effect.tasks, effect.version)
                if effect.record is not None:
                    job = ctl.get_job(effect.job_id)
                    if job is not None:
                        self.policy.committed(job, effect.record)

    def _notify(self, effect: engine.Notify) -> None:
        ctl = self.controller
        job = ctl.get_job(effect.job_id)
        state = self.states.get(effect.job_id)
        if job is None or state is None or not state.tasks:
            return
        env: dict[str, str] = dict(job.env)
        version = state.version + 1 if effect.version is None else effect.version
        env.update(allocation_env(effect.after, version, resizable=True))
        env.update(
            {
                "LSB_JOBID": job.id,
                "XCE_JOB_ID": job.id,
                "LSB_RESIZE_EVENT": effect.kind.value,
                "LSB_RESIZE_HOSTS": format_hosts(effect.delta),
                # Which tasks, not only how many per host: a framework retires exactly
                # these workers (docs/user-guide.md, "The notification command").
                "XCE_RESIZE_TASK_IDS": ",".join(str(t.id) for t in effect.delta),
                "LSB_RESIZE_NOTIFY_OK": NOTIFY_OK,
                "LSB_RESIZE_NOTIFY_FAIL": NOTIFY_FAIL,
            }
        )
        ctl.run_notification(
            effect.job_id,
            effect.attempt,
            state.tasks[0].host,
            effect.command,
            env,
            self.settings.notify_timeout,
        )
