"""Host failure as an involuntary shrink, and drains, as scenarios (docs/failover.md,
"Host failure"; docs/scenarios.md, "Host commands")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from xce_resize_plugin.errors import ConfigError
from xce_resize_plugin.scenarios.result import ScenarioResult
from xce_resize_plugin.testing.sim import run_scenario

ROOT = Path(__file__).resolve().parents[2]
REQUEUE = str(ROOT / "hooks" / "requeue_on_host_failure.py")


def scenario(
    jobs: list[dict[str, Any]],
    commands: list[dict[str, Any]],
    *,
    until: float = 5000,
    resize: dict[str, Any] | None = None,
    hosts: dict[str, int] | None = None,
) -> dict[str, Any]:
    return {
        "cluster": {"hosts": hosts or {"hA": 4, "hB": 4, "hC": 4}},
        "users": {"admins": ["root"]},
        "resize": resize or {},
        "scenario": {"until": until},
        "jobs": jobs,
        "commands": commands,
    }


def host(at: float, name: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"at": at, "user": "root", "host": {"name": name, "state": state, **extra}}


def run(tmp_path: Path, table: dict[str, Any]) -> ScenarioResult:
    result = run_scenario(table, tmp_path / "state", base_dir=ROOT)
    assert result.problems == ()
    return result


ELASTIC = {
    "id": "101",
    "user": "alice",
    "tasks": "2,12",
    "resizable": True,
    "alloc": {"hA": 2, "hB": 4},
    "runtime": 1000,
}


def test_a_resizable_job_shrinks_when_a_host_fails(tmp_path: Path) -> None:
    job = {**ELASTIC, "notify_cmd": 'echo "$LSB_RESIZE_EVENT $LSB_RESIZE_HOSTS"; exit 1'}
    result = run(tmp_path, scenario([job], [host(10, "hB", "down")]))
    out = result.jobs["101"]
    # The notification failed, and the shrink stands all the same: it is information.
    assert out["state"] == "DONE" and out["hosts"] == {"hA": 2}
    [record] = out["resize_records"]
    assert record["type"] == "shrink" and record["reason"] == "host_failure"
    assert record["time"] == 10 and record["delta"] == {"hB": 4}
    [note] = result.notifications
    assert note["status"] == 1 and note["stdout"].strip() == "shrink hB 4"
    # Charged 6 slots for 10 s, then 2 until the end at 1000 s.
    assert out["slot_seconds"] == 6 * 10 + 2 * 990
    assert result.hosts["hB"] == {"slots": 4, "used": 0}
    assert result.host_states["hB"] == "unavail"
    assert "job 101 shrunk" in result.commands[0].output


def test_a_rigid_job_ends_when_a_host_fails(tmp_path: Path) -> None:
    rigid = {"id": "102", "user": "bob", "tasks": 4, "alloc": {"hB": 4}, "runtime": 1000}
    result = run(tmp_path, scenario([rigid], [host(10, "hB", "down")]))
    out = result.jobs["102"]
    assert out["state"] == "EXIT" and out["exit_reason"] == "host failure"
    assert out["end_time"] == 10 and out["slot_seconds"] == 40


@pytest.mark.parametrize(
    ("alloc", "why"),
    [({"hB": 2, "hA": 2}, "task 0 on the failed host"), ({"hA": 2, "hB": 2}, "below min")],
)
def test_a_resizable_job_that_cannot_shrink_ends(
    tmp_path: Path, alloc: dict[str, int], why: str
) -> None:
    job = {**ELASTIC, "tasks": "3,12" if why == "below min" else "2,12", "alloc": alloc}
    result = run(tmp_path, scenario([job], [host(10, "hB", "down")]))
    assert result.jobs["101"]["state"] == "EXIT", why
    assert result.jobs["101"]["resize_records"] == []


def test_the_site_hook_requeues_a_job_that_cannot_shrink(tmp_path: Path) -> None:
    rigid = {"id": "102", "user": "bob", "tasks": 2, "alloc": {"hB": 2}, "runtime": 100}
    head = {**ELASTIC, "alloc": {"hB": 2, "hA": 2}, "tasks": "2,4"}  # task 0 on hB
    table = scenario([rigid, head], [host(10, "hB", "down")], resize={"policy_files": [REQUEUE]})
    result = run(tmp_path, table)
    for job_id, runtime in (("102", 100), ("101", 1000)):
        out = result.jobs[job_id]
        # Requeued at 10 s, started again at once on the hosts that are up, from scratch.
        assert out["state"] == "DONE" and out["start_time"] == 10
        assert out["end_time"] == 10 + runtime
        assert "hB" not in out["hosts"]
    assert "job 101 requeue" in result.commands[0].output


def test_a_pending_grow_survives_and_is_placed_elsewhere(tmp_path: Path) -> None:
    filler = {"id": "102", "user": "bob", "tasks": 4, "alloc": {"hC": 4}, "runtime": 50}
    grow = {"at": 5, "user": "alice", "bresize": "request 4 101"}
    table = scenario(
        [{**ELASTIC, "alloc": {"hA": 4, "hB": 2}}, filler], [grow, host(10, "hB", "down")]
    )
    result = run(tmp_path, table)
    out = result.jobs["101"]
    shrink, placed = out["resize_records"]
    assert shrink["reason"] == "host_failure" and shrink["after"] == {"hA": 4}
    # The grow waited for hC (hB is down), and got 4 tasks there at 50 s.
    assert placed["type"] == "grow" and placed["time"] == 50 and placed["delta"] == {"hC": 4}


def test_a_down_host_takes_no_task_until_it_is_up(tmp_path: Path) -> None:
    wide = {"id": "103", "user": "bob", "tasks": 12, "submit": 20, "runtime": 100}
    table = scenario([], [host(10, "hB", "down"), host(200, "hB", "up")])
    table["jobs"] = [wide]
    result = run(tmp_path, table)
    # 12 tasks need hB too: the job waits until it is up.
    assert result.jobs["103"]["start_time"] == 200


def test_a_closed_host_takes_no_new_task_and_its_jobs_go_on(tmp_path: Path) -> None:
    there = {"id": "102", "user": "bob", "tasks": 2, "alloc": {"hB": 2}, "runtime": 100}
    later = {"id": "103", "user": "bob", "tasks": 6, "submit": 20, "runtime": 100}
    table = scenario([there, later], [host(10, "hB", "closed"), host(300, "hB", "open")])
    table["cluster"]["hosts"] = {"hA": 4, "hB": 4}
    result = run(tmp_path, table)
    assert result.jobs["102"]["state"] == "DONE" and result.jobs["102"]["end_time"] == 100
    # 6 tasks fit only with hB: not while it is closed, even once 102 freed it.
    assert result.jobs["103"]["start_time"] == 300


@pytest.mark.parametrize(("verdict", "released"), [(0, True), (1, False)])
def test_evacuate_asks_resizable_jobs_to_release(
    tmp_path: Path, verdict: int, released: bool
) -> None:
    job = {**ELASTIC, "notify_cmd": f"exit {verdict}"}
    rigid = {"id": "102", "user": "bob", "tasks": 2, "alloc": {"hB": 0 + 2}, "runtime": 1000}
    table = scenario(
        [{**job, "alloc": {"hA": 2, "hB": 2}}, rigid], [host(10, "hB", "closed", evacuate=True)]
    )
    result = run(tmp_path, table)
    out = result.jobs["101"]
    assert out["hosts"] == ({"hA": 2} if released else {"hA": 2, "hB": 2})
    assert [r["type"] for r in out["resize_records"]] == (["shrink"] if released else [])
    assert all("reason" not in r for r in out["resize_records"])  # an ordinary release
    assert result.jobs["102"]["hosts"] == {"hB": 2}  # rigid: finishes there
    text = result.commands[0].output
    assert "job 101 asked to release 2 task(s)" in text and "job 102 stays" in text


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ({"at": 1, "user": "alice", "host": {"name": "hB", "state": "down"}}, "administrators"),
        (host(1, "hZ", "down"), "commands[0].host.name: no such host"),
        (host(1, "hB", "broken"), "commands[0].host.state: must be one of"),
        (host(1, "hB", "down", evacuate=True), 'only with state = "closed"'),
    ],
)
def test_bad_host_commands_name_the_key(
    tmp_path: Path, command: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match="commands\\[0\\]") as info:
        run_scenario(scenario([], [command]), tmp_path / "state", base_dir=ROOT)
    assert message in str(info.value)
    assert not (tmp_path / "state").exists()


def test_an_invalid_transition_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    result = run(tmp_path, scenario([ELASTIC], [host(10, "hB", "up"), host(20, "hB", "open")]))
    assert [c.exit for c in result.commands] == [255, 255]
    assert "not unavail" in result.commands[0].message
    assert "not closed" in result.commands[1].message
    assert result.jobs["101"]["hosts"] == {"hA": 2, "hB": 4}
    assert result.host_states == {"hA": "ok", "hB": "ok", "hC": "ok"}


def test_the_example_scenario_runs(tmp_path: Path) -> None:
    from xce_resize_plugin.scenarios import files, runner

    loaded = files.load(ROOT / "docs" / "examples" / "host_failure_and_drain.toml")
    result = runner.run(loaded, tmp_path / "state")
    assert result.problems == ()
    kinds = {
        (job_id, r["type"], r.get("reason"))
        for job_id, job in result.jobs.items()
        for r in job["resize_records"]
    }
    assert ("101", "shrink", "host_failure") in kinds  # the failure
    assert ("103", "shrink", None) in kinds  # the drain's release
    assert result.jobs["102"]["state"] == "EXIT"


def test_the_command_line_refuses_a_host_command_of_a_non_admin(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = tmp_path / "h.toml"
    bad.write_text(
        '[cluster]\nhosts = { hA = 2, hB = 2 }\n[users]\nadmins = ["root"]\n'
        '[[commands]]\nat = 1\nuser = "alice"\nhost = { name = "hB", state = "down" }\n'
    )
    argv = [sys.executable, "-m", "xce_resize_plugin.cli.main", "scenario", "run", str(bad)]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"xce-resize: Configuration error: {bad}: commands[0].host: only administrators "
        "([users] admins) may change hosts: alice"
    ]
