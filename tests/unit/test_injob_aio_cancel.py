"""A cancel of a task that calls the async in-job client is never lost.

On Python 3.11, ``asyncio.wait_for`` returns the inner call's result when the cancel
comes as that call ends, and the cancel is gone (CPython gh-86296). A Dask cluster's
close cancels its task that follows the job's events with long polls: the task went on
polling for ever, and the close waited for it for ever. The client bounds each request
with ``asyncio.timeout`` instead, which keeps such a cancel for the task's next step."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from xce_resize_plugin.injob.aio import AsyncResizeClient


class _EndsAsCancelled:
    """An HTTP client whose every answer ends together with a cancel of ``task``."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.requests = 0

    async def request(self, method: str, url: str, **_kw: Any) -> httpx.Response:
        self.requests += 1
        await asyncio.sleep(0)
        assert self.task is not None
        # The cancel comes in the same turn of the loop as the answer.
        asyncio.get_running_loop().call_soon(self.task.cancel)
        return httpx.Response(200, json={"value": "v"}, request=httpx.Request(method, url))

    async def aclose(self) -> None:
        return None


async def _follow() -> tuple[bool, int]:
    fake = _EndsAsCancelled()
    client = AsyncResizeClient("7", "http://127.0.0.1:9", "token")
    await client.aclose()
    client._http = fake  # type: ignore[assignment]

    async def poll() -> None:
        for _ in range(5):  # as a loop that follows a job: ask again and again
            await client.get("k")

    fake.task = asyncio.ensure_future(poll())
    try:
        await fake.task
    except asyncio.CancelledError:
        return True, fake.requests
    return False, fake.requests


def test_a_cancel_as_an_answer_comes_ends_the_task() -> None:
    cancelled, requests = asyncio.run(_follow())
    assert cancelled, f"the cancel was lost: {requests} requests made in all"
    assert requests <= 2
