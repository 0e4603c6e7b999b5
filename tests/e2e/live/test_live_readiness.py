"""Readiness and exits on the live controller, with real task processes
(docs/in-job-api.md, "Readiness and exits"): a grow with ``wait_ready`` is committed
only once its new tasks call ``ResizeClient.ready()``, also across a ``kill -9`` of the
controller during the wait; tasks not ready by the deadline are stopped; and a
``release_exited`` job drops a task that exits, so it stops being charged."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

from xce_resize_plugin.injob import Allocation, ResizeClient
from xce_resize_plugin.rest.client import Client
from xce_resize_plugin.testing.live import ALICE, LiveCluster, wait_until

# A new task (not task 0) says it is ready once the test creates the file GO_FILE, if
# its id is in READY_IDS (all when unset); every task then sleeps.
TASK = """
import os, pathlib, time
from xce_resize_plugin.injob import ResizeClient
tid = os.environ["XCE_TASK_ID"]
wanted = os.environ.get("READY_IDS")
if tid != "0" and (wanted is None or tid in wanted.split(",")):
    go = pathlib.Path(os.environ["GO_FILE"])
    while not go.exists():
        time.sleep(0.05)
    ResizeClient.from_env().ready()
time.sleep(600)
"""

# Task EXIT_ID exits with status 3 once GO_FILE exists; the others sleep.
EXITER = """
import os, pathlib, sys, time
if os.environ["XCE_TASK_ID"] == os.environ["EXIT_ID"]:
    go = pathlib.Path(os.environ["GO_FILE"])
    while not go.exists():
        time.sleep(0.05)
    sys.exit(3)
