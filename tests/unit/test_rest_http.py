"""The one HTTP layer (xce_resize_plugin.rest.http) as the resize routes and the live
controller's host routes use it, driven as ASGI applications with a body stream that
counts what is read from it: authentication comes before any body byte is read, a
declared length over the limit is refused before reading, a body streamed past the
limit (chunked, no length) is cut off there rather than read to its end, and a body
that stops half way is answered 408 at the body deadline."""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from anyio.to_thread import current_default_thread_limiter
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool

from tests.conftest import http_scope
from xce_resize_plugin.controllers.live.host_routes import MAX_BODY as HOST_MAX_BODY
from xce_resize_plugin.controllers.live.host_routes import host_routes
from xce_resize_plugin.controllers.live.storage_faults import StateNotWritable
from xce_resize_plugin.controllers.violations import StoreError
from xce_resize_plugin.errors import FencedError, JournalError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.journal.lmdb_env import failed_write
from xce_resize_plugin.rest import http
from xce_resize_plugin.rest import routes as api
from xce_resize_plugin.rest.resize_operations import MAX_BODY

GOOD = "good-token"
CHUNK = 4096


class StubController:
    """Just what the routes touch before the controller does any work: the token check;
    ``submit_job`` answers what it was given; ``fence`` and ``storage_failed`` record."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fenced: BaseException | None = None
        self.failed: BaseException | None = None
        self.fail = fail
        self.plugin_manager = None

    def authenticate(self, token: str | None) -> Principal | None:
        return Principal("alice") if token == GOOD else None

    def submit_job(self, principal: Principal, body: Any) -> Any:
        if self.fail is not None:
            raise self.fail
        return {"id": "1", "token": "t", "job": body}

    def fence(self, reason: BaseException) -> None:
        self.fenced = reason

    def storage_failed(self, exc: BaseException) -> StateNotWritable:
        self.failed = exc
        return StateNotWritable(str(exc))


class Stream:
    """An ASGI ``receive`` that serves ``chunks`` and counts how many it handed out."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.read = 0

    async def __call__(self) -> dict[str, Any]:
        chunk = next(self.chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}


def endless() -> Iterator[bytes]:
    """More body than any limit: 1 MiB (a server that reads it all fails the count)."""
    return itertools.repeat(b" " * CHUNK, 256)


class Stalled:
    """An ASGI ``receive`` that hands out ``first`` (more to come), then either waits
    for ever (a client that stopped sending) or says the client went away."""

    def __init__(self, first: bytes, then: str = "wait") -> None:
        self.first: bytes | None = first
        self.then = then

    async def __call__(self) -> dict[str, Any]:
        if self.first is not None:
            chunk, self.first = self.first, None
            return {"type": "http.request", "body": chunk, "more_body": True}
        if self.then == "disconnect":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()
        raise AssertionError("never reached")


def call(app: Any, method: str, path: str, stream: Any, headers: dict[str, str]) -> tuple[int, Any]:
    status, _, doc = answer(app, method, path, stream, headers)
    return status, doc


