"""Drain before stop on the live controller, with real task processes
(docs/in-job-api.md, "Drain before stop" and "Job events"): a released task reads the
``release_coming`` event through the in-job client, acknowledges with ``drained()`` and
only then gets SIGTERM; a ``kill -9`` of the controller during a drain resumes it to
the same deadline, with the same event numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.rest.client import Client
from xce_resize_plugin.testing.live import ALICE, LiveCluster, alive, wait_until

# Every task logs what it sees to LOG/task-N.log (one JSON object a line). Task 0
# sleeps; the others follow the job's events: when a release names them they log it,
# and task 2 acknowledges at once (task 1 never does: it waits for the deadline). On
# SIGTERM a task logs the time and exits 0. While the controller is down (the failover
# test) the client's poll fails: the task polls again from the same cursor.
TASK = """
import json, os, signal, sys, time
from xce_resize_plugin.injob import ResizeClient
tid = int(os.environ["XCE_TASK_ID"])
log = open(os.path.join(sys.argv[1], f"task-{tid}.log"), "a", buffering=1)
def note(**kw):
    log.write(json.dumps({"t": time.time(), **kw}) + "\\n")
def term(*_):
    note(what="sigterm")
    os._exit(0)
signal.signal(signal.SIGTERM, term)
note(what="start")
if tid == 0:
    while True:
        time.sleep(1)
c = ResizeClient.from_env()
after = None
while True:
    try:
        for event in c.events(after=after):
            after = event["seq"]
            if event["type"] == "release_coming" and tid in event["task_ids"]:
                note(what="coming", seq=event["seq"], deadline=event["deadline"])
                if tid == 2:
                    # Noted first: the SIGTERM may come before drained() returns.
                    note(what="acknowledging")
                    c.drained([tid])
    except Exception:  # the controller restarting: read on from the same cursor
        time.sleep(0.2)
"""


def _log(tmp: Path, task_id: int) -> list[dict[str, Any]]:
    path = tmp / f"task-{task_id}.log"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _what(tmp: Path, task_id: int) -> list[str]:
    return [entry["what"] for entry in _log(tmp, task_id)]


def _start(
    factory: Any, tmp_path: Path, max_grace: float
) -> tuple[LiveCluster, Path, str, str, list[int]]:
    """A live cluster whose job 3 tasks run TASK, logging to the returned directory."""
    logs = tmp_path / "logs"
    logs.mkdir()
    live: LiveCluster = factory({"h1": 2, "h2": 2}, max_stop_grace=max_grace)
    live.start()
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {
            "command": [sys.executable, "-c", TASK, str(logs)],
            "tasks": "1,3",
            "alloc": {"h1": 1, "h2": 2},
            "resizable": True,
        },
    )
    job_id = str(answer["id"])
    job = live.running(job_id, 3)
    for tid in (1, 2):
        wait_until(lambda tid=tid: "start" in _what(logs, tid), 20, f"task {tid} started")
    return live, logs, job_id, str(answer["token"]), [t["pid"] for t in job["tasks"]]


def test_a_task_reads_the_coming_stop_acknowledges_then_gets_sigterm(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    live, logs, job_id, token, pids = _start(resize_live_factory, tmp_path, 300)
    # A long drain time: the stop can only come this soon from the task's own drained().
    r = live.release(job_id, task_ids=[2], grace=240)
    assert r.status_code == 202 and r.json()["phase"] == "SHRINK_DRAINING"
    wait_until(lambda: "sigterm" in _what(logs, 2), 30, "task 2 stopped after draining")
    assert _what(logs, 2) == ["start", "coming", "acknowledging", "sigterm"]
    coming = _log(logs, 2)[1]
    assert coming["deadline"] > _log(logs, 2)[-1]["t"]  # before its deadline: acknowledged
    job = live.idle(job_id, 1)
    assert [t["id"] for t in job["allocation"]] == [0, 1]
    assert not alive(pids[2]) and alive(pids[1])
    # The job's events, as the in-job client reads them, in order.
    client = ResizeClient(job_id, Client(live.url(), token))
    got = list(client.events(timeout=0))
    assert [e["type"] for e in got] == ["release_coming", "tasks_exited", "size_changed"]
    assert [e["seq"] for e in got] == [1, 2, 3] and got[1]["status"] == 0
    live.check_consistent(job_id)


def test_a_controller_killed_during_the_drain_resumes_it(
    resize_live_factory: Any, tmp_path: Path
) -> None:
    live, logs, job_id, token, pids = _start(resize_live_factory, tmp_path, 60)
    assert live.release(job_id, task_ids=[1], grace=6).status_code == 202
    wait_until(lambda: "coming" in _what(logs, 1), 20, "task 1 told of the stop")
    client = ResizeClient(job_id, Client(live.url(), token))
    before = list(client.events(timeout=0))
    assert [e["type"] for e in before] == ["release_coming"]
    live.crash()  # kill -9 in the middle of the drain
    live.start()
    wait_until(lambda: "sigterm" in _what(logs, 1), 40, "task 1 stopped at the deadline")
    deadline = before[0]["deadline"]
    assert _log(logs, 1)[-1]["t"] >= deadline  # the drain time was kept across the crash
    job = live.idle(job_id, 1)
    assert [t["id"] for t in job["allocation"]] == [0, 2]
    assert not alive(pids[1]) and alive(pids[2])
    after = list(client.events(timeout=0))
    # The same numbers for the same events after the restart, then what followed.
    assert after[: len(before)] == before
    assert [e["type"] for e in after] == ["release_coming", "tasks_exited", "size_changed"]
    live.check_consistent(job_id)


def test_the_async_client_drains_and_follows_events(resize_live_factory: Any) -> None:
    """AsyncResizeClient: a release with a drain time, its event read through the
    async iterator, the acknowledgement, and the events of the stop that follows."""
    import asyncio

    from xce_resize_plugin.injob.aio import AsyncResizeClient

    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {
            "command": ["sleep", "600"],
            "tasks": "1,3",
            "alloc": {"h1": 1, "h2": 2},
            "resizable": True,
        },
    )
    job_id, token = answer["id"], answer["token"]
    live.running(job_id, 3)

    async def scenario() -> list[str]:
        env = {"XCE_JOB_ID": job_id, "XCE_CONTROLLER_URL": live.url(), "XCE_JOB_TOKEN": token}
        seen: list[str] = []
        async with AsyncResizeClient.from_env(env) as client:
            alloc = await client.release(task_ids=[2], grace=200, no_notify=True)
            assert alloc.phase == "SHRINK_DRAINING"
            async for event in client.events(timeout=40):
                seen.append(event["type"])
                if event["type"] == "release_coming":
                    assert event["task_ids"] == [2]
                    await client.drained(event["task_ids"])
                if event["type"] == "size_changed":
                    break
        return seen

    assert asyncio.run(scenario()) == ["release_coming", "tasks_exited", "size_changed"]
    job = live.idle(job_id, 1)
    assert [t["id"] for t in job["allocation"]] == [0, 1]
