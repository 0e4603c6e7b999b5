"""The asynchronous in-job client, for frameworks that run an asyncio loop (Dask,
Ray): the same calls as :class:`~.client.ResizeClient`, awaitable, on httpx (the
``async`` extra). Both clients drive the one definition of the calls in
:mod:`.protocol`.

::

    async with AsyncResizeClient.from_env() as client:
        await client.grow(1, 4, wait=True)
        address = await client.get("scheduler", wait=60)
"""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TypeVar, Unpack

import httpx

from xce_resize_plugin.errors import Unreachable
from xce_resize_plugin.injob.client import job_environment
from xce_resize_plugin.injob.protocol import (
    Allocation,
    Exchange,
    GrowOptions,
    JobRequests,
    Pacer,
    ReleaseOptions,
    Request,
    Steps,
    WaitOptions,
)
from xce_resize_plugin.rest.client import (
    BAD_TOKEN,
    RemoteError,
    header_safe,
    redirected,
    remote_error,
)

_T = TypeVar("_T")


class AsyncResizeClient:
    """Resize requests and the key-value store for one job, awaitable. Use it as an
    async context manager, or call :meth:`aclose` when done (it holds a connection
    pool)."""

    def __init__(self, job_id: str, url: str, token: str | None, timeout: float = 30.0) -> None:
        self._requests = JobRequests(job_id)  # a bad job id refused before the pool
        self.job_id = job_id
        self.url = url.rstrip("/")
        self._timeout = timeout
        headers = {"Accept": "application/json, application/problem+json"}
        # As the sync client, a token no header can carry is refused at each call and
        # never shown: httpx would quote the header (the token) in its error, or raise a
        # UnicodeEncodeError holding it.
        self._bad_token = bool(token) and not header_safe(token or "")
        if token and not self._bad_token:
            headers["Authorization"] = f"Bearer {token}"
        # trust_env=False: the controller is reached directly, never through the proxy
        # of ``http_proxy`` (it was sent the token: docs/in-job-api.md), as by the sync
        # client; the CA certificates of SSL_CERT_FILE / SSL_CERT_DIR, which httpx reads
        # only with trust_env, are still the ones an https URL is checked against.
        # No base_url: a URL httpx cannot parse is refused at each call, Unreachable as
        # by the sync client, not by the constructor as httpx.InvalidURL.
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=timeout,
            trust_env=False,
            # Read only for https: a plain-http controller (the usual one) has no use
            # for the CA file, nor should a missing one stop the client being made.
            verify=_verify(os.environ) if self.url.lower().startswith("https:") else True,
        )
        self._pacer = Pacer()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AsyncResizeClient:
        """Built from the task environment the controller gives every task."""
        return cls(*job_environment(environ))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def allocation(self) -> Allocation:
        return await self._run(self._requests.allocation())

    async def history(self) -> Mapping[str, Any]:
        return await self._run(self._requests.history())

    async def wait(
        self, after_version: int | None = None, timeout: float | None = 60.0
    ) -> Allocation:
        return await self._run(self._requests.wait(after_version, timeout))

    async def grow(
        self, min_tasks: int, max_tasks: int | None = None, **options: Unpack[GrowOptions]
    ) -> Allocation:
        return await self._run(self._requests.grow(min_tasks, max_tasks, options))

    async def ready(self, task_id: int | None = None) -> Mapping[str, Any]:
        return await self._run(self._requests.ready(task_id))

    async def release(self, **options: Unpack[ReleaseOptions]) -> Allocation:
        return await self._run(self._requests.release(options))

    async def drained(self, task_ids: Sequence[int]) -> Allocation:
        return await self._run(self._requests.drained(task_ids))

    async def events(
        self, after: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """As :meth:`ResizeClient.events <xce_resize_plugin.injob.client.ResizeClient.events>`,
        an async iterator."""
        cursor = self._requests.events(after, timeout)
        while not cursor.done:
            for event in await self._run(cursor.poll()):
                yield event

    async def cancel(self) -> Allocation:
        return await self._run(self._requests.cancel())

    async def set_target(
        self, tasks: int, release_prefer: Sequence[int] = (), **options: Unpack[WaitOptions]
    ) -> Allocation:
        return await self._run(self._requests.set_target(tasks, release_prefer, options))

    async def clear_target(self) -> Allocation:
        return await self._run(self._requests.clear_target())

    async def put(self, key: str, value: str) -> int:
        return await self._run(self._requests.put(key, value))

    async def get(self, key: str, wait: float | None = None) -> str | None:
        return await self._run(self._requests.get(key, wait))

    async def delete(self, key: str) -> bool:
        return await self._run(self._requests.delete(key))

    async def _run(self, steps: Steps[_T]) -> _T:
        exchange = Exchange(steps, self._pacer)
        while (request := exchange.next_request()) is not None:
            if pause := exchange.pause():
                await asyncio.sleep(pause)
            try:
                exchange.answered(await self._send(request))
            except RemoteError as exc:
                if wait := exchange.refused(exc):
                    await asyncio.sleep(wait)
        return exchange.result

    async def _send(self, request: Request) -> Any:
        if self._bad_token:
            raise Unreachable(f"{self.url!r}: {BAD_TOKEN}")
        limit = request.timeout if request.timeout is not None else self._timeout
        try:
            # The whole exchange within the request's limit: httpx bounds each read,
            # and a server sending a byte every few seconds held a call for ever.
            # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that
            # comes as the request ends (CPython gh-86296), and a cancelled long poll
            # (a Dask cluster's job events, at its close) then went on for ever.
            async with asyncio.timeout(limit):
                response = await self._http.request(
                    request.method, self.url + request.path, json=request.body, timeout=limit
                )
        except TimeoutError:
            raise Unreachable(f"{self.url}: no whole answer within {limit:g} s") from None
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise Unreachable(f"{self.url}: {exc}") from None
        except ExceptionGroup as group:
            raise _unreachable(self.url, group) from None
        if 300 <= response.status_code < 400:
            raise redirected(self.url, response.status_code, response.headers.get("Location"))
        if response.status_code >= 400:
            raise remote_error(
                response.status_code,
                response.content,
                response.reason_phrase,
                response.headers.get("Retry-After"),
            )
        try:
            return response.json() if response.content else None
        except ValueError as exc:  # as the sync client: no controller answered
            raise Unreachable(f"{self.url}: the answer is not JSON: {exc}") from None


def _unreachable(url: str, group: ExceptionGroup[Exception]) -> Unreachable:
    """The error of the connection attempts httpx's backend makes together, when each
    failed as a connection can (a port out of range: OverflowError); any other group
    is raised as it is."""
    failed, other = group.split((OSError, OverflowError, ValueError))
    if failed is None or other is not None:
        raise group
    first: BaseException = failed
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return Unreachable(f"{url}: {first}")


def _verify(environ: Mapping[str, str]) -> ssl.SSLContext | bool:
    """What an https controller's certificate is checked against: the CA file or
    directory ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` names, as httpx does with
    ``trust_env``, else httpx's default (``True``)."""
    if environ.get("SSL_CERT_FILE"):
        return ssl.create_default_context(cafile=environ["SSL_CERT_FILE"])
    if environ.get("SSL_CERT_DIR"):
        return ssl.create_default_context(capath=environ["SSL_CERT_DIR"])
    return True


__all__ = ["AsyncResizeClient"]
