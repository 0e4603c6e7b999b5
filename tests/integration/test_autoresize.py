"""Autoresizable jobs (LSF's ``bsub -ar``; docs/user-guide.md, "Autoresizable jobs"):
scenario runs of every rule, the refusals, and the flag and demand after a restart on
a real LMDB journal."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pluggy
import pytest

from xce_resize_plugin import errors, hookspecs
from xce_resize_plugin.core.facts import AutoresizeSet, GrowRequested
from xce_resize_plugin.core.models import (
    AutoresizeRequest,
    CancelRequest,
    GrowRequest,
    JobState,
    ReleaseRequest,
)
from xce_resize_plugin.recording.replay import replay
from xce_resize_plugin.scenarios import files, runner
from xce_resize_plugin.scenarios.result import ScenarioResult
from xce_resize_plugin.scenarios.timeline import render
from xce_resize_plugin.testing.sim import SimControllers

from .harness import Harness

Run = Callable[[Mapping[str, Any]], ScenarioResult]


def _job(job_id: str, user: str, tasks: int | str, runtime: float, **kw: Any) -> dict[str, Any]:
    return {"id": job_id, "user": user, "tasks": tasks, "runtime": runtime, **kw}


def _auto(job_id: str = "101", tasks: str = "2,6", submit: float = 1, **kw: Any) -> dict[str, Any]:
    return _job(job_id, "alice", tasks, 1000, autoresize=True, submit=submit, **kw)


def _demands(result: ScenarioResult, job_id: str) -> list[tuple[float, int]]:
    """The autoresize demands decided for the job: (time, most tasks)."""
    return [
        (f.at, f.max_add)
        for _, f in result.facts
        if isinstance(f, GrowRequested) and f.job_id == job_id and f.auto
    ]


def _switches(result: ScenarioResult, job_id: str) -> list[tuple[bool, str]]:
    return [
        (f.enabled, f.reason)
        for _, f in result.facts
        if isinstance(f, AutoresizeSet) and f.job_id == job_id
    ]


def _grows(result: ScenarioResult, job_id: str) -> list[tuple[float, int]]:
    """(time, tasks after) of the job's committed grows."""
    return [
        (r["time"], sum(r["after"].values()))
        for r in result.jobs[job_id]["resize_records"]
        if r["type"] == "grow"
    ]


# --- the demand ------------------------------------------------------------------------


def test_demand_is_placed_when_slots_free_up(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4, "h2": 4}},
        "jobs": [_job("100", "bob", 4, 100), _auto(notify_cmd="exit 0")],
        "scenario": {"until": 50},
    }
    early = resize_scenario(table)
    job = early.jobs["101"]
    # Started with the 4 free slots; the rest (1..2 more) pends as its demand.
    assert job["state"] == "RUN" and sum(job["hosts"].values()) == 4
    assert job["autoresize"] is True
    assert job["demand"] == {"min": 1, "max": 2} == job["pending_grow"]
    assert job["resize_phase"] == "GROW_PENDING"
    table["scenario"] = {"until": 500}
    later = resize_scenario(table)
    # bob's job ended at 100: the demand took its slots, with the notification command.
    assert _grows(later, "101") == [(100.0, 6)]
    assert [(n["job"], n["time"], n["status"]) for n in later.notifications] == [("101", 100.0, 0)]
    assert later.jobs["101"]["demand"] is None  # at MAX: none
    assert later.jobs["101"]["autoresize"] is True
    assert _switches(later, "101") == [(True, "submit")]
    assert later.problems == ()


