"""The live controller keeps a bounded past per job (docs/live-controller.md, "What a
job's record keeps"): an elastic job resized again and again shows its newest ended
tasks and notification runs, and the journal still has every resize."""

from __future__ import annotations

from typing import Any

from xce_resize_plugin.controllers.live.generations import HISTORY_KEPT
from xce_resize_plugin.testing.live import ALICE, LiveCluster


def test_a_job_resized_more_times_than_kept_shows_its_newest_past(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    job_id = live.submit(tasks="1,2", initial=1, resizable=True, notify_cmd="true")
    live.running(job_id, 1)
    version = 0
    cycles = HISTORY_KEPT // 2 + 2  # two notifications and one ended task a cycle
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