def answer(
    app: Any, method: str, path: str, stream: Any, headers: dict[str, str]
) -> tuple[int, dict[str, str], Any]:
    """The status, headers and decoded JSON body of the app's answer."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(http_scope(method, path, headers), stream, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers_sent = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], headers_sent, json.loads(body)


def resize_app() -> Starlette:
    return api.app(StubController())  # type: ignore[arg-type]


def host_app(ctl: StubController | None = None) -> Starlette:
    routes = host_routes(ctl or StubController())  # type: ignore[arg-type]
    return Starlette(routes=routes, exception_handlers=http.exception_handlers())


# (app, method, path, limit, status and code of a body over the limit)
ROUTES = {
    "resize grow": (resize_app, "POST", "/v1/jobs/7/resize/grow", MAX_BODY, 413),
    "resize cancel": (resize_app, "DELETE", "/v1/jobs/7/resize/pending", MAX_BODY, 413),
    "host submit": (host_app, "POST", "/v1/jobs", HOST_MAX_BODY, 400),
}
TOO_LARGE = {413: "XCE_RESIZE_BODY_TOO_LARGE", 400: "XCE_RESIZE_INVALID_REQUEST"}


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize("token", [None, "unknown-token"])
def test_no_token_is_refused_before_any_body_byte_is_read(route: str, token: str | None) -> None:
    make, method, path, _, _ = ROUTES[route]
    headers = {"content-type": "application/json", "content-length": str(2**40)}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    stream = Stream(endless())
    status, doc = call(make(), method, path, stream, headers)
    assert (status, doc["code"]) == (401, "XCE_RESIZE_NOT_AUTHENTICATED")
    assert stream.read == 0


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_declared_length_over_the_limit_is_refused_before_reading(route: str) -> None:
    make, method, path, limit, too_large = ROUTES[route]
    headers = {"authorization": f"Bearer {GOOD}", "content-length": str(limit + 1)}
    stream = Stream(endless())
    status, doc = call(make(), method, path, stream, headers)
    assert (status, doc["code"]) == (too_large, TOO_LARGE[too_large])
    assert stream.read == 0


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_streamed_body_over_the_limit_is_cut_off(route: str) -> None:
    make, method, path, limit, too_large = ROUTES[route]
    stream = Stream(endless())  # chunked: no Content-Length
    status, doc = call(make(), method, path, stream, {"authorization": f"Bearer {GOOD}"})
    assert (status, doc["code"]) == (too_large, TOO_LARGE[too_large])
    assert limit < stream.read <= limit + CHUNK


def test_messages_of_too_large_bodies_stay_as_they_were() -> None:
    headers = {"authorization": f"Bearer {GOOD}", "content-length": str(10**9)}
    _, doc = call(host_app(), "POST", "/v1/jobs", Stream(endless()), headers)
    assert doc["detail"] == f"Invalid resize request: body larger than {HOST_MAX_BODY} bytes"
    _, doc = call(resize_app(), "POST", "/v1/jobs/7/resize/grow", Stream(endless()), headers)
    assert doc["detail"] == f"Request body too large: 1000000000 bytes, at most {MAX_BODY}"
    headers.pop("content-length")
    _, doc = call(resize_app(), "POST", "/v1/jobs/7/resize/grow", Stream(endless()), headers)
    assert doc["detail"] == f"Request body too large: more than {MAX_BODY} bytes"


def test_a_body_within_the_limit_reaches_the_host() -> None:
    body = json.dumps({"command": ["true"], "env": {"X": "y" * 1000}}).encode()
    stream = Stream(iter([body[:100], body[100:]]))
    headers = {"authorization": f"Bearer {GOOD}", "content-length": str(len(body))}
    status, doc = call(host_app(), "POST", "/v1/jobs", stream, headers)
    assert status == 201 and doc["job"] == json.loads(body)
    status, doc = call(host_app(), "POST", "/v1/jobs", Stream(iter([b"{"])), headers)
    assert status == 400
    assert doc["detail"].startswith("Invalid resize request: body is not valid JSON")


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_a_body_that_stops_half_way_is_answered_408_at_the_deadline(route: str) -> None:
    """The app's body deadline (set_body_timeout) holds for the host's routes and the
    plugin's alike; the answer closes the connection."""
    make, method, path, _, _ = ROUTES[route]
    app = make()
    http.set_body_timeout(app, 0.05)
    headers = {"authorization": f"Bearer {GOOD}", "content-length": "100"}
    status, sent, doc = answer(app, method, path, Stalled(b'{"tasks": '), headers)
    assert (status, doc["code"]) == (408, "XCE_RESIZE_BODY_TIMEOUT")
    assert doc["detail"] == "Request body not received in time: only 10 bytes in the 0.05 s allowed"
    assert sent["connection"] == "close"


def test_a_client_gone_half_way_is_a_refusal_not_a_bug() -> None:
    headers = {"authorization": f"Bearer {GOOD}", "content-length": "100"}
    stream = Stalled(b'{"command": ', then="disconnect")
    status, doc = call(host_app(), "POST", "/v1/jobs", stream, headers)
    assert (status, doc["code"]) == (400, "XCE_RESIZE_INVALID_REQUEST")


def test_the_body_deadline_is_30_s_unless_the_host_sets_one() -> None:
    from starlette.requests import Request

    app = resize_app()
    assert http.body_timeout(Request({"type": "http", "app": app})) == 30.0
    http.set_body_timeout(app, 2)
    assert http.body_timeout(Request({"type": "http", "app": app})) == 2.0
    assert http.body_timeout(Request({"type": "http"})) == http.DEFAULT_BODY_TIMEOUT == 30.0


