"""Autoresizable jobs on the live controller with real agents and processes: the
command lines (``xce-resize submit -ar``, ``modify``, ``jobs``, ``bresize``), the demand
placed with the notification command run for real, and the flag and demand after the
controller is killed with SIGKILL (docs/user-guide.md, docs/failover.md)."""

from __future__ import annotations

import json
from typing import Any

from xce_resize_plugin.testing.live import BOB, LiveCluster, wait_until

from .test_live_clients import cli

NOTIFY = 'echo "$LSB_RESIZE_EVENT $LSB_RESIZE_HOSTS"; exit 0'


def _job_id(stdout: str) -> str:
    return stdout.split("<")[1].split(">")[0]


def _settled(live: LiveCluster, job_id: str, version: int) -> dict[str, Any]:
    """The job at ``version`` with no change in flight (its demand may pend)."""

    def check() -> dict[str, Any] | None:
        job = live.job(job_id)
        resize = job["resize"]
        return job if job["version"] == version and resize["in_flight"] is None else None

    return dict(wait_until(check, 15, f"job {job_id} settled at version {version}"))


def test_autoresize_from_the_command_line(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    blocker = live.submit(tasks=3, alloc={"h1": 2, "h2": 1}, token=BOB)
    live.running(blocker, 3)
    # -ar is autoresize (bsub -ar), and a range is required for it.
    proc = cli(live, "submit", "-n", "4", "-ar", "--", "sleep", "60")
    assert proc.returncode == 2, proc.stdout
    assert "--autoresize needs a task range -n MIN,MAX" in proc.stderr
    # The same over REST: refused, naming what is wrong; nothing is submitted.
    for body, words in (
        ({"tasks": 4, "autoresize": True}, "autoresize needs a task range"),
        ({"tasks": "1,4", "autoresize": True, "resizable": False}, "implies resizable"),
        ({"tasks": "1,4", "autoresize": "yes"}, "@ $.autoresize"),
    ):
        r = live.call("POST", "/v1/jobs", body={"command": ["true"], **body})
        assert r.status_code == 400 and words in r.json()["detail"], r.text
    assert [j["id"] for j in live.ok("GET", "/v1/jobs")["jobs"]] == []
    proc = cli(live, "submit", "-n", "1,4", "-ar", "--rnc", NOTIFY, "--", "sleep", "60")
    assert proc.returncode == 0, proc.stderr
    job_id = _job_id(proc.stdout)
    job = _settled(live, job_id, 0)
    live.running(job_id, 1)
    assert job["resizable"] is True
    assert job["resize"]["autoresize"] is True
    assert (job["resize"]["demand"]["min"], job["resize"]["demand"]["max"]) == (1, 3)
    listing = cli(live, "jobs").stdout.splitlines()
    assert "AUTO" in listing[0]
    assert any(line.split()[0] == job_id and "+1-3" in line.split() for line in listing)
    shown = cli(live, "jobs", job_id).stdout
    assert "autoresize demand of 1 to 3 task(s); autoresize on" in shown
    # A manual request is refused while the demand pends, as any pending request.
    proc = cli(live, "request", "1", job_id, tool="bresize")
    assert proc.returncode == 255
    assert "Cannot resize job because there is a pending resize request" in proc.stderr
    # Off and on again (bmod -arn / -ar).
    proc = cli(live, "modify", job_id, "--no-autoresize")
    assert proc.returncode == 0 and f"Parameters of job <{job_id}> are being changed" in proc.stdout
    assert live.job(job_id)["resize"]["autoresize"] is False
    proc = cli(live, "modify", job_id, "-ar", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["demand"]["max"] == 3
    proc = cli(live, "modify", job_id, "--no-autoresize", token=BOB)
    assert proc.returncode == 255 and "No matching job found" in proc.stderr
    # Slots free up: the demand takes them, running the notification command.
    assert live.call("DELETE", f"/v1/jobs/{blocker}", BOB).status_code == 202
    job = live.idle(job_id, 1)
    live.running(job_id, 4)
    notes = [n for n in live.job(job_id)["notifications"] if n["status"] == 0]
    assert notes and notes[-1]["stdout"].startswith("grow ")
    assert job["resize"]["demand"] is None  # at MAX
    history = json.loads(cli(live, "history", job_id, "--json").stdout)
    assert history["autoresize"] is True and history["demand"] is None
    assert [r["type"] for r in history["records"]] == ["grow"]
    live.check_consistent(job_id)


def test_flag_and_demand_survive_sigkill(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    blocker = live.submit(tasks=2, alloc={"h2": 2}, token=BOB)
    live.running(blocker, 2)
    job_id = live.submit(tasks="1,4", alloc={"h1": 1}, autoresize=True)
    # h1's other slot is free: the demand takes it at once, then waits for h2.
    job = _settled(live, job_id, 1)
    assert (job["resize"]["demand"]["min"], job["resize"]["demand"]["max"]) == (1, 2)
    live.running(job_id, 2)
    live.crash()
    live.start()
    job = live.job(job_id)
    assert job["resize"]["autoresize"] is True
    assert job["resize"]["demand"]["max"] == 2 and job["resize"]["phase"] == "GROW_PENDING"
    live.check_consistent(job_id)
    # Off, then killed again: it stays off.
    assert live.call("PATCH", f"/v1/jobs/{job_id}", body={"autoresize": False}).status_code == 200
    live.crash()
    live.start()
    job = live.job(job_id)
    assert job["resize"]["autoresize"] is False and job["resize"]["pending"] is None
    # On again, and the recovered demand is placed once slots free up.
    assert live.call("PATCH", f"/v1/jobs/{job_id}", body={"autoresize": True}).status_code == 200
    live.crash()
    live.start()
    assert live.call("DELETE", f"/v1/jobs/{blocker}", BOB).status_code == 202
    job = live.idle(job_id, 2)
    assert len(job["allocation"]) == 4
    live.running(job_id, 4)
    live.check_consistent(job_id)
