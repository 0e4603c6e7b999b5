"""Finished jobs dropped after a while (:meth:`EmbeddedController.forget_finished`, what
the live controller's ``[controller] finished_job_keep`` runs on; docs/live-controller.md,
"Jobs and tasks"): gone from memory, the views and the store, their ids never given
again, also after a restart on the same store."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from tests.conftest import Recorder, make_pm
from xce_resize_plugin import hookimpl
from xce_resize_plugin.controllers.sim import EmbeddedController, MemoryStore
from xce_resize_plugin.controllers.store import LmdbStore
from xce_resize_plugin.controllers.violations import SubmissionRejected, UnknownJob
from xce_resize_plugin.core.models import JobState
from xce_resize_plugin.host import Controller


def _ctl(state: Path, store: MemoryStore | Literal["lmdb"] = "lmdb") -> EmbeddedController:
    return EmbeddedController(make_pm(Recorder()), state, {"h1": 2}, store=store)


def _stored_ids(state: Path) -> set[str]:
    store = LmdbStore(state / "embedded")
    try:
        snapshot = store.load()
        assert snapshot is not None
        return {job.id for job, _ in snapshot.jobs}
    finally:
        store.close()


def test_due_jobs_are_dropped_from_memory_views_and_store(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ctl = _ctl(state)
    early = ctl.submit("alice", 1, runtime=10)  # ends at 10
    late = ctl.submit("alice", 1, runtime=30)  # ends at 30
    running = ctl.submit("bob", 1)  # runs until killed; pends while the others run
    ctl.advance(12)
    assert ctl.job(early).state is JobState.DONE

    assert ctl.forget_finished(before=5.0) == []  # nothing ended that early
    dropped = ctl.forget_finished(before=ctl.now() - 1)
    assert [job.id for job in dropped] == [early]
    ctl.flush()

    assert ctl.get_job(early) is None and ctl.record(early) is None
    with pytest.raises(UnknownJob):
        ctl.job(early)
    assert {j.id for j in ctl.jobs()} == {late, running}
    assert ctl.check_invariants() == []
    ctl.close()
    assert _stored_ids(state) == {late, running}


def test_a_dropped_jobs_id_is_not_given_again_after_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ctl = _ctl(state)
    first = ctl.submit("alice", 1, runtime=1)
    # An explicit id above the counter (how the live controller names its jobs).
    explicit = ctl.submit("alice", 1, runtime=1, job_id="150")
    ctl.advance(5)
    dropped = ctl.forget_finished(before=ctl.now())
    assert sorted(job.id for job in dropped) == sorted([first, explicit])
    ctl.flush()
    ctl.close()

    again = _ctl(state)  # the same store: nothing of the dropped jobs is left
    assert again.jobs() == []
    new = again.submit("alice", 1)
    assert int(new) > 150
    with pytest.raises(SubmissionRejected, match="already in use"):
        again.submit("alice", 1, job_id=new)
    again.close()


def test_a_job_is_dropped_only_once_its_end_is_reported(tmp_path: Path) -> None:
    class Crashy:
        @hookimpl
        def xce_job_end(self, controller: Controller, job_id: str) -> None:
            raise RuntimeError("controller process dies here")

    store = MemoryStore()
    ctl = EmbeddedController(make_pm(Crashy()), tmp_path, {"h1": 2}, store=store)
    job_id = ctl.submit("alice", 1, runtime=1)
    with pytest.raises(RuntimeError, match="dies here"):
        ctl.advance(5)
    assert ctl.job(job_id).state is JobState.DONE  # ended, its end not reported
    assert ctl.forget_finished(ctl.now() + 100) == []
    ctl.close()

    # Failover: the new controller reports the end, then drops the job in its time.
    again = _ctl(tmp_path, store)
    assert again.forget_finished(again.now() - 10) == []
    assert [job.id for job in again.forget_finished(again.now())] == [job_id]
    again.flush()
    again.close()
    third = _ctl(tmp_path, store)
    assert third.jobs() == []
    third.close()


def test_keep_and_limit_hold_due_jobs_back_for_a_later_call(tmp_path: Path) -> None:
    ctl = _ctl(tmp_path, MemoryStore())
    a = ctl.submit("alice", 1, runtime=1)
    b = ctl.submit("alice", 1, runtime=2)
    c = ctl.submit("alice", 1, runtime=3)
    ctl.advance(5)
    held = ctl.forget_finished(ctl.now(), limit=1, keep=lambda job_id: job_id == a)
    assert [job.id for job in held] == [b]
    assert ctl.record(a) is not None  # kept back, still queued
    assert [job.id for job in ctl.forget_finished(ctl.now())] == [a, c]
    ctl.close()


def test_a_new_controller_on_the_same_store_drops_what_is_due(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ctl = _ctl(state)
    job_id = ctl.submit("alice", 1, runtime=1)
    ctl.advance(5)
    ctl.close()  # a crash, or a failover: nothing dropped yet

    again = _ctl(state)
    assert again.forget_finished(0.5) == []  # it ended at 1
    assert [job.id for job in again.forget_finished(again.now())] == [job_id]
    again.flush()
    again.close()
    assert _stored_ids(state) == set()


def test_a_users_finished_jobs_beyond_the_most_are_dropped_earliest_first(
    tmp_path: Path,
) -> None:
    """``forget_finished_over`` (the live controller's ``finished_job_max``): each user
    over the bound loses their earliest ended jobs, down to the bound; others keep all."""
    state = tmp_path / "state"
    ctl = EmbeddedController(make_pm(Recorder()), state, {"h1": 8}, store="lmdb")
    alice = [ctl.submit("alice", 1, runtime=r) for r in (40, 10, 30, 20, 50)]
    bob = [ctl.submit("bob", 1, runtime=r) for r in (5, 15)]
    running = ctl.submit("alice", 1)  # not finished: never counted, never dropped
    ctl.advance(60)

    assert ctl.forget_finished_over(5) == []  # alice has 5, bob 2
    assert [j.id for j in ctl.forget_finished_over(3, limit=1)] == [alice[1]]  # ended at 10
    # What `keep` names stays (a job still ending on the live controller) and counts:
    # the next earliest goes instead, and a later call drops it in its turn.
    kept = {alice[3]}.__contains__
    assert [j.id for j in ctl.forget_finished_over(3, keep=kept)] == [alice[2]]
    assert [j.id for j in ctl.forget_finished_over(2)] == [alice[3]]
    ctl.flush()
    left = {j.id for j in ctl.jobs()}
    assert left == {alice[0], alice[4], running, *bob}
    # 0: none kept. Users by name, each user's earliest ended first.
    assert [j.id for j in ctl.forget_finished_over(0)] == [alice[0], alice[4], *bob]
    ctl.flush()
    assert ctl.check_invariants() == []
    ctl.close()
    assert _stored_ids(state) == {running}
    with pytest.raises(ValueError, match="most must be >= 0"):
        _ctl(tmp_path / "other").forget_finished_over(-1)


def test_a_restarted_controller_counts_each_users_finished_jobs_again(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ctl = _ctl(state)
    jobs = [ctl.submit("alice", 1, runtime=r) for r in (3, 1)]
    ctl.advance(2)
    jobs.append(ctl.submit("alice", 1, runtime=1))  # ends at 3, after jobs[1] (at 1)
    ctl.advance(5)
    ctl.flush()
    ctl.close()

    again = _ctl(state)
    assert [j.id for j in again.forget_finished_over(1)] == [jobs[1], jobs[0]]
    again.flush()
    again.close()
    assert _stored_ids(state) == {jobs[2]}
