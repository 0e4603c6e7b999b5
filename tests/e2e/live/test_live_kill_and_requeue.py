"""A kill and a host failure's requeue that overlap, on the live controller with real
processes: whichever comes second, a killed job ends ``EXIT`` (killed) and does not
run again, and the plugin's journal stays consistent (docs/failover.md, "A requeued
job"; docs/live-controller.md, ``DELETE /v1/jobs/{id}``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from xce_resize_plugin.journal import compaction
from xce_resize_plugin.journal.verification import verify
from xce_resize_plugin.testing.live import ALICE, ROOT, LiveCluster, alive, wait_until

POLICY = str(Path(__file__).resolve().parents[3] / "hooks" / "requeue_on_host_failure.py")
RESIZE = {"stop_grace": 0.5, "notify_timeout": 5.0, "policy_files": [POLICY]}
# Tasks that ignore SIGTERM: their stop takes kill_grace, the window both tests need.
STUBBORN = ["/bin/sh", "-c", "trap '' TERM; exec sleep 600"]


def _cluster(tmp_path: Path) -> LiveCluster:
    live = LiveCluster(tmp_path, {"h1": 1, "h2": 1, "h3": 1}, RESIZE)
    live.config.write_text(live.config.read_text().replace("kill_grace = 0.5", "kill_grace = 3"))
    return live


def _head_host(job: dict[str, Any]) -> str:
    return str(next(t["host"] for t in job["tasks"] if t["id"] == 0))


def _ended(live: LiveCluster, job_id: str) -> dict[str, Any]:
    return dict(
        wait_until(
            lambda: (j := live.job(job_id))["state"] != "RUN" and j, 20, f"job {job_id} ended"
        )
    )


def _check_journal(live: LiveCluster, tracked: bool) -> None:
    journal = live.state / "resize"
    assert verify(journal).ok
    # Nothing is held for a next run: a tracked job's facts go with compaction.
    assert (compaction.compact(journal, keep_days=0, now=1e10) > 0) is tracked


def test_a_kill_while_a_requeue_is_under_way_ends_the_job(tmp_path: Path) -> None:
    live = _cluster(tmp_path)
    try:
        live.start()
        job_id = live.submit(tasks=2, alloc={"h1": 1, "h2": 1}, command=STUBBORN)
        job = live.running(job_id, 2)
        pids = [t["pid"] for t in job["tasks"]]
        down = live.ok("POST", f"/v1/hosts/{_head_host(job)}/down", ROOT)
        assert down["jobs"] == {job_id: "requeue"}
        assert live.job(job_id)["ending"] == {"state": "PEND", "reason": "host failure"}
        assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
        ended = _ended(live, job_id)
        assert (ended["state"], ended["exit_reason"], ended["requeues"]) == (
            "EXIT",
            "killed by alice",
            0,
        )
        time.sleep(1)  # it does not start again
        assert live.job(job_id)["state"] == "EXIT"
        assert not any(alive(pid) for pid in pids) and live.task_processes(job_id) == {}
        assert live.cluster()["problems"] == []
    finally:
        live.cleanup()
    _check_journal(live, tracked=False)  # a rigid job: the plugin never tracked it


def test_a_host_failure_during_a_kill_does_not_requeue(tmp_path: Path) -> None:
    """The failure's answer says ``exit``: the kill stands. The plugin, told first by
    the site's policy to requeue (its run's state ended and held for a next run),
    lets the hold go at the job's end, which used to fail the controller's cycle."""
    live = _cluster(tmp_path)
    try:
        live.start()
        job_id = live.submit(
            tasks="1,3", alloc={"h1": 1, "h2": 1}, resizable=True, command=STUBBORN
        )
        live.running(job_id, 2)
        assert live.grow(job_id, 1, no_notify=True).status_code < 300
        job = live.idle(job_id, 1)
        assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
        down = live.ok("POST", f"/v1/hosts/{_head_host(job)}/down", ROOT)
        assert down["jobs"] == {job_id: "exit"}
        ended = _ended(live, job_id)
        assert (ended["state"], ended["exit_reason"], ended["requeues"]) == (
            "EXIT",
            "killed by alice",
            0,
        )
        assert live.task_processes(job_id) == {}
        assert live.cluster()["problems"] == []
        assert "controller cycle failed" not in live.logs()
    finally:
        live.cleanup()
    _check_journal(live, tracked=True)
