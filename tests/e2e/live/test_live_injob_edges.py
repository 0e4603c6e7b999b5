"""The in-job clients at the edges of a job's life, on the live controller
(docs/in-job-api.md): ``wait()`` on a job that never changed (version 0) and the end
of ``events()`` on a job that ended without a ``job_ended`` event to read."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.rest.client import Client, RemoteError
from xce_resize_plugin.testing.live import ALICE, SLEEPER, LiveCluster, wait_until


def _job(live: LiveCluster) -> tuple[str, str]:
    body = {"command": SLEEPER, "min_tasks": 1, "max_tasks": 2, "initial": 1, "resizable": True}
    answer = live.ok("POST", "/v1/jobs", ALICE, body)
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


def _read_in_thread(events: Any, took: float) -> list[dict[str, Any]]:
    """The events an iterator yields, which must end within ``took`` seconds."""
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.extend(events) or got.append("end"), daemon=True)
    reader.start()
    reader.join(took)
    assert not reader.is_alive(), f"events() did not end: {got}"
    assert got[-1] == "end", got
    return got[:-1]


def test_events_end_with_the_job_without_a_job_ended_to_read(resize_live_factory: Any) -> None:
    """A killed job that never resized has no job_ended event, and a reader past it
    gets none after it: the cursors polled the finished job 20 times a second (the
    owner's) until it was forgotten; the job's own cursor ends though its token is
    refused from the job's end on."""
    live: LiveCluster = resize_live_factory()
    live.start()
    job_id, token = _job(live)
    own = ResizeClient(job_id, Client(live.url(), token))
    reading: list[list[dict[str, Any]]] = []
    reader = threading.Thread(target=lambda: reading.append(list(own.events())), daemon=True)
    reader.start()
    time.sleep(0.5)  # its poll is being held
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: live.job(job_id)["state"] == "EXIT", 15, "job end")
    reader.join(10)
    assert not reader.is_alive() and reading == [[]]
    owner = ResizeClient(job_id, Client(live.url(), ALICE))
    assert _read_in_thread(owner.events(), 10) == []

    # A job that resized: its job_ended comes last, and a reader resuming after it
    # gets nothing more.
    job_id, token = _job(live)
    grown = ResizeClient(job_id, Client(live.url(), token)).grow(1, wait=True, timeout=20)
    assert grown.version == 1, grown
    assert live.call("DELETE", f"/v1/jobs/{job_id}", ALICE).status_code == 202
    wait_until(lambda: live.job(job_id)["state"] == "EXIT", 15, "job end")
    owner = ResizeClient(job_id, Client(live.url(), ALICE))
    read = _read_in_thread(owner.events(), 10)
    assert read[-1]["type"] == "job_ended"
    assert _read_in_thread(owner.events(after=read[-1]["seq"]), 10) == []

    async def resume() -> list[Any]:
        async with AsyncResizeClient(job_id, live.url(), ALICE) as client:
            return [e async for e in client.events(after=read[-1]["seq"], timeout=10)]

    began = time.monotonic()
    assert asyncio.run(resume()) == [] and time.monotonic() - began < 5
    # The job's token, refused once the job ended: a cursor it starts then is refused.
    with pytest.raises(RemoteError) as refused:
        list(ResizeClient(job_id, Client(live.url(), token)).events(after=read[-1]["seq"]))
    assert refused.value.http_status == 401
