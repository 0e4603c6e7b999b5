"""``release_exited`` on the embedded controller with a real LMDB journal: a task that
exits on its own leaves the allocation (a shrink, reason ``task_exit``), a task the
controller stops does not count, a job without the option keeps its allocation, and the
journal replays and verifies (docs/in-job-api.md, "Readiness and exits")."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from xce_resize_plugin.controllers.sim import EmbeddedController, SubmissionRejected
from xce_resize_plugin.core import converters
from xce_resize_plugin.core.audit import replay_problems
from xce_resize_plugin.core.models import ReleaseRequest
from xce_resize_plugin.errors import ConfigError, ResizeError
from xce_resize_plugin.host import HostHooks, Principal
from xce_resize_plugin.journal import Journal
from xce_resize_plugin.manager import get_plugin_manager
from xce_resize_plugin.rest.schemas import SCHEMAS
from xce_resize_plugin.scenarios.files import parse

CONFIG = {"journal_sync": False, "stop_grace": 0}


def _controller(tmp_path: Path) -> EmbeddedController:
    pm = get_plugin_manager(CONFIG, entry_points=False)
    hosts = [("h1", 4), ("h2", 4)]
    return EmbeddedController(pm, tmp_path, hosts=hosts, config=CONFIG, strict=True)


def test_a_task_that_exits_leaves_the_allocation(tmp_path: Path) -> None:
    ctl = _controller(tmp_path)
    dropping = ctl.submit(
        "alice", "2,6", resizable=True, release_exited=True, alloc={"h1": 2, "h2": 2}
    )
    keeping = ctl.submit("alice", "1,4", resizable=True, alloc={"h1": 2, "h2": 2})
    ctl.settle()
    ctl.advance(10.0)
    ctl.inject_task_exit(dropping, 3, status=0, reason="done")
    ctl.inject_task_exit(keeping, 3, status=1, reason="crashed")
    ctl.settle()
    job = ctl.job(dropping)
    assert [t.id for t in job.tasks] == [0, 1, 2] and job.version == 1
    assert [t.id for t in job.held] == [0, 1, 2]  # no longer charged
    usage = ctl.acct_usage(dropping)
    assert usage is not None
    record = usage.records[-1]
    assert (record.reason, [t.id for t in record.delta]) == ("task_exit", [3])
    # Without the option nothing changes: the exited task stays, charged.
    assert [t.id for t in ctl.job(keeping).held] == [0, 1, 2, 3]
    assert ctl.job(keeping).version == 0
    # A release's own stops are the release's, not exits: a shrink with no reason.
    ctl.request_resize(Principal("alice"), dropping, ReleaseRequest(task_ids=(2,)))
    ctl.settle()
    assert [t.id for t in ctl.job(dropping).tasks] == [0, 1]
    # Below min_tasks (2) too: the task is gone; the job goes on.
    ctl.inject_task_exit(dropping, 1, status=0)
    ctl.settle()
    job = ctl.job(dropping)
    assert [t.id for t in job.tasks] == [0] and job.state.value == "RUN"
    usage = ctl.acct_usage(dropping)
    assert usage is not None
    assert [r.reason for r in usage.records] == ["task_exit", None, "task_exit"]
    # The history route's answer is one its own OpenAPI schema allows (the schema named
    # only host_failure as a reason).
    answer = converters.history_json(usage)
    jsonschema.validate(answer, {**SCHEMAS["ResizeHistory"], "components": {"schemas": SCHEMAS}})
    # The job is told, with the reason (docs/in-job-api.md, "Job events").
    told = HostHooks(ctl.plugin_manager).resize_events(ctl, dropping, 0)  # type: ignore[arg-type]
    assert told is not None
    lost = [e.data for e in told if e.type == "tasks_lost"]
    assert [(d["task_ids"], d["reason"]) for d in lost] == [([3], "task_exit"), ([1], "task_exit")]
    # Each exit is told with its status first, the first one too (the job was not
    # tracked yet: that one came as a tasks_lost alone, its status lost).
    exited = [(e.data["task_ids"], e.data["status"]) for e in told if e.type == "tasks_exited"]
    # Task 2 was stopped by the release (SIGTERM: 143).
    assert exited == [([3], 0), ([2], 143), ([1], 0)]
    assert [e.type for e in told][:3] == ["tasks_exited", "tasks_lost", "size_changed"]
    assert ctl.check_invariants() == []
    ctl.stop()
    assert replay_problems(tmp_path / "resize") == []


def test_the_jobs_end_is_not_a_release(tmp_path: Path) -> None:
    ctl = _controller(tmp_path)
    job_id = ctl.submit("alice", "1,4", resizable=True, release_exited=True, runtime=50)
    ctl.settle()
    ctl.run()
    usage = ctl.acct_usage(job_id)
    assert usage is not None and usage.records == ()
    ctl.stop()


def test_release_exited_needs_a_resizable_job(tmp_path: Path) -> None:
    ctl = _controller(tmp_path)
    with pytest.raises((ResizeError, SubmissionRejected), match="release_exited needs a resizable"):
        ctl.submit("alice", 2, release_exited=True)
    ctl.stop()
    data = {
        "cluster": {"hosts": {"h1": 2}},
        "jobs": [{"id": "1", "user": "alice", "tasks": 1, "release_exited": True}],
    }
    with pytest.raises(ConfigError, match="release_exited: needs resizable = true"):
        parse(data, tmp_path / "inline.toml")


def test_a_failed_host_is_told_as_lost_tasks(tmp_path: Path) -> None:
    """The events name a failed host's tasks with the reason host_failure, then the
    smaller size (a job the plugin did not track before: the loss tracks it)."""
    ctl = _controller(tmp_path)
    job_id = ctl.submit("alice", "1,6", resizable=True, alloc={"h1": 2, "h2": 2})
    ctl.settle()
    ctl.advance(5.0)
    ctl.host_down("h2")
    ctl.settle()
    told = HostHooks(ctl.plugin_manager).resize_events(ctl, job_id, 0)  # type: ignore[arg-type]
    assert told is not None
    kinds = [(e.type, e.data.get("reason"), e.data.get("host")) for e in told]
    assert kinds[:2] == [("tasks_lost", "host_failure", "h2"), ("size_changed", None, None)]
    assert told[0].data["task_ids"] == [2, 3] and told[1].data["tasks_after"] == 2
    ctl.stop()


def test_a_crashed_task_of_a_job_never_resized_is_told(tmp_path: Path) -> None:
    """Without release_exited the task stays allocated, but the job hears of its exit
    even before any resize: the plugin starts tracking it then; a rigid job's exits
    and a resizable job whose tasks run on write nothing."""
    ctl = _controller(tmp_path)
    crashed = ctl.submit("alice", "1,4", resizable=True, alloc={"h1": 2, "h2": 2})
    quiet = ctl.submit("alice", "1,4", resizable=True, alloc={"h1": 1})
    rigid = ctl.submit("alice", "1", alloc={"h2": 1})
    ctl.settle()
    ctl.advance(10.0)
    ctl.inject_task_exit(crashed, 2, status=3, reason="exit 3")
    ctl.settle()
    hooks = HostHooks(ctl.plugin_manager)
    told = hooks.resize_events(ctl, crashed, 0)  # type: ignore[arg-type]
    assert told is not None
    assert [(e.type, e.data["task_ids"], e.data["status"]) for e in told] == [
        ("tasks_exited", [2], 3)
    ]
    assert [t.id for t in ctl.job(crashed).held] == [0, 1, 2, 3]  # still charged
    ctl.inject_task_exit(rigid, 0, status=0)
    ctl.settle()
    assert hooks.resize_events(ctl, quiet, 0) == []  # type: ignore[arg-type]
    assert hooks.resize_events(ctl, rigid, 0) == []  # type: ignore[arg-type]
    ctl.stop()
    assert replay_problems(tmp_path / "resize") == []
    with Journal.open(tmp_path / "resize", readonly=True) as journal:
        assert {job for _, job, _ in journal.facts()} == {crashed}
