"""What one user may hold of the server at once (xce_resize_plugin.rest.http): a
user's requests in progress are bounded, so that one job's long polls or slow bodies
cannot take every connection from other users; the refusal is a 429 problem
document that closes its connection and says when to ask again."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from tests.conftest import http_scope
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest import http
from xce_resize_plugin.rest.operation import Operation, Param

TOKENS = {
    "alice-token": Principal("alice"),
    "alice-job-7": Principal("alice", job_id="7"),
    "bob-token": Principal("bob"),
}
OP = Operation(
    "hold",
    "GET",
    "/hold",
    "Hold",
    "A long poll that ends when told.",
    params=(Param("fail", {"type": "string"}, False, "fail with a bug instead"),),
)


class Held:
    """A route whose requests wait until :attr:`release` is set (or fail when the path
    says so), and the ASGI calls that drive it."""

    def __init__(self, limit: int | None) -> None:
        self.release = asyncio.Event()
        self.entered = 0

        async def hold(request: Request, principal: Principal) -> Response:
            self.entered += 1
            if request.query_params.get("fail"):
                raise RuntimeError("a bug in the handler")
            await self.release.wait()
            return http.reply({"user": principal.name})

        def authenticate(token: str | None) -> Principal | None:
            return TOKENS.get(token or "")

        route = http.ApiRoute(OP, http.endpoint(OP, hold, authenticate))
        self.app = Starlette(routes=[route], exception_handlers=http.exception_handlers())
        if limit is not None:
            http.set_request_limit(self.app, limit)

    async def call(self, token: str, query: str = "") -> tuple[int, dict[str, str], Any]:
        sent: list[MutableMapping[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)

        scope = http_scope("GET", "/hold", {"Authorization": f"Bearer {token}"})
        scope["query_string"] = query.encode()
        await self.app(scope, receive, send)
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
        return sent[0]["status"], headers, json.loads(body)

    async def refused(self, token: str) -> tuple[int, dict[str, str], Any]:
        """A call that must be answered at once (without a limit it would wait)."""
        return await asyncio.wait_for(self.call(token), 5)

    def counts(self) -> dict[str, int]:
        return dict(getattr(self.app.state, "xce_requests_in_progress", {}))


async def _settle(held: Held, entered: int) -> None:
    for _ in range(200):
        if held.entered >= entered:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {held.entered} of {entered} requests reached the handler")


def test_a_user_beyond_the_limit_is_refused_429_and_others_are_served() -> None:
    async def scenario() -> None:
        held = Held(limit=3)
        # Two by the user's own token, one by a job's token: all three are alice's.
        waiting = [
            asyncio.create_task(held.call(token))
            for token in ("alice-token", "alice-token", "alice-job-7")
        ]
        await _settle(held, 3)
        for token in ("alice-token", "alice-job-7"):
            status, headers, doc = await held.refused(token)
            assert status == 429
            assert doc["code"] == "XCE_TOO_MANY_REQUESTS"
            assert doc["detail"] == (
                "Too many requests in progress: user alice has 3 requests in progress, at most 3"
            )
            assert headers["content-type"] == "application/problem+json"
            assert headers["retry-after"] == str(http.REQUEST_LIMIT_RETRY)
            assert headers["connection"] == "close"
        assert held.entered == 3  # the refused requests never reached the handler
        # Another user is not held up by alice's requests.
        bob = asyncio.create_task(held.call("bob-token"))
        await _settle(held, 4)
        held.release.set()
        assert [(await t)[0] for t in (*waiting, bob)] == [200] * 4
        assert held.counts() == {}  # nothing is kept for users with nothing in progress
        assert (await held.call("alice-token"))[0] == 200  # and alice may ask again

    asyncio.run(scenario())


def test_a_request_that_failed_or_was_cut_off_no_longer_counts() -> None:
    async def scenario() -> None:
        held = Held(limit=1)
        assert (await held.call("alice-token", "fail=1"))[0] == 500
        assert held.counts() == {}
        gone = asyncio.create_task(held.call("alice-token"))
        await _settle(held, 2)
        assert held.counts() == {"alice": 1}
        gone.cancel()  # the server cancels the handler of a client that went away
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert held.counts() == {}
        held.release.set()
        assert (await held.call("alice-token"))[0] == 200

    asyncio.run(scenario())


def test_the_default_limit_and_a_bad_one() -> None:
    async def scenario() -> None:
        held = Held(limit=None)
        waiting = [
            asyncio.create_task(held.call("alice-job-7")) for _ in range(http.DEFAULT_REQUEST_LIMIT)
        ]
        await _settle(held, http.DEFAULT_REQUEST_LIMIT)
        assert (await held.refused("alice-token"))[0] == 429
        held.release.set()
        await asyncio.gather(*waiting)

    asyncio.run(scenario())
    with pytest.raises(ValueError, match="at least 1, got 0"):
        http.set_request_limit(Starlette(), 0)


def test_a_client_that_does_not_read_its_answer_is_cut_off_at_the_deadline() -> None:
    """Clients that read nothing of a large answer: the connections go at the header
    deadline after the answer (close() waited for the client to read the rest, for
    ever, and so one user could hold any number of descriptors past the request limit),
    and none stays counted."""
    import socket
    import threading
    import time

    import uvicorn

    from xce_resize_plugin.rest.header_deadline import header_deadline

    big = Operation("big", "GET", "/big", "Big", "A large answer.")

    async def answer(request: Request, principal: Principal) -> Response:
        return Response(b"x" * 3_000_000)

    app = Starlette(
        routes=[http.ApiRoute(big, http.endpoint(big, answer, lambda t: TOKENS.get(t or "")))],
        exception_handlers=http.exception_handlers(),
    )
    http.set_request_limit(app, 2)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(
        uvicorn.Config(app, http=header_deadline(0.5), loop="asyncio", log_level="warning",
                       lifespan="off")
    )  # fmt: skip
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    clients: list[socket.socket] = []
    try:
        while not server.started:
            time.sleep(0.01)
        for _ in range(6):
            c = socket.socket()
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            c.connect(sock.getsockname())
            c.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer bob-token\r\n\r\n")
            clients.append(c)
            time.sleep(0.05)
        time.sleep(0.3)
        assert server.server_state.connections  # answered, not read: still open
        deadline = time.monotonic() + 10
        while server.server_state.connections and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not server.server_state.connections  # cut off: no descriptor held for ever
        assert getattr(app.state, "xce_requests_in_progress", {}) == {}
    finally:
        for c in clients:
            c.close()
        server.should_exit = True
        thread.join(10)
        sock.close()
