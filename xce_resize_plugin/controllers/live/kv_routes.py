"""The routes of a job's key-value store (:mod:`.job_kv`): ``PUT``, ``GET`` and
``DELETE /v1/jobs/{id}/kv/{key}``, for the job's own token, its owner or an
administrator.

``GET ...?wait=S`` waits up to S seconds for a key that is not set yet — task 0
publishes its scheduler's address, the other tasks wait for it — by polling the
controller from the event loop (no thread is held while waiting), as the resize wait
route does. A key not set in a job that has ended never will be: the read ends then,
409 ``LSBE_JOB_FINISH`` (``kv_get``), as the ``wait`` and ``events`` long polls end
at the job's end rather than at their timeout.

A user has at most :data:`~.job_kv.MAX_WRITES_IN_PROGRESS` writes (``PUT`` and
``DELETE``) in progress at once, counted from the start of the handler (its body
read included) to the answer; beyond, 429 ``XCE_TOO_MANY_REQUESTS`` with
``Retry-After``, as the request limit answers (:class:`~.job_kv.WriteSlots`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from xce_resize_plugin.controllers.live import job_kv
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest.http import (
    ApiRoute,
    BodyLimit,
    Translate,
    check_serving,
    endpoint,
    read_json_body,
    reply,
)
from xce_resize_plugin.rest.operation import Operation, Param
from xce_resize_plugin.rest.parsing import parse_json
from xce_resize_plugin.rest.resize_operations import check_job_id

_PARAMS = (
    Param("id", {"type": "string"}, True, "The job id.", location="path"),
    Param("key", {"type": "string"}, True, "The key (1-128 of A-Z a-z 0-9 . _ -).", "path"),
)
KV_PUT = Operation(
    "kv_put",
    "PUT",
    "/v1/jobs/{id}/kv/{key}",
    "Set a value in the job's key-value store",
    'Body {"value": "..."}; at most 64 KiB per value and 64 keys per job, and the '
    "values of all the owner's jobs at most [limits] kv_bytes_per_user bytes as stored "
    "(JSON-escaped; replacing a value counts the difference); over a limit 413 "
    "XCE_KV_LIMIT. 409 LSBE_NOT_STARTED for a job that has not started (PEND), 409 "
    "LSBE_JOB_FINISH for one that has ended. At most 4 key-value writes of one user in "
    "progress at once: beyond, 429 XCE_TOO_MANY_REQUESTS with Retry-After. Kept across "
    "a failover; removed when the job ends or is requeued.",
    response="KeyValue",
    body="KeyValueBody",
    params=_PARAMS,
    errors=(400, 401, 404, 409, 413, 503),
)
KV_GET = Operation(
    "kv_get",
    "GET",
    "/v1/jobs/{id}/kv/{key}",
    "Read a value from the job's key-value store",
    "With wait=S, waits up to S seconds (at most 60) for a key not set yet; 404 "
    "XCE_KV_NO_KEY when it is still not set (a pending job's keys are never set: it "
    "waits as for a running job's); 409 LSBE_JOB_FINISH at once when it is not set "
    "and the job has ended.",
    response="KeyValue",
    params=(*_PARAMS, Param("wait", {"type": "number", "minimum": 0}, False, "Seconds.")),
    errors=(400, 401, 404, 409, 503),
)
KV_DELETE = Operation(
    "kv_delete",
    "DELETE",
    "/v1/jobs/{id}/kv/{key}",
    "Remove a key from the job's key-value store",
    "Answers the record removed. 404 XCE_KV_NO_KEY when the key is not set (nothing "
    "changes); 409 LSBE_NOT_STARTED for a job that has not started. The key no longer "
    "counts among the job's 64 nor its bytes among the owner's, and set again it "
    "starts at version 1. Counts among the owner's 4 key-value writes in progress "
    "(429 XCE_TOO_MANY_REQUESTS beyond).",
    response="KeyValue",
    params=_PARAMS,
    errors=(400, 401, 404, 409, 503),
)
KV_SCHEMAS: dict[str, Any] = {
    "KeyValueBody": {
        "type": "object",
        "additionalProperties": False,
        "required": ["value"],
        "properties": {"value": {"type": "string"}},
    },
    "KeyValue": {
        "type": "object",
        "required": ["key", "value", "version"],
        "properties": {
            "key": {"type": "string"},
            "value": {"type": "string"},
            "version": {"type": "integer", "description": "how many times the key was set"},
        },
    },
}
# A 64 KiB value, JSON-escaped, with room to spare; beyond, 413 before parsing.
_LIMIT = BodyLimit(
    8 * job_kv.MAX_VALUE,
    lambda declared: job_kv.KeyValueLimit(f"body larger than {8 * job_kv.MAX_VALUE} bytes"),
)
_POLL_FIRST, _POLL_MAX = 0.02, 0.25


def kv_routes(ctl: LiveController, translate: Translate) -> list[ApiRoute]:
    """The three routes, with the host routes' error translation."""
    writes = job_kv.WriteSlots()

    async def put(request: Request, principal: Principal) -> Response:
        with writes.take(principal.name):
            body = parse_json(await read_json_body(request, _LIMIT))
            job_id, key = check_job_id(request.path_params["id"]), request.path_params["key"]
            return reply(await run_in_threadpool(ctl.kv_put, principal, job_id, key, body), 200)

    async def get(request: Request, principal: Principal) -> Response:
        # The query string was checked by endpoint() (known parameters, each once).
        wait = job_kv.parse_wait(request.query_params.get("wait"))
        job_id, key = check_job_id(request.path_params["id"]), request.path_params["key"]
        loop = asyncio.get_running_loop()
        deadline, delay = loop.time() + wait, _POLL_FIRST
        while True:
            check_serving(request)
            found = await run_in_threadpool(ctl.kv_get, principal, job_id, key)
            left = deadline - loop.time()
            if found is not None:
                return reply(found, 200)
            if left <= 0 or await request.is_disconnected():
                raise job_kv.NoSuchKey(f"job {job_id} has no key {key!r}")
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    async def delete(request: Request, principal: Principal) -> Response:
        with writes.take(principal.name):
            job_id, key = check_job_id(request.path_params["id"]), request.path_params["key"]
            return reply(await run_in_threadpool(ctl.kv_delete, principal, job_id, key), 200)

    return [
        ApiRoute(op, endpoint(op, fn, ctl.authenticate, translate), KV_SCHEMAS)
        for op, fn in ((KV_PUT, put), (KV_GET, get), (KV_DELETE, delete))
    ]


__all__ = ["KV_DELETE", "KV_GET", "KV_PUT", "KV_SCHEMAS", "kv_routes"]
