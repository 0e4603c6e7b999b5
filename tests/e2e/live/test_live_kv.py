"""A job's key-value store on the live controller (docs/in-job-api.md, "Key-value
store"): task 0 publishes, the other tasks wait and read, through the in-job client in
real task processes; limits, authorisation and a controller failover."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import httpx

from xce_resize_plugin.controllers.live.job_kv import MAX_KEYS, MAX_VALUE
from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.rest.client import Client
from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, LiveCluster, wait_until

# Task 0 publishes after a moment; every other task waits for it, then publishes what
# it read under its own key.
RENDEZVOUS = """
import os, time
from xce_resize_plugin.injob import ResizeClient
c = ResizeClient.from_env()
tid = os.environ["XCE_TASK_ID"]
if tid == "0":
    time.sleep(0.5)
    c.put("scheduler", "tcp://" + os.environ["XCE_HEAD_ADDR"] + ":8786")
else:
    c.put("seen-" + tid, c.get("scheduler", wait=30) or "nothing")
time.sleep(600)
"""


def test_tasks_meet_through_the_store_which_survives_failover(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    answer = live.ok(
        "POST", "/v1/jobs", ALICE, {"command": [sys.executable, "-c", RENDEZVOUS], "tasks": 3}
    )
    job_id, token = answer["id"], answer["token"]
    kv = f"/v1/jobs/{job_id}/kv"

    def seen() -> list[str] | None:
        values = [live.call("GET", f"{kv}/seen-{i}", ALICE) for i in (1, 2)]
        return (
            [r.json()["value"] for r in values]
            if all(r.status_code == 200 for r in values)
            else None
        )

    assert (
        wait_until(seen, 30, "tasks 1 and 2 read task 0's address") == ["tcp://127.0.0.1:8786"] * 2
    )
    assert live.ok("GET", f"{kv}/scheduler", token) == {
        "key": "scheduler",
        "value": "tcp://127.0.0.1:8786",
        "version": 1,
    }

    # Kept across a kill -9 of the controller.
    live.crash()
    live.start()
    assert live.ok("GET", f"{kv}/seen-1", ROOT)["value"] == "tcp://127.0.0.1:8786"
    client = ResizeClient(job_id, Client(live.url(), token))
    assert client.put("scheduler", "tcp://elsewhere:1") == 2
    assert client.get("scheduler") == "tcp://elsewhere:1"
    assert client.get("absent") is None

    # A waiting reader is answered as soon as the key is set.
    got: list[str | None] = []
    reader = threading.Thread(target=lambda: got.append(client.get("late", wait=20)))
    reader.start()
    live.ok("PUT", f"{kv}/late", ALICE, {"value": "here"})
    reader.join(25)
    assert got == ["here"]

    # The job ends: its keys go with it.
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: live.job(job_id)["state"] == "EXIT", 15, "job end")
    r = live.call("GET", f"{kv}/scheduler", ALICE)
    assert (r.status_code, r.json()["code"]) == (409, "LSBE_JOB_FINISH"), r.text
    r = live.call("PUT", f"{kv}/x", ALICE, {"value": "v"})
    assert r.status_code == 409


def test_a_waiting_read_ends_with_the_job(resize_live_factory: Any) -> None:
    """The job ends while a task waits for a key: the read ends at once (no one will set
    the key), as the events long poll does, rather than holding one of the owner's
    request slots to its timeout. The job's token stops working at the job's end."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    job_id, token = answer["id"], answer["token"]
    live.running(job_id, 1)
    answers: dict[str, tuple[int, Any, float]] = {}

    def poll(name: str, path: str) -> None:
        start = time.monotonic()
        r = live.call("GET", path, token)
        answers[name] = (r.status_code, r.json(), time.monotonic() - start)

    readers = [
        threading.Thread(target=poll, args=("kv", f"/v1/jobs/{job_id}/kv/never?wait=20")),
        threading.Thread(target=poll, args=("events", f"/v1/jobs/{job_id}/events?timeout=20")),
    ]
    for reader in readers:
        reader.start()
    time.sleep(1.0)
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    for reader in readers:
        reader.join(30)
    status, doc, took = answers["kv"]
    assert (status, doc["code"]) == (409, "LSBE_JOB_FINISH"), doc
    assert took < 8 and answers["events"][2] < 8, answers
    r = live.call("PUT", f"/v1/jobs/{job_id}/kv/x", token, {"value": "v"})
    assert r.status_code == 401, r.text  # the job's token ended with it


