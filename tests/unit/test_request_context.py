"""Request ids, the per-request log context and the access line (rest.http.RequestContext,
rest.logcontext), and the controller's JSON log lines (controllers.live.logs), driven
as ASGI applications in-process: the id a client sends is echoed when sane and replaced
when not, every log line logged while a request is served names the request, its user
and its job (in a worker thread too), the observer sees the route's template (never the
raw path) and a bounded method, and an exception that escapes a route is answered 500
with the id."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.conftest import http_scope
from xce_resize_plugin.controllers.live.logs import JsonFormatter
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest import http
from xce_resize_plugin.rest.logcontext import ContextFilter, note_job, request_id, sane
from xce_resize_plugin.rest.operation import Operation

GOOD = "good-token-123"
SHOW = Operation("show", "GET", "/v1/things/{id}", "one thing", errors=(401,))
log = logging.getLogger("tests.request_context")


def _authenticate(token: str | None) -> Principal | None:
    return Principal("alice") if token == GOOD else None


async def _show(request: Request, principal: Principal) -> Response:
    log.info("in the event loop")
    await run_in_threadpool(log.info, "in a worker thread")
    return http.reply({"id": request.path_params["id"]})


async def _boom(request: Request) -> Response:
    raise RuntimeError("a bug with a secret inside")


class Seen:
    """The observer: what it was told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    def __call__(self, route: str, method: str, status: int, seconds: float) -> None:
        assert seconds >= 0
        self.calls.append((route, method, status))


def app(seen: Seen | None = None) -> Starlette:
    routes = [
        http.ApiRoute(SHOW, http.endpoint(SHOW, _show, _authenticate)),
        Route("/boom", _boom),
    ]
    return Starlette(
        routes=routes,
        exception_handlers=http.exception_handlers(),
        middleware=[Middleware(http.RequestContext, observe=seen)],
    )


def call(
    application: Any, path: str, headers: dict[str, str], method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(application(http_scope(method, path, headers), receive, send))
    start = sent[0]
    answer = {k.decode(): v.decode() for k, v in start["headers"]}
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], answer, body


class Lines(logging.Handler):
    """A handler with the context filter, keeping each record's JSON line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.addFilter(ContextFilter())
        self.setFormatter(JsonFormatter())
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(self.format(record)))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_sane_request_id_is_kept_and_echoed() -> None:
    headers = {"authorization": f"Bearer {GOOD}", "X-Request-ID": "trace-42.a:b/c=d@e"}
    status, answer, _ = call(app(), "/v1/things/7", headers)
    assert status == 200 and answer["x-request-id"] == "trace-42.a:b/c=d@e"


@pytest.mark.parametrize(
    "sent", ["", "two words", "x" * 129, "line\nbreak", '"quoted"', "caf\u00e9", "a{b}"]
)
def test_any_other_request_id_is_replaced_by_a_new_one(sent: str) -> None:
    headers = {"X-Request-ID": sent.encode("utf-8").decode("latin-1")}
    status, answer, _ = call(app(), "/v1/things/7", headers)
    assert status == 401
    echoed = answer["x-request-id"]
    assert echoed != sent and len(echoed) == 16 and int(echoed, 16) >= 0


def test_without_a_request_id_each_request_gets_its_own() -> None:
    ids = {call(app(), "/v1/things/7", {})[1]["x-request-id"] for _ in range(5)}
    assert len(ids) == 5


def test_every_line_about_a_request_names_it_its_user_and_its_job(lines: Lines) -> None:
    headers = {"authorization": f"Bearer {GOOD}", "X-Request-ID": "req-1"}
    call(app(), "/v1/things/7", headers)
    mine = [line for line in lines.lines if line.get("request_id") == "req-1"]
    assert [line["message"] for line in mine] == [
        "in the event loop",
        "in a worker thread",
        mine[-1]["message"],
    ]
    assert mine[-1]["logger"] == "xce_resize_plugin.access"
    assert mine[-1]["message"].startswith("GET /v1/things/7 200 ")
    for line in mine:
        assert (line["user"], line["job"]) == ("alice", "7"), line
        assert set(line) == {"time", "level", "logger", "message", "request_id", "user", "job"}
        assert line["time"].endswith("Z") and line["level"] == "INFO"
    log.info("outside any request")
    assert "request_id" not in lines.lines[-1] and "user" not in lines.lines[-1]


def test_an_unauthenticated_request_has_no_user_and_no_token_in_the_log(lines: Lines) -> None:
    call(app(), "/v1/things/9", {"authorization": "Bearer not-a-known-token"})
    (access,) = [line for line in lines.lines if line["logger"] == "xce_resize_plugin.access"]
    assert access["job"] == "9" and "user" not in access
    assert "not-a-known-token" not in json.dumps(lines.lines)


def test_the_observer_sees_route_templates_never_raw_paths() -> None:
    seen = Seen()
    application = app(seen)
    call(application, "/v1/things/7", {"authorization": f"Bearer {GOOD}"})
    call(application, "/v1/things/8", {})
    call(application, "/no/such/path", {})
    call(application, "/v1/things/7", {"authorization": f"Bearer {GOOD}"}, method="BREW")
    assert seen.calls == [
        ("/v1/things/{id}", "GET", 200),
        ("/v1/things/{id}", "GET", 401),
        (http.UNMATCHED, "GET", 404),
        ("/v1/things/{id}", "BREW", 405),
    ]


def test_an_escaped_exception_is_answered_500_with_the_id(lines: Lines) -> None:
    seen = Seen()
    status, answer, body = call(app(seen), "/boom", {"X-Request-ID": "req-boom"})
    assert status == 500 and answer["x-request-id"] == "req-boom"
    assert json.loads(body)["code"] == "XCE_INTERNAL" and b"secret" not in body
    failed = [line for line in lines.lines if "exception" in line]
    assert failed and failed[0]["request_id"] == "req-boom"
    assert "RuntimeError" in failed[0]["exception"]
    assert seen.calls == [("/boom", "GET", 500)]


def test_a_strange_path_is_logged_quoted_and_bounded(lines: Lines) -> None:
    call(app(), "/v1/things/" + "x" * 1000, {})
    call(app(), "/caf\u00e9%0a", {})
    logged = [line["message"] for line in lines.lines if line["logger"].endswith("access")]
    assert len(logged[0]) < 300 and "x" * 300 not in logged[0]
    assert "\n" not in logged[1] and "caf" in logged[1]


def test_sane_ids_and_notes() -> None:
    assert sane("101") == "101" and sane(None) is None and sane("1 0") is None
    assert request_id("abc") == "abc" and request_id("a b") != "a b"
    note_job("101")  # outside a request: nothing to note, no error


def test_json_lines_hold_exceptions_and_values_json_cannot() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("bad")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "got %s", (object(),), None)
        record.exc_info = __import__("sys").exc_info()
    line = json.loads(formatter.format(record))
    assert line["message"].startswith("got <object object at")
    assert "ValueError: bad" in line["exception"] and line["level"] == "ERROR"