time.sleep(600)
"""


def _submit(live: LiveCluster, script: str, env: dict[str, str], **body: Any) -> tuple[str, str]:
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {"command": [sys.executable, "-c", script], "env": env, "resizable": True, **body},
    )
    return str(answer["id"]), str(answer["token"])


def _one_task(factory: Any, tmp_path: Path, **env: str) -> tuple[LiveCluster, Path, str, str]:
    """A live cluster of 2 hosts x 2 slots running a job of TASK (1..3 tasks) started
    with 1 task; its GO_FILE (not created yet), id and token."""
    live: LiveCluster = factory({"h1": 2, "h2": 2})
    live.start()
    go = tmp_path / "go"
    job_id, token = _submit(live, TASK, {"GO_FILE": str(go), **env}, tasks="1,3", initial=1)
    live.running(job_id, 1)
    return live, go, job_id, token


def _grow_in_background(
    live: LiveCluster, job_id: str, token: str, **options: Any
) -> tuple[threading.Thread, list[Allocation]]:
    """The job's own client asks for 2 more tasks with wait_ready and waits (wait=True)
    in a thread; the list gets the allocation the call returns."""
    client = ResizeClient(job_id, Client(live.url(), token))
    out: list[Allocation] = []

    def grow() -> None:
        out.append(client.grow(2, wait=True, timeout=90, wait_ready=True, **options))

    thread = threading.Thread(target=grow, daemon=True)
    thread.start()
    return thread, out


def _waiting(live: LiveCluster, job_id: str) -> dict[str, Any]:
    """The job once its 3 tasks run while the grow waits for readiness."""
    job = live.running(job_id, 3)
    resize = job["resize"]
    assert resize["phase"] == "GROW_STARTING" and job["version"] == 0, resize
    return job


def test_a_grow_with_wait_ready_commits_once_its_tasks_are_ready(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    live, go, job_id, token = _one_task(resize_live_factory, tmp_path)
    thread, out = _grow_in_background(live, job_id, token, ready_timeout=120)
    _waiting(live, job_id)
    # Every new process runs, none said it is ready: the job's wait() has not returned.
    assert thread.is_alive() and out == []
    assert len(live.job(job_id)["tasks"]) == 3
    go.touch()
    thread.join(60)
    assert not thread.is_alive() and len(out) == 1
    assert out[0].version == 1 and out[0].size == 3
    history = live.ok("GET", f"/v1/jobs/{job_id}/resize/history", ALICE)
    assert [r["delta_tasks"] for r in history["records"]] == [[1, 2]]
    # The asyncio client runs the same call (injob/protocol.py) against the server.
    assert asyncio.run(_ready_async(live.url(), job_id, token, 2)) == {
        "job_id": job_id,
        "task_id": 2,
        "ready": True,
        "phase": "IDLE",
        "version": 1,
    }
    live.check_consistent(job_id)


async def _ready_async(url: str, job_id: str, token: str, task_id: int) -> object:
    from xce_resize_plugin.injob.aio import AsyncResizeClient

    async with AsyncResizeClient(job_id, url, token) as client:
        return await client.ready(task_id)


def test_the_readiness_wait_survives_a_kill_9_of_the_controller(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    live, go, job_id, token = _one_task(resize_live_factory, tmp_path)
    client = ResizeClient(job_id, Client(live.url(), token))
    client.grow(2, wait_ready=True, ready_timeout=300)
    before = _waiting(live, job_id)
    pids = {t["id"]: t["pid"] for t in before["tasks"]}
    live.crash()
    live.start()
    # The new controller resumes the wait: same processes, still not committed.
    after = _waiting(live, job_id)
    assert {t["id"]: t["pid"] for t in after["tasks"]} == pids
    go.touch()
    committed = live.idle(job_id, 1, timeout=30)
    assert [t["id"] for t in committed["tasks"]] == [0, 1, 2]
    live.check_consistent(job_id)


def test_tasks_not_ready_by_the_deadline_are_stopped_and_the_rest_committed(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    # Task 1 says it is ready at once; task 2 never does.
    live, go, job_id, token = _one_task(resize_live_factory, tmp_path, READY_IDS="1")
    go.touch()
    thread, out = _grow_in_background(live, job_id, token, ready_timeout=2)
    thread.join(60)
    assert len(out) == 1 and out[0].version == 1
    assert [tid for tid, _ in out[0].tasks] == [0, 1]
    job = live.idle(job_id, 1)
    late = next(t for t in job["tasks"] if t["id"] == 2) if len(job["tasks"]) > 2 else None
    assert late is None or late["state"] in ("STOPPING", "EXITED")
    wait_until(lambda: 2 not in live.task_processes(job_id), 15, "task 2 stopped")
    live.check_consistent(job_id)


def test_release_exited_drops_a_task_that_exits(resize_live_factory: Any, tmp_path: Path) -> None:
    live: LiveCluster = resize_live_factory({"h1": 3, "h2": 3})
    live.start()
    go = tmp_path / "go"
    env = {"GO_FILE": str(go), "EXIT_ID": "2"}
    dropping, _ = _submit(live, EXITER, env, tasks="2,3", release_exited=True)
    keeping, _ = _submit(live, EXITER, env, tasks=3)  # the same, without the option
    live.running(dropping, 3)
    live.running(keeping, 3)
    go.touch()
    job = live.idle(dropping, 1)
    assert [t["id"] for t in job["tasks"] if t["state"] == "RUNNING"] == [0, 1]
    history = live.ok("GET", f"/v1/jobs/{dropping}/resize/history", ALICE)
    record = history["records"][-1]
    assert (record["type"], record["delta_tasks"], record["reason"]) == ("shrink", [2], "task_exit")
    assert history["segments"][-1]["slots"] == 2  # no longer charged

    def exited() -> dict[str, Any] | None:
        job = live.job(keeping)
        states = {t["id"]: t["state"] for t in job["tasks"]}
        return job if states.get(2) == "EXITED" else None

    job = wait_until(exited, 15, "task 2 of the job without the option exits")
    assert job["version"] == 0 and len(job["tasks"]) == 3  # still charged, as before
    r = live.call(
        "POST", "/v1/jobs", ALICE, {"command": ["sleep", "1"], "tasks": 2, "release_exited": True}
    )
    assert r.status_code == 400 and "release_exited needs a resizable job" in r.json()["detail"]
    live.check_consistent(dropping)