def test_bad_writes_are_refused_and_change_nothing(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    mine = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    other = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    for job in (mine, other):
        live.running(job["id"], 1)  # a job takes writes once it runs
    kv = f"/v1/jobs/{mine['id']}/kv"
    live.ok("PUT", f"{kv}/k", ALICE, {"value": "v"})
    cases = [
        (other["token"], "k", {"value": "x"}, 404, "LSBE_NO_JOB"),  # another job's token
        (BOB, "k", {"value": "x"}, 404, "LSBE_NO_JOB"),  # another user
        (ALICE, "k", {"value": "x" * (MAX_VALUE + 1)}, 413, "XCE_KV_LIMIT"),
        (ALICE, "k", {"value": 3}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        (ALICE, "k", {"value": "x", "extra": 1}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        (ALICE, "-bad", {"value": "x"}, 400, "XCE_RESIZE_INVALID_REQUEST"),
        (ALICE, "k" * 129, {"value": "x"}, 400, "XCE_RESIZE_INVALID_REQUEST"),
    ]
    for token, key, body, status, code in cases:
        r = live.call("PUT", f"{kv}/{key}", token, body)
        assert (r.status_code, r.json()["code"]) == (status, code), (key, r.text)
    # A key given twice: refused, not the last one silently kept.
    r = httpx.put(
        live.url(f"{kv}/k"),
        content=b'{"value": "x", "value": "y"}',
        headers={"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"},
    )
    assert (r.status_code, r.json()["code"]) == (400, "XCE_RESIZE_INVALID_REQUEST"), r.text
    assert "'value' twice" in r.json()["detail"]
    # A plain ASCII number of seconds, as every query number (float() took the rest).
    for wait in ("61", "1_0", "%201%20", "%EF%BC%91", "nan", "inf", "1e999"):
        r = live.call("GET", f"{kv}/k?wait={wait}", ALICE)
        assert r.status_code == 400 and "wait" in r.json()["detail"], (wait, r.text)
    r = live.call("GET", f"{kv}/k?after=1", ALICE)
    assert r.status_code == 400
    assert live.ok("GET", f"{kv}/k", ALICE) == {"key": "k", "value": "v", "version": 1}
    for i in range(1, MAX_KEYS):
        live.ok("PUT", f"{kv}/k{i}", mine["token"], {"value": str(i)})
    r = live.call("PUT", f"{kv}/one-too-many", ALICE, {"value": "x"})
    assert (r.status_code, r.json()["code"]) == (413, "XCE_KV_LIMIT")
    assert live.ok("PUT", f"{kv}/k", ALICE, {"value": "w"})["version"] == 2  # replacing is fine
    # A delete makes room; refused deletes change nothing.
    for token, key, status, code in (
        (other["token"], "k1", 404, "LSBE_NO_JOB"),
        (BOB, "k1", 404, "LSBE_NO_JOB"),
        (ALICE, "-bad", 400, "XCE_RESIZE_INVALID_REQUEST"),
        (ALICE, "absent", 404, "XCE_KV_NO_KEY"),
    ):
        r = live.call("DELETE", f"{kv}/{key}", token)
        assert (r.status_code, r.json()["code"]) == (status, code), (key, r.text)
    r = live.call("PUT", f"{kv}/one-too-many", ALICE, {"value": "x"})
    assert (r.status_code, r.json()["code"]) == (413, "XCE_KV_LIMIT")
    assert live.ok("DELETE", f"{kv}/k1", mine["token"]) == {"key": "k1", "value": "1", "version": 1}
    assert live.ok("PUT", f"{kv}/one-more", ALICE, {"value": "x"})["version"] == 1


def test_a_deleted_key_is_gone_for_good(resize_live_factory: Any) -> None:
    """``delete`` through the in-job client: the key is gone, also after a kill -9 of
    the controller; set again, it starts at version 1; a second delete is ``False``."""
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    job_id, token = answer["id"], answer["token"]
    live.running(job_id, 1)
    client = ResizeClient(job_id, Client(live.url(), token))
    assert client.put("addr", "tcp://a:1") == 1
    assert client.put("addr", "tcp://a:2") == 2
    assert client.put("kept", "yes") == 1
    assert client.delete("addr") is True
    assert client.get("addr") is None
    assert client.delete("addr") is False
    live.crash()
    live.start()
    assert client.get("addr") is None
    assert client.get("kept") == "yes"
    assert client.put("addr", "tcp://b:1") == 1
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: live.job(job_id)["state"] == "EXIT", 15, "job end")
    r = live.call("DELETE", f"/v1/jobs/{job_id}/kv/kept", ALICE)
    assert (r.status_code, r.json()["code"]) == (409, "LSBE_JOB_FINISH"), r.text


def test_the_async_client_does_what_the_sync_one_does(resize_live_factory: Any) -> None:
    """AsyncResizeClient against the real server: a grow waited for, the key-value
    store with a waiting reader, and a refusal as the same RemoteError."""
    import asyncio

    from xce_resize_plugin.injob.aio import AsyncResizeClient
    from xce_resize_plugin.rest.client import RemoteError

    live: LiveCluster = resize_live_factory({"h1": 2, "h2": 2})
    live.start()
    answer = live.ok(
        "POST",
        "/v1/jobs",
        ALICE,
        {"command": ["sleep", "600"], "tasks": "1,3", "initial": 1, "resizable": True},
    )
    job_id, token = answer["id"], answer["token"]
    live.running(job_id, 1)

    async def scenario() -> tuple[int, int, str | None, str | None, str]:
        env = {"XCE_JOB_ID": job_id, "XCE_CONTROLLER_URL": live.url(), "XCE_JOB_TOKEN": token}
        async with AsyncResizeClient.from_env(env) as client:
            grown = await client.grow(1, 2, wait=True, no_notify=True)
            reader = asyncio.create_task(client.get("addr", wait=20))
            await asyncio.sleep(0.3)
            version = await client.put("addr", "tcp://x:1")
            absent = await client.get("absent")
            seen = await reader
            assert await client.delete("addr") is True
            assert await client.delete("addr") is False
            assert await client.get("addr") is None
            try:
                await client.release(task_ids=[0])
            except RemoteError as exc:
                refused = exc.code
            return grown.size, version, seen, absent, refused

    size, version, seen, absent, refused = asyncio.run(scenario())
    assert (size, version, seen, absent) == (3, 1, "tcp://x:1", None)
    assert refused.startswith("LSBE_RESIZE")  # task 0 is never released, as in LSF
    assert (
        live.job(job_id)["hosts"] == {"h1": 2, "h2": 1}
        or sum(live.job(job_id)["hosts"].values()) == 3
    )
