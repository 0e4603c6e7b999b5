"""The HTTP layer every route is built with (Starlette): the resize routes and a host's.

An authenticated route is an :func:`endpoint` around a handler; what it does, in order:

1. authenticate ``Authorization: Bearer <token>`` through the host's
   ``authenticate`` (missing or unknown: 401), before any byte of the body is read, so
   a caller without a token cannot make the server read (or hold) a body;
2. run the handler, which reads its body (if it takes one) with :func:`read_body`:
   a declared ``Content-Length`` over the limit is refused before reading, and the
   stream is cut off as soon as it passes the limit (chunked or lying clients), so no
   more than the limit is ever buffered; a body not complete within the body deadline
   (:func:`body_timeout`) is answered 408 and the connection closed, so a client that
   stops half way cannot hold a handler for ever;
3. answer every :class:`~xce_resize_plugin.errors.ResizeError` as a problem document
   (:mod:`.problems`), and anything unexpected as a 500 problem document, logged.

Between 1 and 2, a user's requests in progress are counted (a job's token counts for
the job's owner): beyond :func:`request_limit` the request is refused 429 at once and
its connection closed, so that one user or one job — however many long polls or slow
bodies it opens — cannot take every connection the server can hold from other users.

Around the whole application, :class:`RequestContext` gives every request an id
(the client's ``X-Request-ID`` when sane, else a new one; echoed in the answer), opens
its log context (:mod:`.logcontext`: request id, then user and job as they are
learnt), logs an access line per request (logger ``xce_resize_plugin.access``, INFO;
the live controller keeps it off unless asked) and tells an optional observer the
route, method, status and duration (the live controller's metrics).
:class:`RequestThreads` gives the hook calls enough worker threads for every
concurrent change to wait for its fsync in one.

Routes are :class:`ApiRoute` objects: each carries the
:class:`~xce_resize_plugin.rest.operation.Operation` it serves, from which
:mod:`.openapi` describes it. This module imports Starlette: import it only when
routes are built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from anyio.to_thread import current_default_thread_limiter
from attrs import frozen
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from starlette.applications import Starlette

from xce_resize_plugin.errors import (
    BodyTimeout,
    ControllerStopping,
    InvalidRequest,
    NotAuthenticated,
    ResizeError,
    TooManyRequests,
)
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest import openapi
from xce_resize_plugin.rest.logcontext import CURRENT, RequestLog, note_job, request_id
from xce_resize_plugin.rest.operation import Operation
from xce_resize_plugin.rest.parsing import (
    bearer_token,
    check_json_type,
    check_query,
    declared_length,
)
from xce_resize_plugin.rest.problems import (
    JSON,
    PROBLEM_JSON,
    error_json,
    internal_json,
    render,
    retry_after,
    routing_json,
)

log = logging.getLogger(__name__)
#: One line per request served: method, path, status, milliseconds, at INFO (a host
#: that wants none sets this logger's level higher, as the live controller does unless
#: started with ``--access-log``).
access_log = logging.getLogger("xce_resize_plugin.access")

#: The host's token check (``Controller.authenticate``); called in a worker thread.
Authenticate = Callable[[str | None], Principal | None]
#: What an authenticated route does once it knows who asks.
Handler = Callable[[Request, Principal], Awaitable[Response]]
#: Which resize error answers an exception (``None``: a bug, answered 500).
Translate = Callable[[Exception], ResizeError | None]
Endpoint = Callable[[Request], Awaitable[Response]]
#: Told of every request served: its route (the path template, :data:`UNMATCHED` when
#: no route matched), method, status and duration in seconds. Called in the event loop:
#: it must be cheap and must not block.
RequestObserver = Callable[[str, str, int, float], None]
#: The route label of a request no route matched (never the raw path: unbounded).
UNMATCHED = "unmatched"
#: The header that carries a request's id, in and out.
REQUEST_ID = "X-Request-ID"
_REQUEST_ID = REQUEST_ID.lower().encode("ascii")
_MAX_LOGGED_PATH = 256

#: Seconds a request body may take to arrive, counted from when the handler starts
#: reading it (right after authentication), unless the host sets its own deadline
#: (:func:`set_body_timeout`).
DEFAULT_BODY_TIMEOUT = 30.0
_BODY_TIMEOUT = "xce_body_timeout"
_STOPPING = "xce_stopping"

#: Requests one user may have in progress at once (their jobs' tokens included) unless
#: the host sets its own limit (:func:`set_request_limit`). Each holds a connection and
#: a file descriptor of the server — a long poll up to a minute, a slow body up to the
#: body deadline — and a server that runs out of descriptors accepts nobody's request
#: (a controller under the usual soft limit of 1024 did so with one job's 1100 waits).
#: Well above what the tasks of a job ask at once (one call each, a long poll or two).
DEFAULT_REQUEST_LIMIT = 256
#: Seconds a client refused by the request limit waits before it asks again.
REQUEST_LIMIT_RETRY = 1
_REQUEST_LIMIT = "xce_request_limit"
_IN_PROGRESS = "xce_requests_in_progress"


# --- answers -----------------------------------------------------------------------------


def reply(data: Any, status: int = 200, media_type: str = JSON) -> Response:
    """A JSON answer."""
    return Response(render(data), status_code=status, media_type=media_type)


def problem(error: ResizeError) -> Response:
    """The problem-document answer of ``error`` (a 401 says how to authenticate; a 408
    closes the connection, whose unread rest of a body would be taken for the next
    request)."""
    response = reply(error_json(error), error.http_status, PROBLEM_JSON)
    if error.http_status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="xce"'
    elif error.http_status == 408:
        response.headers["Connection"] = "close"
    elif isinstance(error, TooManyRequests):
        # Closed, so that a refused client holds no connection: it opens a new one
        # when it asks again.
        response.headers["Connection"] = "close"
        response.headers["Retry-After"] = str(REQUEST_LIMIT_RETRY)
    seconds = retry_after(error)
    if seconds is not None:
        response.headers["Retry-After"] = str(seconds)
    return response


def internal() -> Response:
    """The answer to a bug: a 500 problem document whose text stays in the log."""
    return reply(internal_json(), 500, PROBLEM_JSON)


# --- authentication and the request body -------------------------------------------------


async def authenticated(request: Request, authenticate: Authenticate) -> Principal:
    """Who sends ``request``; :class:`NotAuthenticated` (401) for no or an unknown
    token, or for two ``Authorization`` headers (which one a proxy in front reads is
    its own choice: neither is taken)."""
    given = request.headers.getlist("authorization")
    if len(given) > 1:
        raise NotAuthenticated("one Authorization header, not several")
    token = bearer_token(given[0] if given else None)
    principal = await run_in_threadpool(authenticate, token) if token else None
    if principal is None:
        raise NotAuthenticated(
            "send Authorization: Bearer <token>" if token is None else "unknown token"
        )
    current = CURRENT.get()
    if current is not None:
        current.user = principal.name
        if current.job is None:
            current.job = principal.job_id
    return principal


@frozen
class BodyLimit:
    """At most ``size`` bytes of body. ``too_large`` makes the refusal from the declared
    ``Content-Length`` (``None`` when a stream passed the limit while being read)."""

    size: int
    too_large: Callable[[int | None], ResizeError]


def exact_paths(app: Starlette) -> Starlette:
    """Answer a path with a trailing slash as any unknown path (404, a problem
    document), not with Starlette's redirect to the path without it: that redirect had
    no body and took its host from the client's ``Host`` header, so a client that
    follows redirects could be sent anywhere by whoever wrote the header."""
    app.router.redirect_slashes = False
    return app


def set_body_timeout(app: Starlette, seconds: float) -> None:
    """Make ``seconds`` the body deadline of every route ``app`` serves that reads its
    body with :func:`read_body` (the host's own routes and the plugin's alike)."""
    setattr(app.state, _BODY_TIMEOUT, float(seconds))


def set_stopping(app: Starlette, stopping: Callable[[], bool]) -> None:
    """Tell ``app``'s long polls how to know that the host has begun to stop: each then
    answers 503 ``XCE_CONTROLLER_STOPPING`` at its next look, instead of being cut off
    by the server's shutdown (a plain 500 for the client)."""
    setattr(app.state, _STOPPING, stopping)


