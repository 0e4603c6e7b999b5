"""What one job or one user may hold of the live controller at once: its requests in
progress are bounded (docs/rest-api.md, "Errors"), so that one job's long polls cannot
take every connection of the server from other users."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

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
            # The job's tasks wait for a key nobody has set: as many as the limit allows.
            waits = [
                asyncio.create_task(client.get(f"{kv}/addr?wait=30", headers=auth(job["token"])))
                for _ in range(DEFAULT_REQUEST_LIMIT)
            ]
            deadline = time.monotonic() + 30
            while True:  # until the controller holds them all: the next one is refused
                r = await client.get(f"{kv}/other?wait=0", headers=auth(job["token"]))
                if r.status_code == 429 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
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
            # An administrator sets the key: every wait is answered with it.
            r = await client.put(f"{kv}/addr", json={"value": "x"}, headers=auth(ROOT))
            assert r.status_code == 200, r.text
            answers = await asyncio.gather(*waits)
            assert {(a.status_code, a.json()["value"]) for a in answers} == {(200, "x")}
            # Nothing is held any more: the job may ask again.
            r = await client.get(f"{kv}/addr", headers=auth(job["token"]))
            assert r.status_code == 200, r.text

    asyncio.run(scenario())
