"""A finished job the host has dropped (``finished_job_keep``) keeps its resize history
in the plugin's journal, also through compaction: ``xce_acct_job`` gives the job as the journal
recorded it, and the history route shows it to whom the ``view`` policy shows that job
(docs/live-controller.md, "Finished jobs"). Real LMDB journal, embedded controller."""

from __future__ import annotations

from pathlib import Path

import pytest
from attrs import evolve

from xce_resize_plugin.controllers.sim import EmbeddedController
from xce_resize_plugin.core.accounting import job_of_record
from xce_resize_plugin.core.models import GrowRequest, JobState, ResizeState, Task
from xce_resize_plugin.errors import NoJob
from xce_resize_plugin.host import HostHooks, Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.journal.compaction import compact
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.rest.resize_handlers import Hooks

CONFIG = {"journal_sync": False, "stop_grace": 0}
ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal("root", admin=True)


def _controller(tmp_path: Path) -> EmbeddedController:
    pm = get_plugin_manager(CONFIG, entry_points=False)
    return EmbeddedController(pm, tmp_path, hosts=[("h1", 4)], config=CONFIG, strict=True)


def test_hook_xce_acct_job_gives_a_dropped_jobs_record_for_its_history(tmp_path: Path) -> None:
    ctl = _controller(tmp_path)
    grown = ctl.submit("alice", "1,3", runtime=100, resizable=True, alloc={"h1": 1})
    plain = ctl.submit("alice", 1, runtime=100)  # never resized: nothing journalled
    ctl.settle()
    ctl.advance(10)
    ctl.request_resize(ALICE, grown, GrowRequest(min_add=2, max_add=2))
    ctl.settle()
    assert len(ctl.job(grown).tasks) == 3
    hooks, host = Hooks(ctl), HostHooks(ctl.plugin_manager)
    # A job the host knows is not the journal's to answer for.
    assert host.acct_job(ctl, grown) is None  # type: ignore[arg-type]
    before = hooks.viewed_history(ALICE, grown)
    ctl.run()
    ended = ctl.job(grown)
    assert ended.state is JobState.DONE
    dropped = ctl.forget_finished(before=ctl.now())
    assert {j.id for j in dropped} == {grown, plain}
    assert ctl.get_job(grown) is None

    record = host.acct_job(ctl, grown)  # type: ignore[arg-type]
    assert record is not None
    assert (record.id, record.user, record.state) == (grown, "alice", JobState.DONE)
    assert (record.min_tasks, record.max_tasks, record.resizable) == (1, 3, True)
    assert [t.id for t in record.tasks] == [0, 1, 2]
    assert (record.start_time, record.end_time) == (ended.start_time, ended.end_time)

    # The owner and an admin read the whole history; anyone else gets the answer of a
    # job that does not exist, as for a job the host knows.
    for who in (ALICE, ADMIN):
        usage = hooks.viewed_history(who, grown)
        assert usage.records == before.records and len(usage.records) == 1
        last = usage.segments[-1]
        assert (last.slots, last.end) == (3, ended.end_time)
    with pytest.raises(NoJob):
        hooks.viewed_history(BOB, grown)
    # A job the journal never held, and an id never given, stay unknown.
    with pytest.raises(NoJob):
        hooks.viewed_history(ALICE, plain)
    with pytest.raises(NoJob):
        hooks.viewed_history(ADMIN, "999")
    # Only the history reads the journal: the other routes answer as for any unknown job.
    with pytest.raises(NoJob):
        hooks.viewed_status(ALICE, grown)
    ctl.stop()

    # Compaction removes the job's facts, not its final state and history; a new
    # controller on the same state directory (nothing in memory) answers as before.
    assert compact(tmp_path / "resize", keep_days=0, now=1e9) > 0
    again = _controller(tmp_path)
    hooks = Hooks(again)
    assert hooks.viewed_history(ALICE, grown).records == before.records
    with pytest.raises(NoJob):
        hooks.viewed_history(BOB, grown)
    again.stop()


def test_who_may_see_a_dropped_job_is_decided_without_reading_its_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job is looked up for any caller before the view policy runs: only its final
    state is read (one record, not its resize records and timeline, which any user
    could otherwise have the controller read and decode for someone else's job)."""
    ctl = _controller(tmp_path)
    job = ctl.submit("alice", "1,3", runtime=50, resizable=True, alloc={"h1": 1})
    ctl.settle()
    ctl.request_resize(ALICE, job, GrowRequest(min_add=1, max_add=1))
    ctl.run()
    ctl.forget_finished(before=ctl.now())

    def no_history(self: Journal, job_id: str) -> None:
        raise AssertionError("the history was read")

    monkeypatch.setattr(Journal, "state", no_history)
    record = HostHooks(ctl.plugin_manager).acct_job(ctl, job)  # type: ignore[arg-type]
    assert record is not None and record.user == "alice"
    with pytest.raises(NoJob):
        Hooks(ctl).viewed_history(BOB, job)
    ctl.stop()


def test_a_running_job_has_no_record_of_its_own() -> None:
    state = ResizeState("7", "alice", 1, 4, (Task(0, "h1"),), started_at=5.0)
    assert job_of_record(state) is None
    job = job_of_record(evolve(state, ended_at=9.0))
    assert job is not None and (job.end_time, job.tasks) == (9.0, (Task(0, "h1"),))