def test_a_fenced_error_stops_the_controller_and_is_answered() -> None:
    ctl = StubController(fail=RuntimeError("write failed"))
    ctl.fail.__cause__ = FencedError("epoch 3 took over")  # type: ignore[union-attr]
    headers = {"authorization": f"Bearer {GOOD}"}
    status, sent, doc = answer(host_app(ctl), "POST", "/v1/jobs", Stream(iter([b"{}"])), headers)
    assert (status, doc["code"]) == (503, "XCE_RESIZE_FENCED")
    assert "retry-after" not in sent  # a fenced controller never comes back
    assert isinstance(ctl.fenced, FencedError)
    ctl = StubController(fail=RuntimeError("a bug"))
    status, doc = call(host_app(ctl), "POST", "/v1/jobs", Stream(iter([b"{}"])), headers)
    assert (status, doc["code"]) == (500, "XCE_INTERNAL") and ctl.fenced is None


@pytest.mark.parametrize(
    "failure",
    [
        # As LmdbEnv raises them: marked as writes that did not happen.
        failed_write(
            StoreError("state/controller: cannot write (Error: mdb_txn_commit: File too large)")
        ),
        failed_write(
            JournalError("state/resize: cannot write the journal (Error: Input/output error)")
        ),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["state", "journal", "hostfile"],
)
def test_a_failed_write_is_answered_503_with_retry_after(failure: Exception) -> None:
    """A write that failed is the disk's fault, not the request's: 503 (never 4xx, never
    500), with Retry-After; the controller hears of it (and goes back to its disk)."""
    ctl = StubController(fail=RuntimeError("submission failed"))
    ctl.fail.__cause__ = failure  # type: ignore[union-attr]
    headers = {"authorization": f"Bearer {GOOD}"}
    status, sent, doc = answer(host_app(ctl), "POST", "/v1/jobs", Stream(iter([b"{}"])), headers)
    assert (status, doc["code"]) == (503, "XCE_STATE_NOT_WRITABLE")
    assert sent["content-type"] == "application/problem+json"
    assert int(sent["retry-after"]) > 0
    assert ctl.failed is not None and ctl.fenced is None
    # A refusal because of an earlier failure is not a new failure.
    ctl = StubController(fail=StateNotWritable("disk full"))
    status, sent, doc = answer(host_app(ctl), "POST", "/v1/jobs", Stream(iter([b"{}"])), headers)
    assert (status, doc["code"], ctl.failed) == (503, "XCE_STATE_NOT_WRITABLE", None)
    assert int(sent["retry-after"]) > 0


def test_a_record_that_cannot_be_read_is_that_requests_failure_not_the_disks() -> None:
    """A damaged record read back, or a value that cannot be encoded, is no failed
    write: the controller is not told its disk fails (every user would get 503)."""
    headers = {"authorization": f"Bearer {GOOD}"}
    for failure in (
        JournalError("state/resize/data.mdb: fact 1: CRC mismatch (stored 1, computed 2)"),
        StoreError("state/controller/data.mdb: corrupt job record '101'"),
        JournalError("cannot be written to the journal: Integer exceeds 64-bit range"),
    ):
        ctl = StubController(fail=RuntimeError("submission failed"))
        ctl.fail.__cause__ = failure  # type: ignore[union-attr]
        status, _, doc = answer(host_app(ctl), "POST", "/v1/jobs", Stream(iter([b"{}"])), headers)
        assert (status, doc["code"]) == (500, "XCE_INTERNAL") and ctl.failed is None


def test_one_builder_describes_host_and_resize_routes_alike() -> None:
    from openapi_spec_validator import validate

    from xce_resize_plugin.rest import openapi

    ctl = StubController()
    served = [*host_routes(ctl), *api.routes(ctl)]  # type: ignore[arg-type]
    doc = openapi.document("t", "1", served)
    validate(doc)
    described = {(p, m.upper()) for p, item in doc["paths"].items() for m in item}
    assert described == {(r.path, m) for r in served for m in r.methods - {"HEAD"}}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            public = (path, method) == ("/v1/health", "get")
            assert op["security"] == ([] if public else [{"bearer": []}]), (path, method)
            if not public:
                assert "401" in op["responses"], (path, method)


def test_every_concurrent_change_gets_a_worker_thread() -> None:
    """A change holds its worker thread until its facts are durable, so 64 concurrent
    ones need 64 threads at once: with RequestThreads around the app they all run
    together (anyio's default of 40 would leave 24 waiting in the event loop, and here
    the barrier would break). A loop that already allows more threads keeps them."""
    clients = 64
    barrier = threading.Barrier(clients)

    async def change(scope: Any, receive: Any, send: Any) -> None:
        await run_in_threadpool(barrier.wait, 10)

    app = http.RequestThreads(change)

    async def serve(tokens: int) -> int:
        current_default_thread_limiter().total_tokens = tokens
        scope = http_scope("POST", "/v1/jobs/7/resize/grow", {})
        await asyncio.gather(*(app(scope, Stream(iter([])), _ignore) for _ in range(clients)))
        return int(current_default_thread_limiter().total_tokens)

    assert asyncio.run(serve(40)) == http.REQUEST_THREADS >= clients
    assert asyncio.run(serve(500)) == 500


async def _ignore(message: Any) -> None:
    """An ASGI ``send`` that drops what it is given."""


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_two_authorization_headers_are_refused_whichever_is_good(route: str) -> None:
    """A proxy in front may read the other one: neither is taken."""
    make, method, path, _, _ = ROUTES[route]
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for pair in ((GOOD, "other"), ("other", GOOD), (GOOD, GOOD)):
        sent.clear()
        scope = http_scope(method, path, {"content-type": "application/json"})
        scope["headers"] += [(b"authorization", f"Bearer {t}".encode()) for t in pair]
        stream = Stream(endless())
        asyncio.run(make()(scope, stream, send))
        body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        doc = json.loads(body)
        assert (sent[0]["status"], doc["code"]) == (401, "XCE_RESIZE_NOT_AUTHENTICATED"), pair
        assert "one Authorization header" in doc["detail"] and stream.read == 0


@pytest.mark.parametrize("route", sorted(ROUTES))
@pytest.mark.parametrize(
    "declared",
    ["text/plain", "application/json; charset=latin-1", "application/json;charset=utf-16"],
)
def test_a_body_that_is_not_utf8_json_is_refused_on_every_route(route: str, declared: str) -> None:
    """The host's routes as the plugin's: JSON (RFC 8259) is UTF-8, and read so."""
    make, method, path, _, _ = ROUTES[route]
    headers = {"content-type": declared, "authorization": f"Bearer {GOOD}"}
    status, doc = call(make(), method, path, Stream(iter([b"{}"])), headers)
    assert (status, doc["code"]) == (415, "XCE_RESIZE_UNSUPPORTED_MEDIA_TYPE"), doc


@pytest.mark.parametrize("charset", ["utf-8", "UTF8", '"utf-8"', "us-ascii"])
def test_utf8_and_ascii_json_are_read(charset: str) -> None:
    make, method, path, _, _ = ROUTES["host submit"]
    headers = {
        "content-type": f"application/json; charset={charset}",
        "authorization": f"Bearer {GOOD}",
    }
    status, doc = call(make(), method, path, Stream(iter([b'{"command": ["x"]}'])), headers)
    assert status == 201 and doc["job"] == {"command": ["x"]}, doc


@pytest.mark.parametrize("number", ["9" * 5000, "-" + "9" * 5000, "1." + "0" * 5000, "1" * 101])
def test_a_number_too_long_is_said_so_without_pythons_internals(number: str) -> None:
    body = b'{"tasks": ' + number.encode() + b"}"
    headers = {"authorization": f"Bearer {GOOD}", "content-length": str(len(body))}
    status, doc = call(
        resize_app(), "POST", "/v1/jobs/7/resize/grow", Stream(iter([body])), headers
    )
    assert (status, doc["code"]) == (400, "XCE_RESIZE_INVALID_REQUEST")
    assert doc["detail"] == (
        f"Invalid resize request: body has a number too long: {len(number)} characters, "
        f"at most 100 ({number[:20]}...)"
    )