def set_request_limit(app: Starlette, requests: int) -> None:
    """Make ``requests`` the most requests one user may have in progress at once on
    ``app``'s routes built with :func:`endpoint` (:data:`DEFAULT_REQUEST_LIMIT` when
    the host sets none)."""
    if requests < 1:
        raise ValueError(f"a request limit is at least 1, got {requests}")
    setattr(app.state, _REQUEST_LIMIT, int(requests))


def request_limit(request: Request) -> int:
    """The request limit of ``request``'s application (:func:`set_request_limit`)."""
    app = request.scope.get("app")
    limit = getattr(getattr(app, "state", None), _REQUEST_LIMIT, None)
    return DEFAULT_REQUEST_LIMIT if limit is None else int(limit)


@contextlib.contextmanager
def in_progress(request: Request, principal: Principal) -> Iterator[None]:
    """Count ``request`` among its user's requests in progress while it is served;
    :class:`TooManyRequests` when that user has :func:`request_limit` in progress
    already. Counted per user, a job's token for its owner: a user cannot escape the
    limit by submitting jobs."""
    state = getattr(request.scope.get("app"), "state", None)
    if state is None:  # not served by an application: nothing to share a count with
        yield
        return
    counts: dict[str, int] | None = getattr(state, _IN_PROGRESS, None)
    if counts is None:
        counts = {}
        setattr(state, _IN_PROGRESS, counts)
    with counted(counts, principal.name, request_limit(request), "requests"):
        yield


