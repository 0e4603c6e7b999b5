"""The resize REST API: ASGI routes the host mounts, and their OpenAPI description.

The host gets the routes from the ``xce_rest_routes`` hook (:func:`routes`) and merges
:func:`openapi_paths` into its own ``/openapi.json``; a host with no API of its own can
serve :func:`app`. Both the routes and the document are built from one table of
operations (:data:`OPERATIONS`), so what is documented is what is served.

What every route does, in order:

1. authenticate ``Authorization: Bearer <token>`` through ``controller.authenticate``
   (missing or unknown: 401);
2. check the path's job id and the query string (unknown parameters are refused);
3. for a change, read at most :data:`MAX_BODY` bytes of JSON and decode it with the
   strict API converter (:mod:`.converters`), so a rejected body names the field
   (``… @ $.tasks``);
4. call the host hooks — ``xce_resize_request`` for a change, which authorises the
   principal and returns only once the change's facts are durable; for a query the
   ``xce_resize_authorize`` policy with action ``view`` and then ``xce_resize_status``
   or ``xce_acct_usage`` — in a worker thread, because the journal's fsync blocks.

Every :class:`~xce_resize_plugin.errors.ResizeError` becomes an RFC 9457 problem
document (``application/problem+json``) carrying LSF's code name, number and message;
so does anything unexpected (500, logged), which would be a bug.

Why only the hooks and never the runtime: the routes then work for any host and any
plugin that implements the request hooks, and the embedded controller serves them
exactly as XCE would. Starlette is imported only when routes are built, so importing
the plugin (which the host does at start) stays light.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from attrs import frozen

from xce_resize_plugin.core import converters
from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.models import (
    CancelRequest,
    JobInfo,
    JobState,
    ResizeRecord,
    ResizeRequest,
    host_counts,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.errors import (
    BadJobId,
    BodyTooLarge,
    InvalidRequest,
    NoJob,
    NotAuthenticated,
    PermissionDenied,
    ResizeError,
    UnsupportedMediaType,
)
from xce_resize_plugin.host import Controller, Principal

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

log = logging.getLogger(__name__)

#: Largest request body accepted (bytes). A resize body is a few hundred bytes; a
#: notification command is under 4096 bytes.
MAX_BODY = 64 * 1024
#: Longest a ``wait`` holds the connection (seconds); longer timeouts are capped.
MAX_WAIT = 60.0
DEFAULT_WAIT = 30.0
#: Job ids longer than this are refused before any lookup (as the runtime does).
MAX_JOB_ID = 64
#: Largest ``version`` a ``wait`` accepts (a signed 64-bit integer, as hosts store it).
MAX_VERSION = 2**63 - 1
#: Base of the problem ``type`` URIs: the code is appended.
PROBLEM_BASE = "https://xce.example/problems/"
PROBLEM_JSON = "application/problem+json"
BEARER = "bearer"

# Polling of the wait route (seconds): fast at first, since a change that completes
# within one host cycle is the common case, then gentler on the controller.
_POLL_FIRST, _POLL_MAX = 0.02, 0.25


# --- errors only the HTTP layer raises ------------------------------------------------


class NoResizeHook(ResizeError):
    """No plugin answered ``xce_resize_*`` (the resize plugin is not registered)."""

    code = "XCE_RESIZE_NO_PLUGIN"
    message = "No resize plugin answered: it is not registered with this controller"
    http_status = 503


# --- JSON shapes of the answers ------------------------------------------------------


def _tasks_json(tasks: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"id": t.id, "host": t.host} for t in tasks]


def status_json(status: ResizeStatus) -> dict[str, Any]:
    """The ``ResizeStatus`` schema: allocation, bounds, pending grow, change in flight."""
    pending = status.pending
    return {
        "job_id": status.job_id,
        "phase": status.phase.value,
        "tasks": _tasks_json(status.tasks),
        "hosts": host_counts(status.tasks),
        "min_tasks": status.min_tasks,
        "max_tasks": status.max_tasks,
        "version": status.version,
        "pending": (
            None
            if pending is None
            else {
                "min": pending.min_add,
                "max": pending.max_add,
                "failures": pending.failures,
                "requested_at": pending.requested_at,
            }
        ),
        "in_flight": (
            None
            if status.in_flight is None
            else {"kind": status.in_flight.value, "tasks": _tasks_json(status.in_flight_tasks)}
        ),
    }


def record_json(record: ResizeRecord) -> dict[str, Any]:
    """One resize record, the same shape as a scenario's ``resize_records`` entries."""
    return {
        "time": record.time,
        "type": record.kind.value,
        "before": host_counts(record.before),
        "delta": host_counts(record.delta),
        "after": host_counts(record.after),
        "delta_tasks": [t.id for t in record.delta],
        "version": record.version,
    }


