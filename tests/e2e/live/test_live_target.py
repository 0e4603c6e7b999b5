"""A job's target size on the live controller, with real agents and task processes
(docs/in-job-api.md, "A target size"): set up from inside the job with the synchronous
client, kept across a kill -9 of the controller while its grow still pends, reached
once slots free; then set down with ``release_prefer`` through the asynchronous client
and the ``xce-resize target`` command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import ALICE, LiveCluster, wait_until


def _status(live: LiveCluster, job_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = live.ok("GET", f"/v1/jobs/{job_id}/resize", ALICE)
    return doc


def _cli(live: LiveCluster, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XCE_CONTROLLER_URL": live.url(), "XCE_TOKEN": ALICE}
    env.pop("XCE_JOB_TOKEN", None)
    argv = [sys.executable, "-m", "xce_resize_plugin", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def test_a_target_survives_a_kill_9_and_is_reached_up_then_down(
    resize_live_factory: Any,
) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2, "h3": 2})
    live.start()
    blocker = live.submit(command=["sleep", "600"], tasks=3)
    live.running(blocker, 3)
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {"command": ["sleep", "600"], "tasks": "1,6", "initial": 1, "resizable": True},
    )
    job_id, token = answer["id"], answer["token"]
    live.running(job_id, 1)

    # Up to 5 from inside the job (its own token): 2 slots are free, so it grows to 3
    # and the target's grow of the 2 missing tasks pends.
    client = ResizeClient(job_id, Client(live.url(), token))
    client.set_target(5)
    wait_until(lambda: _status(live, job_id)["version"] == 1, 20, "the first grow")
    status = _status(live, job_id)
    assert len(status["tasks"]) == 3 and status["target"] == {"tasks": 5, "release_prefer": []}
    assert (status["demand"]["min"], status["demand"]["max"]) == (1, 2)

    # kill -9 the controller: the target and its grow come back from the journal.
    live.crash()
    live.start()
    status = _status(live, job_id)
    assert status["target"] == {"tasks": 5, "release_prefer": []}
    assert status["pending"] is not None and status["pending"]["max"] == 2
    # The slots free up: the restarted controller reaches the target by itself.
    assert live.call("DELETE", f"/v1/jobs/{blocker}", ALICE).status_code == 202
    # Setting the same target again changes nothing; with wait it returns once reached.
    alloc = client.set_target(5, wait=True, timeout=30)
    assert alloc.size == 5 and alloc.settled and alloc.version == 2
    assert sorted(live.task_processes(job_id)) == sorted(
        t["id"] for t in _status(live, job_id)["tasks"]
    )

    # Down to 2 through the asynchronous client, the tasks 4 and 3 released first.
    async def down() -> Any:
        async with AsyncResizeClient(job_id, live.url(), token) as aclient:
            return await aclient.set_target(2, release_prefer=[4, 3], wait=True, timeout=30)

    alloc = asyncio.run(down())
    ids = [i for i, _ in alloc.tasks]
    assert len(ids) == 2 and ids[0] == 0 and 3 not in ids and 4 not in ids
    assert alloc.target == {"tasks": 2, "release_prefer": [4, 3]} and alloc.settled
    wait_until(lambda: sorted(live.task_processes(job_id)) == sorted(ids), 20, "tasks stopped")

    # The command line shows it, clears it, and refuses a bad one with LSF's code.
    proc = _cli(live, "jobs")
    assert proc.returncode == 0 and "=2" in proc.stdout
    proc = _cli(live, "target", job_id, "7")
    assert proc.returncode == 255 and "Incorrect number of tasks specified" in proc.stderr
    proc = _cli(live, "target", job_id, "--clear", "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["target"] is None
    # if_version: a release conditioned on an old version is refused, nothing changes.
    version = _status(live, job_id)["version"]
    try:
        client.release(count=1, if_version=version - 1)
    except RemoteError as exc:
        assert exc.code == "XCE_RESIZE_VERSION_CHANGED"
    else:
        raise AssertionError("a release on an old version was accepted")
    proc = _cli(live, "release", job_id, "--count", "1", "--if-version", str(version))
    assert proc.returncode == 0, proc.stderr
    live.idle(job_id, version + 1)
    assert len(_status(live, job_id)["tasks"]) == 1