@contextlib.contextmanager
def counted(
    counts: dict[str, int], user: str, limit: int, what: str, who: str | None = None
) -> Iterator[None]:
    """One more of ``user``'s ``what`` in ``counts`` while the block runs;
    :class:`TooManyRequests` (429, ``Retry-After``), nothing counted, when ``limit`` are
    in progress already (the message names ``who``, by default the user). Only the
    event loop's thread may use one ``counts``: no lock is needed around it."""
    held = counts.get(user, 0)
    if held >= limit:
        holder = f"user {user}" if who is None else who
        raise TooManyRequests(f"{holder} has {held} {what} in progress, at most {limit}")
    counts[user] = held + 1
    try:
        yield
    finally:
        left = counts[user] - 1
        if left:
            counts[user] = left
        else:
            del counts[user]  # users come and go: keep no entry for one with none


def check_serving(request: Request) -> None:
    """Raise :class:`ControllerStopping` once the host said it stops (:func:`set_stopping`)."""
    app = request.scope.get("app")
    stopping = getattr(getattr(app, "state", None), _STOPPING, None)
    if stopping is not None and stopping():
        raise ControllerStopping("shutting down")


def body_timeout(request: Request) -> float:
    """The body deadline of ``request``: its application's (:func:`set_body_timeout`),
    else :data:`DEFAULT_BODY_TIMEOUT`."""
    app = request.scope.get("app")
    seconds = getattr(getattr(app, "state", None), _BODY_TIMEOUT, None)
    return DEFAULT_BODY_TIMEOUT if seconds is None else float(seconds)


async def read_json_body(request: Request, limit: BodyLimit) -> bytes:
    """:func:`read_body`, and a body there is must be declared JSON (or not declared),
    in UTF-8 (:func:`~.parsing.check_json_type`; 415 otherwise): every route that
    takes a body, the resize routes and the host's alike."""
    raw = await read_body(request, limit)
    if raw:
        check_json_type(request.headers.get("content-type"))
    return raw


