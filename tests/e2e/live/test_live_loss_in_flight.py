"""A host failure that ends a job while one of the job's changes is in flight, on the
live controller with real agents and processes: the job ends EXIT once its processes
on the other hosts are gone, and the change that completes meanwhile changes nothing
(docs/live-controller.md, "Lost agents and failed hosts"; found by the soak test).
Every process is found and killed by its pid."""

from __future__ import annotations

import os
import signal
from typing import Any

from xce_resize_plugin.testing.live import ALICE, LiveCluster, alive, wait_until

#: Tasks slow to stop after SIGTERM: task 1 (stopped by the job's end) takes 12 s, the
#: others 2 s (task 2, stopped by the release, is gone while the job is still ending).
SLOW_STOP = (
    'if [ "$XCE_TASK_ID" = 1 ]; then d=12; else d=2; fi; '
    'trap "sleep $d; exit 0" TERM; sleep 600 & wait'
)


def _task_state(live: LiveCluster, job_id: str, tid: int) -> str:
    return str(live.job(job_id)["tasks"][tid]["state"])


def test_a_release_that_completes_while_a_host_failure_ends_the_job(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 1, "h2": 2}, stop_grace=30.0)
    # The job's end waits for task 1 to exit on its own (within the kill grace).
    live.config.write_text(live.config.read_text().replace("kill_grace = 0.5", "kill_grace = 30"))
    live.start()
    job_id = live.submit(
        command=["/bin/sh", "-c", SLOW_STOP], tasks="1,3", alloc={"h1": 1, "h2": 2}, resizable=True
    )
    pids = {t["id"]: t["pid"] for t in live.running(job_id, 3)["tasks"]}
    try:
        assert live.release(job_id, task_ids=[2], no_notify=True).status_code == 202
        wait_until(lambda: live.phase(job_id) == "SHRINK_STOPPING", 15, "the release stopping")

        # Task 0's host fails: the job cannot survive; its task 1 is stopped, and task
        # 2's stop for the release completes while the job is still ending.
        os.kill(int(live.cluster()["hosts"]["h1"]["worker"]["pid"]), signal.SIGKILL)
        wait_until(lambda: _task_state(live, job_id, 2) == "EXITED", 15, "task 2 stopped")
        job = live.job(job_id)
        assert job["state"] == "RUN" and job["ending"] is not None, job
        assert live.cluster()["problems"] == []
        # The allocation it had at the failure stays until the end, held but the lost
        # task's slot; the release is not committed.
        assert job["version"] == 0 and [t["id"] for t in job["held"]] == [1, 2], job
        # A controller restarted meanwhile resumes the end (the plugin re-issues the
        # release's commit: it changes nothing either).
        live.crash()
        live.start()
        job = wait_until(lambda: (j := live.job(job_id))["state"] == "EXIT" and j, 30, "EXIT")
        assert job["exit_reason"] == "host failure" and job["held"] == []
        assert [p for p in pids.values() if alive(p)] == []
        logs = live.logs()
        assert "Traceback" not in logs and "ContractViolation" not in logs, logs
        assert live.cluster()["problems"] == []
        # The cluster goes on: every slot is free again and a new job runs on all.
        wait_until(lambda: live.cluster()["hosts"]["h1"]["worker"]["ready"], 15, "h1 back")
        other = live.submit(ALICE, tasks=3)
        live.running(other, 3)
        live.check_consistent(other)
    finally:
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