def test_demand_is_recomputed_after_every_commit(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4}},
        "jobs": [
            _job("100", "bob", 1, 10),
            _job("102", "bob", 1, 20),
            _job("103", "bob", 1, 30),
            _auto(tasks="1,4"),
        ],
        "commands": [{"at": 40, "user": "alice", "bresize": "release 2*h1 101"}],
        "scenario": {"until": 45},
    }
    result = resize_scenario(table)
    # One slot at a time frees up: each grow takes it, and the demand is made again
    # for what is left, until MAX; the release (allowed although the job is
    # autoresizable) brings it back for the two released tasks.
    assert _grows(result, "101") == [(10.0, 2), (20.0, 3), (30.0, 4), (40.0, 4)]
    assert _demands(result, "101") == [(1.0, 3), (10.0, 2), (20.0, 1), (40.0, 2)]
    assert result.commands[0].exit == 0
    assert [r["type"] for r in result.jobs["101"]["resize_records"]] == [
        "grow",
        "grow",
        "grow",
        "shrink",
        "grow",
    ]
    assert result.jobs["101"]["demand"] is None
    assert result.problems == ()


def test_demand_never_takes_the_blocked_heads_slots(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4, "h2": 4}},
        "jobs": [
            _job("100", "bob", 4, 100),
            _job("102", "dave", 2, 300),
            _auto(tasks="2,8", submit=1),
            # The head of the queue from t=2: 6 slots, which it has when dave's job
            # ends at 300. bob's 4 slots free at 100 are not enough for it, and the
            # demand must leave them: taking them would delay the head to alice's end.
            _job("103", "carol", 6, 50, submit=2),
        ],
        "scenario": {"until": 200},
    }
    result = resize_scenario(table)
    assert _grows(result, "101") == []
    assert result.jobs["101"]["demand"] == {"min": 1, "max": 6}
    table["scenario"] = {"until": 400}
    later = resize_scenario(table)
    assert later.jobs["103"]["start_time"] == 300.0
    # carol's job ended at 350: now the demand takes the slots.
    assert _grows(later, "101") == [(350.0, 8)]
    assert later.problems == ()


def test_demand_keeps_the_jobs_span_rules_and_limits(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4, "h2": 4, "h3": 4}},
        "limits": {"user_slots": {"alice": 5}},
        "jobs": [_auto(tasks="2,12", submit=0, ptile=2, alloc={"h1": 2})],
        "scenario": {"until": 10},
    }
    result = resize_scenario(table)
    # ptile 2: at most 2 tasks per host; alice's limit of 5 slots stops it at 5.
    assert result.jobs["101"]["hosts"] == {"h1": 2, "h2": 2, "h3": 1}
    assert result.jobs["101"]["demand"] == {"min": 1, "max": 7}
    assert result.problems == ()


# --- requests, cancel and modify ---------------------------------------------------------


def _busy_cluster(*commands: dict[str, Any]) -> dict[str, Any]:
    """alice's autoresizable 101 runs 2 of 2..6 tasks with a demand of 1..4 pending
    (bob holds the other slots all along)."""
    return {
        "cluster": {"hosts": {"h1": 4, "h2": 2}},
        "users": {"admins": ["root"]},
        "jobs": [_job("100", "bob", 4, 5000), _auto(submit=1)],
        "commands": list(commands),
        "scenario": {"until": 100},
    }


def test_request_is_refused_while_the_demand_pends(resize_scenario: Run) -> None:
    result = resize_scenario(_busy_cluster({"at": 5, "user": "alice", "bresize": "request 1 101"}))
    refused = result.commands[0]
    assert refused.exit == 255 and refused.code == "LSBE_RESIZE_PENDING_REQUEST"
    assert "Cannot resize job because there is a pending resize request" in refused.message
    job = result.jobs["101"]
    assert job["autoresize"] is True and job["demand"] == {"min": 1, "max": 4}


def test_request_with_c_replaces_the_demand_and_ends_autoresize(resize_scenario: Run) -> None:
    result = resize_scenario(
        _busy_cluster({"at": 5, "user": "alice", "bresize": "request -c 1,2 101"})
    )
    assert result.commands[0].exit == 0
    job = result.jobs["101"]
    assert job["autoresize"] is False and job["demand"] is None
    assert job["pending_grow"] == {"min": 1, "max": 2}
    assert _switches(result, "101") == [(True, "submit"), (False, "request")]


