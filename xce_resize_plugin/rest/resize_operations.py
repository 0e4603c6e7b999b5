"""The resize API's operations: the one table its routes and its OpenAPI description
are built from, its limits, and the checks of its path and query parameters."""

from __future__ import annotations

import math
import re

from xce_resize_plugin.core.decimal_text import is_decimal_number, read_decimal
from xce_resize_plugin.core.models import MAX_JOB_ID
from xce_resize_plugin.errors import (
    BadJobId,
    BodyTooLarge,
    InvalidRequest,
    ResizeError,
    UnknownEventCursor,
)
from xce_resize_plugin.rest.operation import Operation, Param

#: Largest request body accepted (bytes). A resize body is a few hundred bytes; a
#: notification command is under 4096 bytes.
MAX_BODY = 64 * 1024
#: Longest a ``wait`` holds the connection (seconds); longer timeouts are capped.
MAX_WAIT = 60.0
DEFAULT_WAIT = 30.0
#: Largest ``version`` a ``wait`` accepts (a signed 64-bit integer, as hosts store it).
MAX_VERSION = 2**63 - 1

_CURSOR_RE = re.compile(r"\A-?[0-9]{1,19}\Z")


def body_too_large(declared: int | None) -> ResizeError:
    """The refusal of a body over :data:`MAX_BODY` (413)."""
    if declared is None:
        return BodyTooLarge(f"more than {MAX_BODY} bytes")
    return BodyTooLarge(f"{declared} bytes, at most {MAX_BODY}")


def check_job_id(job_id: str) -> str:
    """Refuse an empty or overlong job id, or one that is not text (a lone surrogate,
    which an ASGI server other than uvicorn may pass on), before any lookup."""
    if not job_id or len(job_id) > MAX_JOB_ID:
        raise BadJobId(f"job id must be 1 to {MAX_JOB_ID} characters, got {len(job_id)}")
    if not job_id.isprintable():  # control characters, and surrogates (category Cs)
        raise BadJobId(f"job id must be printable text, got {job_id!r}")
    return job_id


def parse_version(text: str) -> int:
    """``version``: a decimal integer in 0..MAX_VERSION."""
    version = read_decimal(text)
    if version is None or version > MAX_VERSION:
        raise InvalidRequest(f"version must be an integer from 0 to {MAX_VERSION}, got {text!r}")
    return version


def parse_cursor(text: str | None) -> int:
    """``after``: an event cursor, an integer (default 0: every event). A negative one
    is answered as a cursor the job's events do not reach."""
    if text is None:
        return 0
    if not _CURSOR_RE.match(text):
        raise InvalidRequest(f"after must be an integer event cursor, got {text!r}")
    value = int(text)
    if value < 0:
        raise UnknownEventCursor(f"after={value}; cursors start at 0")
    return value


def parse_timeout(text: str | None) -> float:
    """``timeout``: a non-negative number of seconds, capped at :data:`MAX_WAIT`."""
    if text is None:
        return DEFAULT_WAIT
    # A number too large for a float ("1e999") is still a number: it is capped below.
    value = float(text) if len(text) <= 64 and is_decimal_number(text) else math.nan
    if not value >= 0:  # also refuses NaN
        raise InvalidRequest(f"timeout must be a number of seconds >= 0, got {text!r}")
    return min(value, MAX_WAIT)


JOB_PATH = "/v1/jobs/{id}/resize"

# The problem statuses each kind of operation can answer (documented per operation).
# A query never answers 403: a job the caller may not view is answered 404, as one
# that does not exist; a change answers 403 for a job the caller sees but may not
# change (a site policy, or grows turned off).
_QUERY_ERRORS = (400, 401, 404, 503)
_CHANGE_ERRORS = (400, 401, 403, 404, 408, 409, 413, 415, 503)
_JOB_ID = Param(
    "id",
    {"type": "string", "minLength": 1, "maxLength": MAX_JOB_ID},
    True,
    "The job id.",
    location="path",
)
_WAIT_QUERY = (
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
)


