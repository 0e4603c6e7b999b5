"""The controller is always reached directly: with ``http_proxy`` (or ``all_proxy``) in
the environment, the clients sent each request, the token in its ``Authorization``
header, to that proxy — the sync client (``bresize``, ``xce-resize``, the in-job
``ResizeClient``) by urllib's default proxy handler, the async one by httpx's
``trust_env`` (docs/in-job-api.md, "Errors")."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import certifi
import pytest

from tests.http_stub import Stub, answering
from xce_resize_plugin.injob import ResizeClient
from xce_resize_plugin.injob.aio import AsyncResizeClient
from xce_resize_plugin.rest.client import Client

TOKEN = "7.job-token-secret"
_SETTLED = (
    b'{"job_id": "7", "phase": "IDLE", "version": 3, "tasks": [{"id": 0, "host": "h1"}], '
    b'"min_tasks": 1, "max_tasks": 4, "pending": null, "in_flight": null}'
)
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Stub]:
    """A proxy listening, that every proxy variable of the environment names."""
    with answering(b"", status=502) as stub:
        for name in _PROXY_VARS:
            monkeypatch.setenv(name, stub.url)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        yield stub


def test_the_sync_clients_never_go_through_a_proxy(proxy: Stub) -> None:
    with answering(_SETTLED) as controller:
        assert ResizeClient("7", Client(controller.url, TOKEN)).allocation().version == 3
        # bresize and the xce-resize commands: the same Client, from their environment.
        assert Client(controller.url, "alice-token").call("GET", "/v1/jobs/7/resize")
    assert proxy.seen == []
    lines = [seen.split(b" ")[:2] for seen in controller.seen]
    assert lines == [[b"GET", b"/v1/jobs/7/resize"]] * 2


def test_the_async_client_never_goes_through_a_proxy(proxy: Stub) -> None:
    async def run(url: str) -> Any:
        async with AsyncResizeClient("7", url, TOKEN) as client:
            return await client.allocation()

    with answering(_SETTLED) as controller:
        assert asyncio.run(run(controller.url)).version == 3
    assert proxy.seen == []
    assert len(controller.seen) == 1 and TOKEN.encode() in controller.seen[0]


def test_the_async_client_still_takes_its_ca_certificates_from_the_environment() -> None:
    """httpx reads SSL_CERT_FILE / SSL_CERT_DIR only with trust_env, now off."""
    from xce_resize_plugin.injob.aio import _verify

    assert _verify({}) is True
    context = _verify({"SSL_CERT_FILE": certifi.where()})
    assert isinstance(context, ssl.SSLContext) and context.cert_store_stats()["x509_ca"] > 0
    with pytest.raises(FileNotFoundError):
        _verify({"SSL_CERT_FILE": "/nonexistent/ca.pem"})


def test_a_plain_http_async_client_reads_no_ca_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CA file was read by the constructor whatever the URL: a missing one stopped
    a client of a plain-http controller from being made (FileNotFoundError)."""
    monkeypatch.setenv("SSL_CERT_FILE", "/nonexistent/ca.pem")

    async def run(url: str) -> Any:
        async with AsyncResizeClient("7", url, TOKEN) as client:
            return await client.allocation()

    with answering(_SETTLED) as controller:
        assert asyncio.run(run(controller.url)).version == 3