def test_cancel_removes_the_demand_and_ends_autoresize(resize_scenario: Run) -> None:
    result = resize_scenario(_busy_cluster({"at": 5, "user": "alice", "bresize": "cancel 101"}))
    assert result.commands[0].exit == 0
    job = result.jobs["101"]
    assert job["autoresize"] is False and job["pending_grow"] is None
    assert job["resize_phase"] == "IDLE"
    assert _switches(result, "101") == [(True, "submit"), (False, "cancel")]


def test_modify_turns_autoresize_off_and_on(resize_scenario: Run) -> None:
    off = {"at": 5, "user": "alice", "modify": {"job": "101", "autoresize": False}}
    on = {"at": 7, "user": "root", "modify": {"job": "101", "autoresize": True}}
    result = resize_scenario(_busy_cluster(off))
    assert result.commands[0].exit == 0
    assert result.jobs["101"]["autoresize"] is False
    assert result.jobs["101"]["pending_grow"] is None
    result = resize_scenario(_busy_cluster(off, on))
    assert [c.exit for c in result.commands] == [0, 0]
    assert result.jobs["101"]["autoresize"] is True
    assert result.jobs["101"]["demand"] == {"min": 1, "max": 4}
    assert _switches(result, "101") == [(True, "submit"), (False, "modify"), (True, "modify")]
    assert _demands(result, "101") == [(1.0, 4), (7.0, 4)]
    text = render(result)
    assert "alice$ xce-resize modify 101 --no-autoresize" in text
    assert "root$ xce-resize modify 101 --autoresize" in text
    assert "job 101 (alice) (autoresizable) starts on" in text
    assert "job 101: autoresize off (modify)" in text
    assert "job 101: autoresize demand of 1..4 tasks pending" in text


def test_a_recording_with_modify_requests_replays_to_the_same_facts(tmp_path: Path) -> None:
    """A modify's request line reads back (a recording with one was refused as
    malformed: "request must be an object whose type is grow, release, ...")."""
    off = {"at": 5, "user": "alice", "modify": {"job": "101", "autoresize": False}}
    on = {"at": 7, "user": "root", "modify": {"job": "101", "autoresize": True}}
    table = {**_busy_cluster(off, on), "resize": {"journal_sync": False}}
    scenario = files.parse(table, tmp_path / "<scenario>")
    out = tmp_path / "run.jsonl"
    with open(out, "w", encoding="utf-8") as record:
        result = runner.run(scenario, tmp_path / "s", record)
    assert _switches(result, "101") == [(True, "submit"), (False, "modify"), (True, "modify")]
    assert '"type":"modify"' in out.read_text()
    replayed = replay(out, tmp_path / "replay")
    assert replayed.ok, replayed.problems
    assert replayed.facts == len(result.facts)


def test_modify_turns_autoresize_on_for_a_resizable_job(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4, "h2": 4}},
        "jobs": [_job("101", "alice", "1,6", 1000, resizable=True, alloc={"h1": 1})],
        "commands": [{"at": 3, "user": "alice", "modify": {"job": "101", "autoresize": True}}],
        "scenario": {"until": 10},
    }
    result = resize_scenario(table)
    assert result.commands[0].exit == 0
    assert _grows(result, "101") == [(3.0, 6)]
    assert result.jobs["101"]["autoresize"] is True