def history_json(usage: Usage) -> dict[str, Any]:
    """The ``ResizeHistory`` schema: the charged-slots timeline and the resize records."""
    return {
        "job_id": usage.job_id,
        "segments": [{"start": s.start, "end": s.end, "slots": s.slots} for s in usage.segments],
        "slot_seconds": float(usage.slot_seconds),
        "records": [record_json(r) for r in usage.records],
    }


def problem_json(
    status: int, title: str, detail: str, code: str, lsf_number: int | None = None
) -> dict[str, Any]:
    """An RFC 9457 problem document with the resize extension members."""
    return {
        "type": PROBLEM_BASE + code,
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
        "lsf_number": lsf_number,
    }


def error_json(error: ResizeError) -> dict[str, Any]:
    """The problem document of a resize error: LSF's code name, number and message."""
    return problem_json(error.http_status, error.message, error.text, error.code, error.lsf_number)


def _render(data: Any) -> bytes:
    # ensure_ascii=False keeps host names readable; "backslashreplace" turns a lone
    # surrogate (which json.loads lets through) into a \udXXX escape, which is itself
    # valid JSON, so a reply can never fail to encode.
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")


# --- the operations: one table for the routes and the OpenAPI document ---------------


@frozen
class Param:
    """A query parameter: its name, schema, whether it is required, what it means."""

    name: str
    schema: Mapping[str, Any]
    required: bool
    description: str


@frozen
class Operation:
    """One served operation; :func:`routes` and :func:`openapi_paths` both read these."""

    name: str
    method: str
    path: str
    summary: str
    description: str
    status: int
    response: str
    body: str | None = None
    query: tuple[Param, ...] = ()


JOB_PATH = "/v1/jobs/{id}/resize"

OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "resize_status",
        "GET",
        JOB_PATH,
        "The job's resize state",
        "The committed allocation, the bounds, the pending grow and the change in flight.",
        200,
        "ResizeStatus",
    ),
    Operation(
        "resize_grow",
        "POST",
        JOB_PATH + "/grow",
        "Ask for more tasks (bresize request)",
        "The request pends until the scheduler can place at least `min_tasks` more "
        "tasks. Answered once the request is durable, with the job's resize state.",
        202,
        "ResizeStatus",
        body="ResizeGrowRequest",
    ),
    Operation(
        "resize_release",
        "POST",
        JOB_PATH + "/release",
        "Give tasks back (bresize release)",
        "Exactly one of `spec`, `hosts`, `task_ids`, `count`. Answered once the release "
        "is durable; the tasks are stopped afterwards (see the `wait` operation).",
        202,
        "ResizeStatus",
        body="ResizeReleaseRequest",
    ),
    Operation(
        "resize_cancel",
        "DELETE",
        JOB_PATH + "/pending",
        "Cancel the pending grow (bresize cancel)",
        "Takes no body. Answered once the cancellation is durable.",
        200,
        "ResizeStatus",
    ),
    Operation(
        "resize_history",
        "GET",
        JOB_PATH + "/history",
        "The job's allocation timeline and resize records",
        "Segments of charged slots up to now, their slot-seconds, and one record per "
        "committed change (LSF's JOB_RESIZE).",
        200,
        "ResizeHistory",
    ),
    Operation(
        "resize_wait",
        "GET",
        JOB_PATH + "/wait",
        "Wait for a resize to finish (long poll, for the in-job API)",
        "Answers as soon as nothing is pending or in flight and the allocation version "
        "is greater than `version` (`done` is true); or when a change that was pending "
        "or in flight during the wait ended without a new version (it failed or was "
        "cancelled); or when the job ends; or after `timeout` seconds (capped at 60). "
        "`done` is false in the last three cases.",
        200,
        "ResizeWaitResult",
        query=(
            Param(
                "version",
                {"type": "integer", "minimum": 0, "maximum": MAX_VERSION},
                True,
                "The allocation version the caller knows (from the change's answer).",
            ),
            Param(
                "timeout",
                {"type": "number", "minimum": 0, "default": DEFAULT_WAIT},
                False,
                f"Seconds to wait at most; values above {MAX_WAIT:g} are capped.",
            ),
        ),
    ),
)

