"""The live controller keeps a bounded past per job (docs/live-controller.md, "What a
job's record keeps"): an elastic job resized again and again shows its newest ended
tasks and notification runs, and the journal still has every resize."""

from __future__ import annotations

import json
from typing import Any

import httpx

from xce_resize_plugin.controllers.live.agent_client import AgentAuth
from xce_resize_plugin.controllers.live.generations import HISTORY_KEPT
from xce_resize_plugin.controllers.live.live_store import LiveStore
from xce_resize_plugin.controllers.live.worker import secret_path, worker_dir
from xce_resize_plugin.testing.live import ALICE, LiveCluster


def test_a_job_resized_more_times_than_kept_shows_its_newest_past(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,2", initial=1, resizable=True, notify_cmd="true")
    live.running(job_id, 1)
    version = 0
    cycles = HISTORY_KEPT + 4  # two notifications and one ended task a cycle
    for _ in range(cycles):
        assert live.grow(job_id, 1).status_code == 202
        version += 1
        live.idle(job_id, version)
        assert live.release(job_id, count=1).status_code == 202
        version += 1
        live.idle(job_id, version)
    job = live.job(job_id)
    ended = [t["id"] for t in job["tasks"] if t["state"] == "EXITED"]
    # One task grown and released a cycle, ids 1, 2, ...: the newest are kept.
    assert ended == list(range(cycles - len(ended) + 1, cycles + 1))
    assert len(ended) == min(cycles, HISTORY_KEPT)
    attempts = [n["attempt"] for n in job["notifications"]]
    assert attempts == list(range(2 * cycles - HISTORY_KEPT + 1, 2 * cycles + 1))
    # The journal has every resize: the job's history is whole.
    history = live.ok("GET", f"/v1/jobs/{job_id}/resize/history", ALICE)
    assert len(history["records"]) == 2 * cycles
    live.check_consistent(job_id)
    # The agents forget the dropped tasks, and the store their launch records: both
    # hold the task the job runs and the newest ended ones, no more.
    shown = {t["id"] for t in job["tasks"]}
    assert shown == {0, *ended}
    assert _agents_tasks(live, job_id) == shown
    live.crash()
    store = LiveStore(live.state / "controller", start=False)  # reads, takes no epoch
    try:
        launches = {int(k.rsplit(":", 1)[1]) for k in store.side if k.startswith(f"task:{job_id}:")}
    finally:
        store.close()
    assert launches == shown


def _agents_tasks(live: LiveCluster, job_id: str) -> set[int]:
    """The task ids of the job that its hosts' agents keep (their snapshots)."""
    secret = secret_path(live.state).read_text().strip()
    epoch = live.cluster()["epoch"]  # an older one is refused (fenced)
    found: set[int] = set()
    for host in ("h1", "h2"):
        port = json.loads((worker_dir(live.state, host) / "worker.json").read_text())["port"]
        snapshot = httpx.get(
            f"http://127.0.0.1:{port}/v1/snapshot?epoch={epoch}",
            auth=AgentAuth(secret),
            timeout=10,
        ).json()
        found |= {int(t["task"]) for t in snapshot["tasks"] if str(t["job"]) == job_id}
    return found