@pytest.mark.parametrize(
    ("command", "code"),
    [
        # not the owner (nor an administrator)
        ({"user": "mallory", "modify": {"job": "101", "autoresize": False}}, "LSBE_PERMISSION"),
        ({"user": "alice", "modify": {"job": "999", "autoresize": False}}, "LSBE_NO_JOB"),
        # bob's 100 is rigid: it has no range to grow in
        ({"user": "bob", "modify": {"job": "100", "autoresize": True}}, "LSBE_JOB_RESIZABLE"),
        # a pending job cannot change yet
        ({"user": "carol", "modify": {"job": "102", "autoresize": True}}, "LSBE_NOT_STARTED"),
    ],
)
def test_modify_refusals_change_nothing(
    resize_scenario: Run, command: dict[str, Any], code: str
) -> None:
    table = _busy_cluster({"at": 5, **command})
    table["jobs"].append(_job("102", "carol", "1,8", 10, resizable=True, submit=2))
    result = resize_scenario(table)
    assert (result.commands[0].exit, result.commands[0].code) == (255, code)
    assert _switches(result, "101") == [(True, "submit")]
    assert result.jobs["101"]["demand"] == {"min": 1, "max": 4}


def test_modify_of_a_finished_job_is_refused(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.ctl.submit("alice", "1,4", runtime=10, autoresize=True, alloc={"hA": 1}, job_id="1")
    h.ctl.run(until=20)
    assert h.ctl.job("1").state is JobState.DONE
    before = h.snapshot()
    for enabled in (True, False):
        with pytest.raises(errors.JobFinished, match="Job has already finished"):
            h.request("alice", "1", AutoresizeRequest(enabled))
    assert h.snapshot() == before


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"tasks": 4, "autoresize": True}, "jobs[0].autoresize: needs a task range"),
        ({"tasks": "3,3", "autoresize": True}, "jobs[0].autoresize: needs a task range"),
        ({"tasks": "1,3", "autoresize": "yes"}, "jobs[0].autoresize: must be true or false"),
        (
            {"tasks": "1,3", "autoresize": True, "resizable": False},
            "jobs[0].autoresize: implies resizable",
        ),
    ],
)
def test_bad_autoresize_in_a_scenario_file(
    resize_scenario: Run, job: dict[str, Any], message: str
) -> None:
    table = {"cluster": {"hosts": {"h1": 4}}, "jobs": [{"user": "alice", **job}]}
    with pytest.raises(errors.ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        resize_scenario(table)


@pytest.mark.parametrize(
    ("modify", "message"),
    [
        ({"job": "101"}, "modify.autoresize: missing"),
        ({"job": "101", "autoresize": 1}, "modify.autoresize: missing or not true/false"),
        ({"autoresize": True}, "modify.job: missing"),
        ({"job": "101", "autoresize": True, "tasks": 2}, "modify.tasks: unknown key"),
    ],
)
def test_bad_modify_command(resize_scenario: Run, modify: dict[str, Any], message: str) -> None:
    table = _busy_cluster({"at": 5, "user": "alice", "modify": modify})
    with pytest.raises(errors.ConfigError, match=message):
        resize_scenario(table)


def test_autoresize_without_a_range_is_refused_at_submission(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    for tasks in (4, "3,3"):
        with pytest.raises(errors.InvalidRequest, match="autoresize needs a task range"):
            h.ctl.submit("alice", tasks, autoresize=True)
    assert h.ctl.jobs() == []


# --- the engine's rules, directly -----------------------------------------------------


def test_a_release_needs_no_c_and_the_demand_regrows(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4)])
    h.ctl.submit("alice", "1,4", runtime=1000, autoresize=True, alloc={"hA": 2}, job_id="1")
    h.ctl.submit("bob", 2, runtime=1000, alloc={"hA": 2}, job_id="2")
    h.ctl.settle()
    status = h.ctl.resize_status("1")
    assert status is not None and status.demand is not None and status.autoresize
    # The demand is the plugin's, not a request: a release goes ahead without -c, and
    # the demand made after it takes the released slot back at once.
    h.request("alice", "1", ReleaseRequest(task_ids=(1,)))
    usage = h.ctl.acct_usage("1")
    assert usage is not None
    assert [r.kind.value for r in usage.records] == ["shrink", "grow"]
    assert [t.id for t in h.ctl.job("1").tasks] == [0, 2]
    status = h.ctl.resize_status("1")
    assert status is not None and status.autoresize
    assert status.demand is not None and status.demand.max_add == 2
    assert usage.autoresize and usage.demand == status.demand