async def read_body(request: Request, limit: BodyLimit) -> bytes:
    """The request body, never more than ``limit.size`` bytes of it read, and all of it
    within :func:`body_timeout` seconds (:class:`BodyTimeout`, 408, otherwise)."""
    declared = declared_length(request.headers.get("content-length"))
    if declared is not None and declared > limit.size:
        raise limit.too_large(declared)
    chunks: list[bytes] = []
    size = 0
    seconds = body_timeout(request)
    try:
        # Read in chunks and stop at the limit: a client that lies about (or omits) the
        # length cannot make the server buffer more than the limit. The deadline is for
        # the whole body: a client that sends a byte now and then is cut off too.
        async with asyncio.timeout(seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit.size:
                    raise limit.too_large(None)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(f"only {size} bytes in the {seconds:g} s allowed") from None
    except ClientDisconnect:
        # Nobody reads the answer; a refusal (not a 500 with a traceback in the log).
        raise InvalidRequest(
            "the client closed the connection before the body was complete"
        ) from None
    return b"".join(chunks)


# --- endpoints and routes ----------------------------------------------------------------


def as_resize_error(exc: Exception) -> ResizeError | None:
    """The default :data:`Translate`: resize errors answer themselves."""
    return exc if isinstance(exc, ResizeError) else None


def endpoint(
    op: Operation,
    handler: Handler,
    authenticate: Authenticate,
    translate: Translate = as_resize_error,
) -> Endpoint:
    """The Starlette endpoint of ``op``: authenticate first, then ``handler``; every
    refusal a problem document (see the module docstring)."""

    async def handle(request: Request) -> Response:
        held = contextlib.ExitStack()  # the request's place among its user's in progress
        try:
            note_job(request.path_params.get("id"))
            principal = await authenticated(request, authenticate)
            # Every operation refuses a query parameter it does not take, or one given
            # twice: a client that believes it filters (``GET /v1/jobs?user=bob``)
            # must not get everything it may see without a word.
            check_query(request.query_params.multi_items(), op)
            held.enter_context(in_progress(request, principal))
            return _SentWhileHeld(await handler(request, principal), held)
        except BaseException as exc:
            held.close()  # (also when the handler is cancelled: its client went away)
            if not isinstance(exc, Exception):
                raise
            error = translate(exc)
            if error is None:  # a bug: answer a problem document, never a bare 500
                log.exception("%s %s failed", request.method, request.url.path)
                return internal()
            return problem(error)

    handle.__name__ = op.name
    return handle


class _SentWhileHeld(Response):
    """A handler's answer that keeps its request counted among its user's requests in
    progress (:func:`in_progress`) until it is sent: a client that does not read a
    large answer holds its connection as long as the write waits for it, and must
    count as long."""

    def __init__(self, answer: Response, held: contextlib.ExitStack) -> None:
        # Not Response.__init__: the answer is already made; this only wraps it.
        self.answer = answer
        self.held = held
        self.status_code = answer.status_code
        self.background = answer.background
        self.raw_headers = answer.raw_headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.answer(scope, receive, send)
        finally:
            self.held.close()


class ApiRoute(Route):
    """A route that serves an :class:`Operation`; :func:`.openapi.document` describes
    it by that operation and the ``schemas`` it names."""

    def __init__(
        self, operation: Operation, endpoint: Endpoint, schemas: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(operation.path, endpoint, methods=[operation.method], name=operation.name)
        self.operation = operation
        self.schemas: Mapping[str, Any] = dict(schemas or {})


def openapi_route(title: str, version: str, routes: Iterable[BaseRoute]) -> ApiRoute:
    """``GET /openapi.json``, serving the document of ``routes`` and of itself."""
    body = b""

    async def serve(request: Request) -> Response:
        return Response(body, media_type=JSON)

    route = ApiRoute(openapi.DOCUMENT, serve)
    # The closure reads ``body`` when a request comes, after it is set here.
    body = render(openapi.document(title, version, [*routes, route]))
    return route


# --- around the application: request ids, log context, access lines, metrics ------------


class RequestContext:
    """ASGI middleware: the request id, the log context, the access line and the
    observer's call of every HTTP request (see the module docstring).

    An exception that escapes the application before it answered (a route not built
    with :func:`endpoint`) is logged and answered here, as :func:`internal`, so that
    its log line and its answer carry the request id too.
    """

    def __init__(self, app: ASGIApp, observe: RequestObserver | None = None) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        rid = request_id(_header(scope, _REQUEST_ID))
        context = CURRENT.set(RequestLog(rid))
        echo = (_REQUEST_ID, rid.encode("ascii"))
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), echo]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("%s %s failed", scope["method"], _logged_path(scope))
            if status:
                raise  # the answer had begun: nothing more can be said
            await internal()(scope, receive, send_with_id)
        finally:
            try:
                self._served(scope, status or 500, time.perf_counter() - began)
            finally:
                CURRENT.reset(context)

    def _served(self, scope: Scope, status: int, seconds: float) -> None:
        method = scope["method"]
        if self.observe is not None:
            route = getattr(scope.get("route"), "path", None)
            self.observe(route if isinstance(route, str) else UNMATCHED, method, status, seconds)
        if access_log.isEnabledFor(logging.INFO):
            path = _logged_path(scope)
            access_log.info("%s %s %d %.1f ms", method, path, status, seconds * 1e3)


