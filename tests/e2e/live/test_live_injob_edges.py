"""The in-job clients at the edges of a job's life, on the live controller
(docs/in-job-api.md): ``wait()`` on a job that never changed (version 0) and the end
of ``events()`` on a job that ended without a ``job_ended`` event to read."""

from __future__ import annotations

import asyncio
from typing import Any

from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.rest.client import Client
from xce_resize_plugin.testing.live import ALICE, SLEEPER, LiveCluster


def _job(live: LiveCluster) -> tuple[str, str]:
    answer = live.ok("POST", "/v1/jobs", ALICE, {"command": SLEEPER, "tasks": 1, "resizable": True})
    live.running(answer["id"], 1)
    return str(answer["id"]), str(answer["token"])


def test_wait_without_a_version_on_a_job_at_version_0(resize_live_factory: Any) -> None:
    """``wait()`` asked the route for version -1 (the current one less 1): refused 400."""
    live: LiveCluster = resize_live_factory()
    live.start()
    job_id, token = _job(live)
    alloc = ResizeClient(job_id, Client(live.url(), token)).wait(timeout=5)
    assert (alloc.version, alloc.settled, alloc.size) == (0, True, 1)

    async def run() -> Any:
        async with AsyncResizeClient(job_id, live.url(), token) as client:
            return await client.wait(timeout=5)

    assert asyncio.run(run()).version == 0
