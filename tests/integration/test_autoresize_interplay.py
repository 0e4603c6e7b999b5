"""Autoresizable jobs meeting the other involuntary changes of issue #11: a failed
host (the job shrinks, then grows back elsewhere), an evacuation (it releases, then
grows back elsewhere) and a reclaim for the queue head (it gives tasks up and stays
autoresizable, and its demand waits until the head has started)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from xce_resize_plugin.scenarios.result import ScenarioResult

Run = Callable[[Mapping[str, Any]], ScenarioResult]


def _records(result: ScenarioResult, job_id: str) -> list[tuple[float, str, dict[str, int]]]:
    return [(r["time"], r["type"], dict(r["after"])) for r in result.jobs[job_id]["resize_records"]]


def _host(at: float, name: str, state: str, **kw: Any) -> dict[str, Any]:
    return {"at": at, "user": "root", "host": {"name": name, "state": state, **kw}}


def _h3_frees_at_50(command: dict[str, Any]) -> dict[str, Any]:
    """Job 101 (autoresizable, 2..4) runs on h1 and h2, bob's job holds h3 until 50;
    ``command`` changes h2 at 10."""
    return {
        "cluster": {"hosts": {"h1": 2, "h2": 2, "h3": 2}},
        "users": {"admins": ["root"]},
        "jobs": [
            {"id": "100", "user": "bob", "tasks": 2, "runtime": 50, "alloc": {"h3": 2}},
            {
                "id": "101",
                "user": "alice",
                "tasks": "2,4",
                "runtime": 1000,
                "autoresize": True,
                "alloc": {"h1": 2, "h2": 2},
            },
        ],
        "commands": [command],
        "scenario": {"until": 100},
    }


def test_a_failed_host_shrinks_an_autoresizable_job_which_grows_back_elsewhere(
    resize_scenario: Run,
) -> None:
    result = resize_scenario(_h3_frees_at_50(_host(10, "h2", "down")))
    records = _records(result, "101")
    # At 10 it lost h2's two tasks (a host_failure shrink, the demand comes back);
    # at 50 h3 freed up and the demand took it; h2 is still down.
    assert [(t, kind) for t, kind, _ in records] == [(10.0, "shrink"), (50.0, "grow")]
    assert result.jobs["101"]["resize_records"][0]["reason"] == "host_failure"
    assert records[-1][2] == {"h1": 2, "h3": 2}
    assert result.jobs["101"]["autoresize"] is True and result.jobs["101"]["demand"] is None
    assert result.host_states["h2"] == "unavail" and result.hosts["h2"]["used"] == 0
    assert result.problems == ()


def test_an_evacuated_autoresizable_job_releases_and_grows_back_elsewhere(
    resize_scenario: Run,
) -> None:
    result = resize_scenario(_h3_frees_at_50(_host(10, "h2", "closed", evacuate=True)))
    records = _records(result, "101")
    assert [(t, kind) for t, kind, _ in records] == [(10.0, "shrink"), (50.0, "grow")]
    assert records[0][2] == {"h1": 2} and records[-1][2] == {"h1": 2, "h3": 2}
    assert result.jobs["101"]["autoresize"] is True
    assert result.host_states["h2"] == "closed" and result.hosts["h2"]["used"] == 0
    assert result.problems == ()


def test_a_reclaimed_autoresizable_job_stays_autoresizable(resize_scenario: Run) -> None:
    table = {
        "cluster": {"hosts": {"h1": 4, "h2": 4}},
        "resize": {"reclaim": "shrink"},
        "jobs": [
            {"id": "101", "user": "alice", "tasks": "2,8", "runtime": 1000, "autoresize": True},
            {"id": "102", "user": "bob", "tasks": 4, "runtime": 30, "submit": 10},
        ],
        "scenario": {"until": 100},
    }
    result = resize_scenario(table)
    job = result.jobs["101"]
    kinds = [(t, kind, sum(after.values())) for t, kind, after in _records(result, "101")]
    # Reclaimed at 10 (8 -> 4 tasks) so that 102 starts at once; grown back when it ends.
    assert kinds == [(10.0, "shrink", 4), (40.0, "grow", 8)]
    assert result.jobs["102"]["start_time"] == 10.0
    assert job["autoresize"] is True and job["demand"] is None
    assert result.problems == ()


def test_a_pending_demand_follows_the_size_a_failure_left(resize_scenario: Run) -> None:
    """Its demand was 1..2 more while it ran 4 of 6 tasks; after losing 2 it is 1..4."""
    from xce_resize_plugin.core.facts import GrowRequested

    table = {
        "cluster": {"hosts": {"h1": 2, "h2": 2}},
        "users": {"admins": ["root"]},
        "jobs": [
            {"id": "101", "user": "alice", "tasks": "2,6", "runtime": 1000, "autoresize": True},
        ],
        "commands": [_host(10, "h2", "down")],
        "scenario": {"until": 20},
    }
    result = resize_scenario(table)
    demands = [
        (f.at, f.max_add) for _, f in result.facts if isinstance(f, GrowRequested) and f.auto
    ]
    assert demands == [(0.0, 2), (10.0, 4)]
    assert result.jobs["101"]["demand"] == {"min": 1, "max": 4}


def test_a_requeued_autoresizable_job_is_autoresizable_again(resize_scenario: Run) -> None:
    """Task 0's host fails and the site requeues the job: its next run keeps its
    autoresize flag and demand (its earlier run's ended state must not hide it)."""
    from pathlib import Path

    requeue = Path(__file__).resolve().parents[2] / "hooks" / "requeue_on_host_failure.py"
    table = {
        "cluster": {"hosts": {"h1": 2, "h2": 2, "h3": 2}},
        "users": {"admins": ["root"]},
        "resize": {"policy_files": [str(requeue)]},
        "jobs": [
            {
                "id": "101",
                "user": "alice",
                "tasks": "2,4",
                "runtime": 1000,
                "autoresize": True,
                "alloc": {"h1": 2, "h2": 2},
            },
        ],
        "commands": [_host(10, "h1", "down")],
        "scenario": {"until": 100},
    }
    result = resize_scenario(table)
    job = result.jobs["101"]
    assert job["state"] == "RUN" and job["start_time"] == 10.0
    assert sum(job["hosts"].values()) == 4 and "h1" not in job["hosts"]
    assert job["autoresize"] is True
    assert result.problems == ()