def test_a_demand_whose_notification_keeps_failing_ends_autoresize(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4)], config={"notify_max_failures": 2})
    h.ctl.submit(
        "alice", "1,4", runtime=1000, autoresize=True, alloc={"hA": 1}, notify_cmd="exit 1"
    )
    h.ctl.settle()
    status = h.ctl.resize_status("101")
    # Refused twice by the application: given up, and autoresize with it (it would
    # only be refused again); the job keeps its allocation.
    assert status is not None and not status.autoresize and status.pending is None
    assert len(h.ctl.notifications("101")) == 2
    assert len(h.ctl.job("101").tasks) == 1
    h.request("alice", "101", AutoresizeRequest(True))
    assert len(h.ctl.notifications("101")) == 4  # on again: tried again


# --- failover ----------------------------------------------------------------------------


def test_flag_and_demand_survive_a_crash(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4)])
    h.ctl.submit("bob", 3, runtime=100, alloc={"hA": 3}, job_id="1")
    h.ctl.submit("alice", "1,4", runtime=1000, autoresize=True, job_id="2")
    h.ctl.settle()
    before = h.ctl.resize_status("2")
    assert before is not None and before.demand is not None
    h.crash_and_restart()
    after = h.ctl.resize_status("2")
    assert after == before
    h.ctl.run(until=150)
    assert len(h.ctl.job("2").tasks) == 4  # the recovered demand is placed
    # Turned off, then a crash: it stays off.
    h.request("alice", "2", ReleaseRequest(count=2))
    h.request("alice", "2", AutoresizeRequest(False))
    h.crash_and_restart()
    status = h.ctl.resize_status("2")
    assert status is not None and not status.autoresize and status.pending is None


def test_hook_xce_job_start_again_after_restart(tmp_path: Path) -> None:
    """A start the plugin never heard of (the controller died between the job's start
    and the hook, here: the plugin was not registered) is reported again at the next
    start: the job gets its demand."""
    bare = SimControllers(tmp_path, {})
    pm = pluggy.PluginManager("xce")
    pm.add_hookspecs(hookspecs)
    ctl = bare(hosts=[("hA", 4)], pm=pm)
    ctl.submit("bob", 3, runtime=100, alloc={"hA": 3}, job_id="1")
    ctl.submit("alice", "1,4", runtime=1000, autoresize=True, job_id="2")
    ctl.settle()
    assert ctl.job("2").state is JobState.RUN
    ctl.close()
    h = Harness(tmp_path, hosts=[("hA", 4)])
    status = h.ctl.resize_status("2")
    assert status is not None and status.autoresize and status.demand is not None
    assert (status.demand.min_add, status.demand.max_add) == (1, 3)
    h.ctl.run(until=150)
    assert len(h.ctl.job("2").tasks) == 4


def test_hook_xce_job_start(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.ctl.submit("alice", "1,8", runtime=10, resizable=True, alloc={"hA": 1}, job_id="1")
    h.ctl.submit("alice", "1,8", runtime=10, autoresize=True, alloc={"hA": 1}, job_id="2")
    h.ctl.settle()
    # Only the autoresizable job is tracked from its start; it grows to MAX at once.
    assert h.journal_state("1") is None and h.journal_state("2") is not None
    assert len(h.ctl.job("1").tasks) == 1 and len(h.ctl.job("2").tasks) == 8
    status = h.ctl.resize_status("2")
    assert status is not None and status.autoresize and status.demand is None
    with pytest.raises(errors.BadSlots):
        h.request("alice", "2", GrowRequest(1, 1))  # at MAX nothing is pending
    with pytest.raises(errors.NoActiveRequest):
        h.request("alice", "2", CancelRequest())