#: Worker threads for hook calls (at least). A change holds its thread until its facts
#: are durable, so each concurrent change needs one: with anyio's default of 40, the
#: changes of more clients waited in the event loop, undecided, instead of sharing the
#: next fsync (docs/performance.md, "Durable REST throughput").
REQUEST_THREADS = 128


class RequestThreads:
    """ASGI middleware: the event loop's worker threads for hook calls (Starlette's
    ``run_in_threadpool``, anyio's default limiter) are at least ``threads``."""

    def __init__(self, app: ASGIApp, threads: int = REQUEST_THREADS) -> None:
        self.app = app
        self.threads = threads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The limiter belongs to the running event loop: checked at every request (a
        # look-up), so that any loop serving the application has the threads.
        limiter = current_default_thread_limiter()
        if limiter.total_tokens < self.threads:
            limiter.total_tokens = self.threads
        await self.app(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str | None:
    """The first ``name`` header of the request (latin-1, as HTTP has it), or ``None``."""
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _logged_path(scope: Scope) -> str:
    """The request's path as a log line may show it: as sent (percent-encoded, no
    query string: nothing secret travels there, but keep it out anyway), bounded, and
    quoted if it holds anything but printable ASCII."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "backslashreplace")
    path = bytes(raw).split(b"?", 1)[0][:_MAX_LOGGED_PATH].decode("ascii", "backslashreplace")
    return path if path.isprintable() and " " not in path else repr(path)


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette exception handlers that answer routing errors (404, 405), resize
    errors and uncaught exceptions as problem documents."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        doc = routing_json(exc.status_code, str(exc.detail))
        response = reply(doc, exc.status_code, PROBLEM_JSON)
        response.headers.update(exc.headers or {})
        return response

    async def resize_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ResizeError)
        return problem(exc)

    async def uncaught(request: Request, exc: Exception) -> Response:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return internal()

    return {HTTPException: http_error, ResizeError: resize_error, Exception: uncaught}


__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_REQUEST_LIMIT",
    "REQUEST_ID",
    "REQUEST_LIMIT_RETRY",
    "REQUEST_THREADS",
    "UNMATCHED",
    "ApiRoute",
    "Authenticate",
    "BodyLimit",
    "Endpoint",
    "Handler",
    "RequestContext",
    "RequestObserver",
    "RequestThreads",
    "Translate",
    "as_resize_error",
    "authenticated",
    "body_timeout",
    "counted",
    "endpoint",
    "exception_handlers",
    "in_progress",
    "internal",
    "openapi_route",
    "problem",
    "read_body",
    "read_json_body",
    "reply",
    "request_limit",
    "set_body_timeout",
    "set_request_limit",
]
