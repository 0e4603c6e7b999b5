"""A job's target size on the embedded controller with the real plugin and a real LMDB
journal (docs/in-job-api.md, "A target size"): scenario runs of the rules and their
interplay with manual changes, autoresize and host failures; a crash and restart; the
journal verified and a recording replayed."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xce_resize_plugin.core import audit
from xce_resize_plugin.core.facts import GrowRequested, ReleaseAccepted, TargetSet
from xce_resize_plugin.core.models import TargetRequest
from xce_resize_plugin.recording.replay import replay
from xce_resize_plugin.scenarios import files, runner
from xce_resize_plugin.scenarios.result import ScenarioResult
from xce_resize_plugin.scenarios.timeline import render

from .harness import Harness

Run = Callable[[Mapping[str, Any]], ScenarioResult]


def _job(job_id: str, user: str, tasks: int | str, runtime: float, **kw: Any) -> dict[str, Any]:
    return {"id": job_id, "user": user, "tasks": tasks, "runtime": runtime, **kw}


def _cmd(at: float, **kw: Any) -> dict[str, Any]:
    return {"at": at, "user": kw.pop("user", "alice"), **kw}


def _table(*commands: dict[str, Any], until: float = 200, **job: Any) -> dict[str, Any]:
    """bob's rigid job fills h2 until t=50; alice's job 101 runs 2 of 1..8 on h1."""
    return {
        "cluster": {"hosts": {"h1": 4, "h2": 4, "h3": 4}},
        "jobs": [
            _job("100", "bob", 8, 50, alloc={"h2": 4, "h3": 4}),
            _job("101", "alice", "1,8", 1000, resizable=True, alloc={"h1": 2}, **job),
        ],
        "commands": list(commands),
        "scenario": {"until": until},
    }


def _sizes(result: ScenarioResult, job_id: str = "101") -> list[tuple[float, str, int]]:
    return [
        (r["time"], r["type"], sum(r["after"].values()))
        for r in result.jobs[job_id]["resize_records"]
    ]


def _targets(result: ScenarioResult, job_id: str = "101") -> list[tuple[int | None, str]]:
    return [
        (None if f.target is None else f.target.tasks, f.reason)
        for _, f in result.facts
        if isinstance(f, TargetSet) and f.job_id == job_id
    ]


def test_up_when_slots_free_then_down_with_the_preferred_tasks(resize_scenario: Run) -> None:
    result = resize_scenario(
        _table(
            _cmd(5, target={"job": "101", "tasks": 7}),
            _cmd(100, target={"job": "101", "tasks": 3, "release_prefer": [6, 5]}),
        )
    )
    # 2 slots free on h1 at once, the other 3 when bob's job ends at 50.
    assert _sizes(result) == [(5.0, "grow", 4), (50.0, "grow", 7), (100.0, "shrink", 3)]
    shrink = result.jobs["101"]["resize_records"][-1]
    assert {5, 6} <= set(shrink["delta_tasks"]) and 0 not in shrink["delta_tasks"]
    assert result.jobs["101"]["target"] == {"tasks": 3, "release_prefer": [6, 5]}
    assert result.jobs["101"]["pending_grow"] is None
    assert [c.exit for c in result.commands] == [0, 0]
    assert result.problems == ()
    text = render(result)
    assert "alice$ xce-resize target 101 3 --prefer 6,5" in text
    assert "job 101: target 3 tasks, release 6,5 first" in text
    assert "job 101: target demand of 1..3 tasks pending" in text


def test_a_manual_release_takes_over_and_autoresize_replaces_the_target(
    resize_scenario: Run,
) -> None:
    result = resize_scenario(
        _table(
            _cmd(5, target={"job": "101", "tasks": 8}),
            _cmd(6, bresize="request 1 101"),  # refused: the target's grow pends
            _cmd(60, bresize="release 2*h1 101"),
            _cmd(70, target={"job": "101", "tasks": 4}),
            _cmd(80, modify={"job": "101", "autoresize": True}),
            autoresize=False,
        )
    )
    assert [(c.exit, c.code) for c in result.commands] == [
        (0, None),
        (255, "LSBE_RESIZE_PENDING_REQUEST"),
        (0, None),
        (0, None),
        (0, None),
    ]
    assert _targets(result) == [(8, "set"), (None, "release"), (4, "set"), (None, "autoresize")]
    # 8 reached at 50; the manual release cleared the target, so the job stays at 6
    # (no grow back) until the target of 4 releases 2 more; autoresize then grows it.
    sizes = _sizes(result)
    assert sizes[:3] == [(5.0, "grow", 4), (50.0, "grow", 8), (60.0, "shrink", 6)]
    assert sizes[3] == (70.0, "shrink", 4)
    assert sizes[-1][2] == 8 and result.jobs["101"]["autoresize"] is True
    assert "target" not in result.jobs["101"]
    assert result.problems == ()


def test_a_host_failure_is_followed_by_a_grow_back_to_the_target(resize_scenario: Run) -> None:
    table = _table(
        _cmd(60, target={"job": "101", "tasks": 6}),
        _cmd(70, user="admin", host={"name": "h2", "state": "down"}),
    )
    table["users"] = {"admins": ["admin"]}
    result = resize_scenario(table)
    # The grow put tasks 4 and 5 on h2; lost with it, they are grown back on h3.
    assert _sizes(result) == [(60.0, "grow", 6), (70.0, "shrink", 4), (70.0, "grow", 6)]
    lost = result.jobs["101"]["resize_records"][1]
    assert lost["reason"] == "host_failure" and lost["delta"] == {"h2": 2}
    assert result.jobs["101"]["hosts"] == {"h1": 4, "h3": 2}
    assert sum(result.jobs["101"]["hosts"].values()) == 6
    assert result.problems == ()


def test_a_target_survives_a_crash_and_is_reached_after_it(tmp_path: Path) -> None:
    h = Harness(tmp_path, hosts=[("hA", 4), ("hB", 4)])
    blocker = h.ctl.submit("bob", 4, alloc={"hB": 4}, runtime=100)
    job = h.ctl.submit("alice", "1,8", resizable=True, alloc={"hA": 2})
    h.ctl.settle()
    status = h.request("alice", job, TargetRequest(7, (1,)))
    assert status.target is not None and status.target.tasks == 7
    assert len(h.ctl.job(job).tasks) == 4  # the 2 free slots of hA taken at once
    ctl = h.crash_and_restart()
    status = ctl.resize_status(job)
    assert status is not None and status.target is not None
    assert (status.target.tasks, status.target.release_prefer) == (7, (1,))
    assert status.pending is not None and status.pending.max_add == 3
    ctl.run(until=200)  # bob's job ends at 100: the restarted controller converges
    assert ctl.job(blocker).state.value == "DONE"
    assert len(ctl.job(job).tasks) == 7
    status = ctl.resize_status(job)
    assert status is not None and status.pending is None and status.target is not None
    ctl.stop()


def test_the_journal_verifies_and_a_recording_replays_to_the_same_facts(
    tmp_path: Path,
) -> None:
    table = _table(
        _cmd(5, target={"job": "101", "tasks": 7}),
        _cmd(100, target={"job": "101", "tasks": 2, "release_prefer": [3]}),
        _cmd(150, target={"job": "101", "clear": True}),
        until=200,
    )
    table["resize"] = {"journal_sync": False}
    scenario = files.parse(table, tmp_path / "<scenario>")
    out = tmp_path / "run.jsonl"
    with open(out, "w", encoding="utf-8") as record:
        result = runner.run(scenario, tmp_path / "s", record)
    assert _targets(result) == [(7, "set"), (2, "set"), (None, "clear")]
    assert any(isinstance(f, ReleaseAccepted) and f.principal == "target" for _, f in result.facts)
    assert any(isinstance(f, GrowRequested) and f.principal == "target" for _, f in result.facts)
    assert audit.replay_problems(tmp_path / "s" / "resize") == []
    replayed = replay(out, tmp_path / "replay")
    assert replayed.ok, replayed.problems
    assert replayed.facts == len(result.facts)