def _job_operation(
    name: str,
    method: str,
    suffix: str,
    summary: str,
    description: str,
    *,
    errors: tuple[int, ...],
    status: int = 200,
    response: str = "ResizeStatus",
    body: str | None = None,
    query: tuple[Param, ...] = (),
) -> Operation:
    """An operation of the resize API: on the job's resize path (:data:`JOB_PATH` then
    ``suffix``), taking the job id, tagged ``resize``."""
    return Operation(
        name,
        method,
        JOB_PATH + suffix,
        summary,
        description,
        status=status,
        response=response,
        body=body,
        params=(_JOB_ID, *query),
        errors=errors,
        tags=("resize",),
    )


# The autoresize flag is the plugin's (its journal holds it), so the plugin serves its
# change, on the job's own path as bmod changes a job: a host mounting these routes
# gets `xce-resize modify` with them. A host whose API already has a PATCH of the job
# passes the `autoresize` key on through xce_resize_request (docs/rest-api.md).
_MODIFY = Operation(
    "job_modify",
    "PATCH",
    "/v1/jobs/{id}",
    "Turn the job's autoresize on or off (xce-resize modify, bmod -ar/-arn)",
    'Body `{"autoresize": true|false}`. On: the job must be running, resizable and '
    "have a task range; a grow someone asked for must not be pending. Off: the "
    "autoresize demand is withdrawn. Asking for what already holds changes nothing. "
    "Answered once durable, with the job's resize state.",
    body="JobModify",
    response="ResizeStatus",
    params=(_JOB_ID,),
    errors=_CHANGE_ERRORS,
    tags=("resize",),
)

# A task's readiness (docs/in-job-api.md, "Readiness and exits"): on the task's own
# path, since it is the task that speaks; through xce_resize_request like a change.
#: Largest task id a path accepts (a signed 64-bit integer, as hosts store it).
MAX_TASK_ID = 2**63 - 1
_READY = Operation(
    "task_ready",
    "POST",
    "/v1/jobs/{id}/tasks/{task_id}/ready",
    "A task of the job is ready for work (ResizeClient.ready())",
    "Takes no body. Records that the task is ready (once: saying it again changes "
    "nothing); a grow asked with `wait_ready` is committed when its last new task is "
    "ready. Refused when the task is not one the job holds or the job is not running. "
    "Answered once durable.",
    response="TaskReady",
    params=(
        _JOB_ID,
        Param(
            "task_id",
            {"type": "integer", "minimum": 0, "maximum": MAX_TASK_ID},
            True,
            "The task's id (its XCE_TASK_ID).",
            location="path",
        ),
    ),
    errors=_CHANGE_ERRORS,
    tags=("resize",),
)


def parse_task_id(text: str) -> int:
    """``task_id``: a decimal integer in 0..MAX_TASK_ID."""
    task_id = read_decimal(text)
    if task_id is None or task_id > MAX_TASK_ID:
        raise InvalidRequest(f"task id must be an integer from 0 to {MAX_TASK_ID}, got {text!r}")
    return task_id


# Drain before stop and job events (docs/in-job-api.md): the job's token reaches them
# for its own job only, as every resize route.
_DRAINED = _job_operation(
    "resize_drained",
    "POST",
    "/drained",
    "Say tasks of the release being drained may stop now (ResizeClient.drained)",
    'Body `{"task_ids": [...]}`: tasks of the release in its drain time (phase '
    "SHRINK_DRAINING). Once every task of the release is acknowledged the stop begins "
    "at once, without waiting for the deadline. A task id no release is draining is "
    "refused (409 XCE_RESIZE_NOT_DRAINING) and nothing changes. Answered once durable.",
    body="ResizeDrained",
    errors=_CHANGE_ERRORS,
)
_EVENTS = Operation(
    "job_events",
    "GET",
    "/v1/jobs/{id}/events",
    "The job's events (long poll, for the in-job API)",
    "Answers the job's events with `seq` greater than `after` (oldest first) as soon as "
    "there is one, or an empty list after `timeout` seconds (capped at 60) or once the "
    "job ended; at most 1,000 events an answer (a caller further behind asks again from "
    "the last `seq` it got). The sequence numbers are the same after a controller "
    "restart. An `after` below 0 or beyond the last event is refused (400 "
    "XCE_RESIZE_EVENT_CURSOR).",
    response="JobEvents",
    params=(
        _JOB_ID,
        Param(
            "after",
            {"type": "integer", "minimum": 0, "default": 0},
            False,
            "The `seq` of the last event the caller has (0: from the first).",
        ),
        _WAIT_QUERY[1],
    ),
    errors=_QUERY_ERRORS,
    tags=("resize",),
)

