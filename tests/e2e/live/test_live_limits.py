"""What one job or one user may hold of the live controller at once: its requests in
progress are bounded (docs/rest-api.md, "Errors"), so that one job's long polls cannot
take every connection of the server from other users."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.rest.http import DEFAULT_REQUEST_LIMIT, REQUEST_LIMIT_RETRY
from xce_resize_plugin.testing.live import ALICE, BOB, ROOT, LiveCluster


def test_one_jobs_long_polls_are_bounded_and_others_are_served(resize_live_factory: Any) -> None:
    live: LiveCluster = resize_live_factory({"h1": 2})
    live.start()
    job = live.ok("POST", "/v1/jobs", ALICE, {"command": ["sleep", "600"]})
    kv = f"/v1/jobs/{job['id']}/kv"

    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def scenario() -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=live.url(), limits=limits, timeout=60) as client:
            # The job's tasks wait for a key nobody has set: as many as the limit allows,
            # opened a batch at a time (256 connections at once on a loaded machine can
            # outlast the server's header deadline, and a wait cut off is not held).
            def wait_for_addr() -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(
                    client.get(f"{kv}/addr?wait=50", headers=auth(job["token"]))
                )

            waits: list[asyncio.Task[httpx.Response]] = []
            for _ in range(0, DEFAULT_REQUEST_LIMIT, 32):
                waits += [wait_for_addr() for _ in range(32)]
                await asyncio.sleep(0.2)
            deadline = time.monotonic() + 30
            while True:  # until the controller holds them all: the next one is refused
                # A wait that arrived while a probe below was in progress found the
                # limit reached (the probe counts too): refused, it is sent again.
                for i, w in enumerate(waits):
                    if w.done():
                        assert w.result().status_code == 429, w.result().text
                        waits[i] = wait_for_addr()
                r = await client.get(f"{kv}/other?wait=0", headers=auth(job["token"]))
                # Probes are one at a time and answered at once: a refused one means
                # the controller held the limit's worth of waits, so all of them.
                if r.status_code == 429 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert not [w for w in waits if w.done()], "a wait ended before its key was set"
            assert r.status_code == 429, r.text
            assert r.json()["code"] == "XCE_TOO_MANY_REQUESTS"
            assert f"user alice has {DEFAULT_REQUEST_LIMIT} requests" in r.json()["detail"]
            assert r.headers["retry-after"] == str(REQUEST_LIMIT_RETRY)
            assert r.headers["connection"] == "close"
            # The owner's own token counts with the job's; another user is served.
            r = await client.get(f"/v1/jobs/{job['id']}", headers=auth(ALICE))
            assert r.status_code == 429, r.text
            r = await client.post("/v1/jobs", json={"command": ["true"]}, headers=auth(BOB))
            assert r.status_code == 201, r.text
            # The in-job clients ask again after Retry-After instead of failing: their
            # calls are answered once the waits are (the async one; the sync one in a
            # thread, as a task's program would make it).
            environ = {
                "XCE_JOB_ID": str(job["id"]),
                "XCE_CONTROLLER_URL": live.url(),
                "XCE_JOB_TOKEN": job["token"],
            }
            in_job = AsyncResizeClient.from_env(environ)
            patient = asyncio.create_task(in_job.get("addr"))
            patient_sync = asyncio.create_task(
                asyncio.to_thread(ResizeClient.from_env(environ).get, "addr")
            )
            await asyncio.sleep(2.5 * REQUEST_LIMIT_RETRY)  # refused at least twice
            assert not patient.done() and not patient_sync.done()
            # An administrator sets the key: every wait is answered with it.
            r = await client.put(f"{kv}/addr", json={"value": "x"}, headers=auth(ROOT))
            assert r.status_code == 200, r.text
            answers = await asyncio.gather(*waits)
            assert {(a.status_code, a.json()["value"]) for a in answers} == {(200, "x")}
            assert await patient == await patient_sync == "x"
            await in_job.aclose()
            # Nothing is held any more: the job may ask again.
            r = await client.get(f"{kv}/addr", headers=auth(job["token"]))
            assert r.status_code == 200, r.text

    asyncio.run(scenario())