# The problem statuses each kind of operation can answer (documented per operation).
_QUERY_ERRORS = (400, 401, 403, 404, 503)
_CHANGE_ERRORS = (400, 401, 403, 404, 409, 413, 415, 503)


# --- request parsing ---------------------------------------------------------------------

_BEARER_RE = re.compile(r"\A[Bb][Ee][Aa][Rr][Ee][Rr] +(\S+) *\Z")
_INT_RE = re.compile(r"\A[0-9]{1,19}\Z")
_NUMBER_RE = re.compile(r"\A-?[0-9]{1,40}(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?\Z")
_JSON_TYPES = re.compile(r"\Aapplication/([a-z0-9.+-]+\+)?json\Z")


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else ``None``."""
    if not header:
        return None
    match = _BEARER_RE.match(header)
    return match.group(1) if match else None


def check_job_id(job_id: str) -> str:
    """Refuse an empty or overlong job id before any lookup."""
    if not job_id or len(job_id) > MAX_JOB_ID:
        raise BadJobId(f"job id must be 1 to {MAX_JOB_ID} characters, got {len(job_id)}")
    return job_id


def check_query(query: Iterable[tuple[str, str]], op: Operation) -> dict[str, str]:
    """The query parameters of ``op``, refusing unknown or repeated ones."""
    known = {p.name for p in op.query}
    out: dict[str, str] = {}
    for name, value in query:
        if name not in known:
            raise InvalidRequest(f"unknown query parameter {name!r}")
        if name in out:
            raise InvalidRequest(f"query parameter {name!r} given twice")
        out[name] = value
    for param in op.query:
        if param.required and param.name not in out:
            raise InvalidRequest(f"missing query parameter {param.name!r}")
    return out


def parse_version(text: str) -> int:
    """``version``: a decimal integer in 0..MAX_VERSION."""
    if not _INT_RE.match(text) or int(text) > MAX_VERSION:
        raise InvalidRequest(f"version must be an integer from 0 to {MAX_VERSION}, got {text!r}")
    return int(text)


def parse_timeout(text: str | None) -> float:
    """``timeout``: a non-negative number of seconds, capped at :data:`MAX_WAIT`."""
    if text is None:
        return DEFAULT_WAIT
    # A number too large for a float ("1e999") is still a number: it is capped below.
    value = float(text) if _NUMBER_RE.match(text) else math.nan
    if not value >= 0:  # also refuses NaN
        raise InvalidRequest(f"timeout must be a number of seconds >= 0, got {text!r}")
    return min(value, MAX_WAIT)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _number(text: str) -> int | float:
    # JSON has one number type: 2.0 and 2e0 are the integer 2, as JSON Schema (and so
    # the OpenAPI document) says. Decimal keeps that exact; the exponent bound keeps a
    # "1e999999" from becoming a huge int (it stays a float, which the fields refuse).
    value = Decimal(text)
    if value.adjusted() < 20 and value == value.to_integral_value():
        return int(value)
    return float(text)


def parse_json(raw: bytes) -> Any:
    """Decode a UTF-8 JSON document strictly (no NaN/Infinity, no lone surrogates)."""
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant, parse_float=_number)
        # A lone surrogate (\\ud800) decodes into a str no encoder accepts: refuse it
        # here rather than fail later on a notification command or a log line.
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except RecursionError:
        raise InvalidRequest("body is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"body is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    except UnicodeEncodeError:
        raise InvalidRequest("body has a string with a lone surrogate (\\uD800-\\uDFFF)") from None
    except ValueError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    return data


def check_fields(data: Any, allowed: Iterable[str], what: str) -> None:
    """Refuse unknown top-level fields by their API names.

    The converters rename ``tasks``/``min_tasks`` to the model's ``max_add``/``min_add``
    before structuring, so a body that says ``max_add`` itself must be stopped here.
    """
    if isinstance(data, Mapping):
        known = set(allowed)
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown:
            where = ", ".join(f"$.{k}" for k in unknown)
            raise InvalidRequest(f"{what}: unknown field(s) @ {where}")


async def read_body(request: Request) -> bytes:
    """The request body, refusing more than :data:`MAX_BODY` bytes and non-JSON types."""
    length = request.headers.get("content-length")
    if length is not None:
        if not _INT_RE.match(length.strip()):
            raise InvalidRequest(f"bad Content-Length {length!r}")
        if int(length) > MAX_BODY:
            raise BodyTooLarge(f"{int(length)} bytes, at most {MAX_BODY}")
    chunks: list[bytes] = []
    size = 0
    # Read in chunks and stop at the limit: a client that lies about (or omits) the
    # length cannot make the controller buffer more than MAX_BODY.
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise BodyTooLarge(f"more than {MAX_BODY} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if raw:
        ctype = request.headers.get("content-type")
        if ctype is not None:
            media = ctype.split(";", 1)[0].strip().lower()
            if not _JSON_TYPES.match(media):
                raise UnsupportedMediaType(f"got {media or 'an empty type'!r}")
    return raw


# --- the routes --------------------------------------------------------------------------

Handler = Callable[["Request"], Awaitable["Response"]]


def routes(controller: Controller) -> list[Route]:
    """The resize routes for ``controller`` (what ``xce_rest_routes`` returns)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response
    from starlette.routing import Route

    hook = controller.plugin_manager.hook

    def reply(data: Any, status: int, media_type: str = "application/json") -> Response:
        return Response(_render(data), status_code=status, media_type=media_type)

    def problem(error: ResizeError) -> Response:
        headers = {"WWW-Authenticate": 'Bearer realm="xce"'} if error.http_status == 401 else {}
        response = reply(error_json(error), error.http_status, PROBLEM_JSON)
        response.headers.update(headers)
        return response

    def endpoint(
        op: Operation, body: Callable[[Request, Principal, str], Awaitable[Response]]
    ) -> Handler:
        async def handle(request: Request) -> Response:
            try:
                token = bearer_token(request.headers.get("authorization"))
                principal = (
                    await run_in_threadpool(controller.authenticate, token) if token else None
                )
                if principal is None:
                    raise NotAuthenticated(
                        "send Authorization: Bearer <token>" if token is None else "unknown token"
                    )
                job_id = check_job_id(request.path_params["id"])
                return await body(request, principal, job_id)
            except ResizeError as exc:
                return problem(exc)
            except Exception:  # a bug: answer a problem document, never a bare 500
                log.exception("%s %s failed", op.method, request.url.path)
                return reply(
                    problem_json(500, "Internal error", "see the controller log", "XCE_INTERNAL"),
                    500,
                    PROBLEM_JSON,
                )

        handle.__name__ = op.name
        return handle

    # --- work done in a worker thread (the hooks may block on the journal) ---

    def view(principal: Principal, job_id: str) -> JobInfo:
        job = controller.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        if not hook.xce_resize_authorize(principal=principal, job=job, action="view"):
            raise PermissionDenied(f"{principal.name} may not view job {job_id}")
        return job

    def status_of(job_id: str) -> ResizeStatus:
        status: ResizeStatus | None = hook.xce_resize_status(controller=controller, job_id=job_id)
        if status is None:
            if controller.get_job(job_id) is None:
                raise NoJob(f"job {job_id}")
            raise NoResizeHook("no plugin answered xce_resize_status")
        return status

    def query_status(principal: Principal, job_id: str) -> ResizeStatus:
        view(principal, job_id)
        return status_of(job_id)

    def query_history(principal: Principal, job_id: str) -> Usage:
        view(principal, job_id)
        usage: Usage | None = hook.xce_acct_usage(
            controller=controller, job_id=job_id, now=controller.now()
        )
        if usage is None:
            raise NoResizeHook("no plugin answered xce_acct_usage")
        return usage

    def change(principal: Principal, job_id: str, request: ResizeRequest) -> ResizeStatus:
        status: ResizeStatus | None = hook.xce_resize_request(
            controller=controller, principal=principal, job_id=job_id, request=request
        )
        if status is None:
            raise NoResizeHook("no plugin answered xce_resize_request")
        return status

    def poll(job_id: str) -> tuple[ResizeStatus, JobState]:
        job = controller.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        return status_of(job_id), job.state

    # --- the operations ---

    def only_known_query(request: Request, op: Operation) -> None:
        check_query(request.query_params.multi_items(), op)

    async def get_status(request: Request, principal: Principal, job_id: str) -> Response:
        only_known_query(request, ops["resize_status"])
        status = await run_in_threadpool(query_status, principal, job_id)
        return reply(status_json(status), 200)

    async def get_history(request: Request, principal: Principal, job_id: str) -> Response:
        only_known_query(request, ops["resize_history"])
        usage = await run_in_threadpool(query_history, principal, job_id)
        return reply(history_json(usage), 200)

    async def post_grow(request: Request, principal: Principal, job_id: str) -> Response:
        only_known_query(request, ops["resize_grow"])
        data = await json_body(request, "grow")
        check_fields(data, _schema_fields("ResizeGrowRequest"), "grow")
        grow = converters.grow_from_json(data)
        status = await run_in_threadpool(change, principal, job_id, grow)
        return reply(status_json(status), 202)

    async def post_release(request: Request, principal: Principal, job_id: str) -> Response:
        only_known_query(request, ops["resize_release"])
        data = await json_body(request, "release")
        check_fields(data, _schema_fields("ResizeReleaseRequest"), "release")
        release = converters.release_from_json(data)
        status = await run_in_threadpool(change, principal, job_id, release)
        return reply(status_json(status), 202)

    async def delete_pending(request: Request, principal: Principal, job_id: str) -> Response:
        only_known_query(request, ops["resize_cancel"])
        if await read_body(request):
            raise InvalidRequest("cancel takes no body")
        status = await run_in_threadpool(change, principal, job_id, CancelRequest())
        return reply(status_json(status), 200)

    async def get_wait(request: Request, principal: Principal, job_id: str) -> Response:
        query = check_query(request.query_params.multi_items(), ops["resize_wait"])
        version = parse_version(query["version"])
        timeout = parse_timeout(query.get("timeout"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await run_in_threadpool(view, principal, job_id)
        delay = _POLL_FIRST
        saw_change = False
        while True:
            status, job_state = await run_in_threadpool(poll, job_id)
            idle = status.pending is None and status.in_flight is None
            done = idle and status.version > version
            saw_change = saw_change or not idle
            ended = job_state in (JobState.DONE, JobState.EXIT)
            left = deadline - loop.time()
            if done or ended or (idle and saw_change) or left <= 0:
                break
            if await request.is_disconnected():
                break  # nobody to answer; stop polling the controller
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)
        result = status_json(status)
        result.update(done=done, job_state=job_state.value)
        return reply(result, 200)

    async def json_body(request: Request, what: str) -> Any:
        raw = await read_body(request)
        if not raw:
            raise InvalidRequest(f"{what}: a JSON object body is required")
        return parse_json(raw)

    ops = {op.name: op for op in OPERATIONS}
    bodies: dict[str, Callable[[Request, Principal, str], Awaitable[Response]]] = {
        "resize_status": get_status,
        "resize_grow": post_grow,
        "resize_release": post_release,
        "resize_cancel": delete_pending,
        "resize_history": get_history,
        "resize_wait": get_wait,
    }
    return [
        Route(op.path, endpoint(op, bodies[op.name]), methods=[op.method], name=op.name)
        for op in OPERATIONS
    ]


def exception_handlers() -> dict[Any, Callable[[Request, Exception], Awaitable[Response]]]:
    """Starlette exception handlers that answer routing errors (404, 405) and uncaught
    exceptions as problem documents, for an app that serves only these routes."""
    from starlette.exceptions import HTTPException
    from starlette.responses import Response

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        doc = problem_json(exc.status_code, exc.detail, exc.detail, f"HTTP_{exc.status_code}")
        doc["type"] = "about:blank"
        return Response(_render(doc), exc.status_code, headers=exc.headers, media_type=PROBLEM_JSON)

    async def internal(request: Request, exc: Exception) -> Response:
        doc = problem_json(500, "Internal error", "see the controller log", "XCE_INTERNAL")
        return Response(_render(doc), 500, media_type=PROBLEM_JSON)

    return {HTTPException: http_error, Exception: internal}


def app(controller: Controller, *, title: str = "XCE resize API", version: str = "") -> Starlette:
    """A Starlette app serving only the resize routes and ``/openapi.json``: for a host
    (or a test) with no API of its own."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from xce_resize_plugin import __version__

    document = openapi_document(title, version or __version__)

    async def openapi(request: Request) -> Response:
        return Response(_render(document), media_type="application/json")

    return Starlette(
        routes=[*routes(controller), Route("/openapi.json", openapi, methods=["GET"])],
        exception_handlers=exception_handlers(),
    )


# --- the OpenAPI description --------------------------------------------------------------

_TASK = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0},
        "host": {"type": "string"},
    },
    "required": ["id", "host"],
    "additionalProperties": False,
}
_HOST_COUNTS = {
    "type": "object",
    "description": "Tasks per host, hosts in allocation order (LSB_MCPU_HOSTS).",
    "additionalProperties": {"type": "integer", "minimum": 1},
}
_TASKS = {"type": "array", "items": {"$ref": "#/components/schemas/ResizeTask"}}
_STATUS_PROPERTIES: dict[str, Any] = {
    "job_id": {"type": "string"},
    "phase": {
        "type": "string",
        "enum": [
            "IDLE",
            "GROW_PENDING",
            "GROW_NOTIFYING",
            "GROW_STARTING",
            "SHRINK_NOTIFYING",
            "SHRINK_STOPPING",
            "ENDED",
        ],
    },
    "tasks": {**_TASKS, "description": "The committed allocation; task 0 is the head task."},
    "hosts": _HOST_COUNTS,
    "min_tasks": {"type": "integer"},
    "max_tasks": {"type": "integer"},
    "version": {"type": "integer", "minimum": 0, "description": "The allocation version."},
    "pending": {
        "description": "The pending grow, if any.",
        "oneOf": [
            {"type": "null"},
            {
                "type": "object",
                "properties": {
                    "min": {"type": "integer", "minimum": 1},
                    "max": {"type": "integer", "minimum": 1},
                    "failures": {"type": "integer", "minimum": 0},
                    "requested_at": {"type": "number"},
                },
                "required": ["min", "max", "failures", "requested_at"],
                "additionalProperties": False,
            },
        ],
    },
    "in_flight": {
        "description": "The change in flight, if any: tasks added (grow) or released (shrink).",
        "oneOf": [
            {"type": "null"},
            {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "enum": ["grow", "shrink"]},
                    "tasks": _TASKS,
                },
                "required": ["kind", "tasks"],
                "additionalProperties": False,
            },
        ],
    },
}
_OPTIONS = {
    "cancel_pending": {
        "type": "boolean",
        "default": False,
        "description": "Cancel the pending grow first (bresize -c).",
    },
    "notify_cmd": {
        "type": ["string", "null"],
        "maxLength": 4095,
        "description": "Notification command for this change (bresize -rnc); "
        "less than 4096 bytes in UTF-8.",
    },
    "no_notify": {
        "type": "boolean",
        "default": False,
        "description": "Run no notification command (bresize -rncn).",
    },
}


def _release_form(name: str) -> dict[str, Any]:
    schema = _RELEASE_FORMS[name]
    return {"required": [name], "properties": {name: {"type": schema["type"][0]}}}


_RELEASE_FORMS: dict[str, dict[str, Any]] = {
    "spec": {
        "type": ["string", "null"],
        "description": "LSF release specification: `all`, `all ~hostA ~2*hostB`, "
        "`hostA`, `2*hostB`.",
    },
    "hosts": {
        "type": ["object", "null"],
        "additionalProperties": {"type": ["integer", "null"], "minimum": 1},
        "description": "Host -> tasks to release there (null: all of the job's tasks there).",
    },
    "task_ids": {
        "type": ["array", "null"],
        "items": {"type": "integer", "minimum": 0},
        "description": "Task ids to release.",
    },
    "count": {
        "type": ["integer", "null"],
        "minimum": 1,
        "description": "How many tasks to release (chosen by the site's policy).",
    },
}

SCHEMAS: dict[str, Any] = {
    "ResizeTask": _TASK,
    "ResizeStatus": {
        "type": "object",
        "properties": _STATUS_PROPERTIES,
        "required": sorted(_STATUS_PROPERTIES),
        "additionalProperties": False,
    },
    "ResizeWaitResult": {
        "type": "object",
        "properties": {
            **_STATUS_PROPERTIES,
            "done": {
                "type": "boolean",
                "description": "Nothing pending or in flight, and a newer version.",
            },
            "job_state": {"type": "string", "enum": [s.value for s in JobState]},
        },
        "required": [*sorted(_STATUS_PROPERTIES), "done", "job_state"],
        "additionalProperties": False,
    },
    "ResizeHistory": {
        "type": "object",
        "properties": {
            "job_id": {"type": "string"},
            "segments": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "start": {"type": "number"},
                        "end": {"type": "number"},
                        "slots": {"type": "integer", "minimum": 1},
                    },
                    "required": ["start", "end", "slots"],
                    "additionalProperties": False,
                },
            },
            "slot_seconds": {"type": "number", "minimum": 0},
            "records": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "time": {"type": "number"},
                        "type": {"type": "string", "enum": ["grow", "shrink"]},
                        "before": _HOST_COUNTS,
                        "delta": _HOST_COUNTS,
                        "after": _HOST_COUNTS,
                        "delta_tasks": {"type": "array", "items": {"type": "integer"}},
                        "version": {"type": "integer", "minimum": 1},
                    },
                    "required": [
                        "time",
                        "type",
                        "before",
                        "delta",
                        "after",
                        "delta_tasks",
                        "version",
                    ],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["job_id", "segments", "slot_seconds", "records"],
        "additionalProperties": False,
    },
    "ResizeGrowRequest": {
        "type": "object",
        "description": "`bresize request [min_tasks,]tasks`: ask for min_tasks..tasks more.",
        "properties": {
            "tasks": {"type": "integer", "minimum": 1, "description": "Most tasks to add."},
            "min_tasks": {
                "type": "integer",
                "minimum": 1,
                "description": "Fewest tasks worth adding (default: tasks).",
            },
            **_OPTIONS,
        },
        "required": ["tasks"],
        "additionalProperties": False,
    },
    "ResizeReleaseRequest": {
        "type": "object",
        "description": "`bresize release`: exactly one of spec, hosts, task_ids, count.",
        "properties": {**_RELEASE_FORMS, **_OPTIONS},
        "oneOf": [_release_form(name) for name in _RELEASE_FORMS],
        "additionalProperties": False,
    },
    "Problem": {
        "type": "object",
        "description": "RFC 9457 problem details with LSF's code name and number.",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string", "description": "LSF's message for the code."},
            "status": {"type": "integer"},
            "detail": {"type": "string", "description": "The message and the explanation."},
            "code": {"type": "string", "description": "LSBE_* where LSF has one."},
            "lsf_number": {"type": ["integer", "null"]},
        },
        "required": ["type", "title", "status", "detail", "code", "lsf_number"],
    },
}


def _schema_fields(name: str) -> tuple[str, ...]:
    return tuple(SCHEMAS[name]["properties"])


_REASONS = {
    200: "OK",
    202: "Accepted: durable; the change proceeds",
    400: "Malformed request (names the field) or an LSF condition",
    401: "No or unknown bearer token",
    403: "User permission denied",
    404: "No matching job found",
    409: "Conflicts with the job's state (pending request, change in progress, ...)",
    413: "Request body too large",
    415: "Request body is not JSON",
    503: "The resize plugin is not available",
}


def _operation_doc(op: Operation) -> dict[str, Any]:
    errors = _CHANGE_ERRORS if op.body is not None or op.method != "GET" else _QUERY_ERRORS
    responses: dict[str, Any] = {
        str(op.status): {
            "description": _REASONS[op.status],
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{op.response}"}}
            },
        }
    }
    for status in errors:
        responses[str(status)] = {
            "description": _REASONS[status],
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    responses["default"] = {
        "description": "Unexpected error",
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }
    parameters: list[dict[str, Any]] = [
        {
            "name": "id",
            "in": "path",
            "required": True,
            "description": "The job id.",
            "schema": {"type": "string", "minLength": 1, "maxLength": MAX_JOB_ID},
        }
    ]
    for param in op.query:
        parameters.append(
            {
                "name": param.name,
                "in": "query",
                "required": param.required,
                "description": param.description,
                "schema": dict(param.schema),
            }
        )
    doc: dict[str, Any] = {
        "operationId": op.name,
        "summary": op.summary,
        "description": op.description,
        "tags": ["resize"],
        "security": [{BEARER: []}],
        "parameters": parameters,
        "responses": responses,
    }
    if op.body is not None:
        doc["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{op.body}"}}
            },
        }
    return doc


def openapi_paths() -> dict[str, Any]:
    """The OpenAPI 3.1 fragment of the resize routes: ``paths`` and ``components``
    (schemas and the bearer security scheme), for a host to merge into its document."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation_doc(op)
    return {
        "paths": paths,
        "components": {
            "schemas": json.loads(json.dumps(SCHEMAS)),  # a copy the host may change
            "securitySchemes": {BEARER: {"type": "http", "scheme": "bearer"}},
        },
    }


def openapi_document(
    title: str,
    version: str,
    extra_paths: Mapping[str, Any] | None = None,
    extra_schemas: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A whole OpenAPI 3.1 document: the resize routes plus the host's ``extra_paths``
    (and the schemas they refer to), for a host with no document of its own."""
    fragment = openapi_paths()
    paths = dict(fragment["paths"])
    for path, item in (extra_paths or {}).items():
        paths[path] = {**paths.get(path, {}), **item}
    components = fragment["components"]
    components["schemas"].update(extra_schemas or {})
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": components,
        "security": [{BEARER: []}],
    }


__all__ = [
    "MAX_BODY",
    "MAX_WAIT",
    "OPERATIONS",
    "SCHEMAS",
    "BodyTooLarge",
    "Operation",
    "UnsupportedMediaType",
    "app",
    "error_json",
    "exception_handlers",
    "history_json",
    "openapi_document",
    "openapi_paths",
    "problem_json",
    "record_json",
    "routes",
    "status_json",
]