OPERATIONS: tuple[Operation, ...] = (
    _job_operation(
        "resize_status",
        "GET",
        "",
        "The job's resize state",
        "The committed allocation, the bounds, the pending grow and the change in flight.",
        errors=_QUERY_ERRORS,
    ),
    _job_operation(
        "resize_grow",
        "POST",
        "/grow",
        "Ask for more tasks (bresize request)",
        "The request pends until the scheduler can place at least `min_tasks` more "
        "tasks. Answered once the request is durable, with the job's resize state.",
        status=202,
        body="ResizeGrowRequest",
        errors=_CHANGE_ERRORS,
    ),
    _job_operation(
        "resize_release",
        "POST",
        "/release",
        "Give tasks back (bresize release)",
        "Exactly one of `spec`, `hosts`, `task_ids`, `count`. Answered once the release "
        "is durable; the tasks are stopped afterwards (see the `wait` operation).",
        status=202,
        body="ResizeReleaseRequest",
        errors=_CHANGE_ERRORS,
    ),
    _job_operation(
        "resize_cancel",
        "DELETE",
        "/pending",
        "Cancel the pending grow (bresize cancel)",
        "Takes no body. Answered once the cancellation is durable.",
        errors=_CHANGE_ERRORS,
    ),
    _job_operation(
        "resize_history",
        "GET",
        "/history",
        "The job's allocation timeline and resize records",
        "Segments of charged slots up to now, their slot-seconds, and one record per "
        "committed change (LSF's JOB_RESIZE).",
        response="ResizeHistory",
        errors=_QUERY_ERRORS,
    ),
    _job_operation(
        "resize_wait",
        "GET",
        "/wait",
        "Wait for a resize to finish (long poll, for the in-job API)",
        "Answers as soon as nothing is pending or in flight and the allocation version "
        "is greater than `version` (`done` is true); or when a change that was pending "
        "or in flight during the wait ended without a new version (it failed or was "
        "cancelled); or when the job ends; or after `timeout` seconds (capped at 60). "
        "`done` is false in the last three cases.",
        response="ResizeWaitResult",
        query=_WAIT_QUERY,
        errors=_QUERY_ERRORS,
    ),
    _MODIFY,
    _READY,
    _DRAINED,
    _EVENTS,
    # A declarative size (docs/in-job-api.md, "A target size").
    _job_operation(
        "resize_target_set",
        "PUT",
        "/target",
        "Set the job's target size (xce-resize target, ResizeClient.set_target)",
        "The plugin converges on `tasks` by itself: below it one grow of the missing "
        "tasks pends (placed like any grow), above it the extra tasks are released "
        "(`release_prefer` first, then by the release policy; never task 0). Replaces "
        "the job's pending grow and turns autoresize off. Answered once durable, with "
        "the job's resize state (`target`).",
        body="ResizeTargetRequest",
        errors=_CHANGE_ERRORS,
    ),
    _job_operation(
        "resize_target_clear",
        "DELETE",
        "/target",
        "Clear the job's target size",
        "Takes no body. The grow the target kept pending is cancelled; a change in "
        "flight goes on; the job keeps its size. Clearing no target changes nothing.",
        errors=_CHANGE_ERRORS,
    ),
)
#: The operations by name.
BY_NAME = {op.name: op for op in OPERATIONS}


__all__ = [
    "BY_NAME",
    "DEFAULT_WAIT",
    "JOB_PATH",
    "MAX_BODY",
    "MAX_JOB_ID",
    "MAX_VERSION",
    "MAX_WAIT",
    "OPERATIONS",
    "body_too_large",
    "check_job_id",
    "parse_cursor",
    "parse_task_id",
    "parse_timeout",
    "parse_version",
]
