"""What each resize route does once its caller is authenticated (Starlette).

In order: check the path's job id and the query string (unknown parameters are
refused); for a change, read at most :data:`.resize_operations.MAX_BODY` bytes of JSON
and decode it with the strict API converter (:mod:`xce_resize_plugin.core.converters`),
so a rejected body names the field (``… @ $.tasks``); then call the host hooks — first
the ``xce_resize_authorize`` policy with action ``view`` (a job the caller may not see
is answered 404 "No matching job found", exactly as a job that does not exist, so that
no answer tells which job ids exist), then ``xce_resize_request`` for a change, which
authorises the action (403 for a job the caller sees but may not change) and returns
only once the change's facts are durable, or ``xce_resize_status`` or
``xce_acct_usage`` for a query (for the history of a finished job the host has
dropped, ``xce_acct_job`` first gives the job the ``view`` policy decides on) — in a
worker thread, because the journal's fsync blocks.

Why only the hooks and never the runtime: the routes then work for any host and any
plugin that implements the request hooks, and the embedded controller serves them
exactly as XCE would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from attrs import frozen
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from xce_resize_plugin.core import converters
from xce_resize_plugin.core.accounting import Usage
from xce_resize_plugin.core.events import JobEvent
from xce_resize_plugin.core.models import (
    CancelRequest,
    DrainedRequest,
    JobInfo,
    JobState,
    ReadyRequest,
    ResizeRequest,
    TargetRequest,
)
from xce_resize_plugin.core.status import ResizeStatus
from xce_resize_plugin.errors import InvalidRequest, NoJob, NoResizeHook
from xce_resize_plugin.host import Controller, HostHooks, Principal
from xce_resize_plugin.policy import HookPolicy
from xce_resize_plugin.rest.http import (
    ApiRoute,
    BodyLimit,
    Handler,
    check_serving,
    endpoint,
    read_json_body,
    reply,
)
from xce_resize_plugin.rest.parsing import check_fields, parse_json
from xce_resize_plugin.rest.resize_operations import (
    BY_NAME,
    MAX_BODY,
    OPERATIONS,
    body_too_large,
    check_job_id,
    parse_cursor,
    parse_task_id,
    parse_timeout,
    parse_version,
)
from xce_resize_plugin.rest.schemas import SCHEMAS, schema_fields

# Polling of the wait route (seconds): fast at first, since a change that completes
# within one host cycle is the common case, then gentler on the controller.
_POLL_FIRST, _POLL_MAX = 0.02, 0.25
_LIMIT = BodyLimit(MAX_BODY, body_too_large)


@frozen
class Hooks:
    """The host hooks the routes call, each from a worker thread."""

    controller: Controller

    def view(self, principal: Principal, job_id: str, *, dropped: bool = False) -> JobInfo:
        """The job, if ``principal`` may see it; :class:`NoJob` alike when it does not
        exist and when the ``view`` policy hides it, so that the answer never tells
        which job ids exist (docs/rest-api.md, "Authentication and who may do what").

        ``dropped``: a finished job the host no longer knows is looked up in the
        plugin's records (``xce_acct_job``), for the routes that read its journal,
        which keeps its final state and history also through compaction
        (docs/live-controller.md, "Finished jobs")."""
        job = self.controller.get_job(job_id)
        if job is None and dropped:
            job = HostHooks(self.controller.plugin_manager).acct_job(self.controller, job_id)
        if job is None or not HookPolicy(self.controller.plugin_manager).authorize(
            principal, job, "view"
        ):
            raise NoJob(f"job {job_id}")
        return job

    def status(self, job_id: str) -> ResizeStatus:
        status = HostHooks(self.controller.plugin_manager).resize_status(self.controller, job_id)
        if status is None:
            if self.controller.get_job(job_id) is None:
                raise NoJob(f"job {job_id}")
            raise NoResizeHook("no plugin answered xce_resize_status")
        return status

    def viewed_status(self, principal: Principal, job_id: str) -> ResizeStatus:
        self.view(principal, job_id)
        return self.status(job_id)

    def viewed_history(self, principal: Principal, job_id: str) -> Usage:
        self.view(principal, job_id, dropped=True)
        ctl = self.controller
        usage = HostHooks(ctl.plugin_manager).acct_usage(ctl, job_id, ctl.now())
        if usage is None:
            raise NoResizeHook("no plugin answered xce_acct_usage")
        return usage

    def change(self, principal: Principal, job_id: str, request: ResizeRequest) -> ResizeStatus:
        # A job the caller may not see is answered as one that does not exist; one it
        # sees but may not change is refused by the action's own check (403).
        self.view(principal, job_id)
        ctl = self.controller
        status = HostHooks(ctl.plugin_manager).resize_request(ctl, principal, job_id, request)
        if status is None:
            raise NoResizeHook("no plugin answered xce_resize_request")
        return status

    def events(self, job_id: str, after: int) -> tuple[list[JobEvent], JobState]:
        """The job's events after ``after``, and its state."""
        ctl = self.controller
        job = ctl.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        found = HostHooks(ctl.plugin_manager).resize_events(ctl, job_id, after)
        if found is None:
            raise NoResizeHook("no plugin answered xce_resize_events")
        return list(found), job.state

    def poll(self, job_id: str) -> tuple[ResizeStatus, JobState]:
        job = self.controller.get_job(job_id)
        if job is None:
            raise NoJob(f"job {job_id}")
        return self.status(job_id), job.state


async def _body(request: Request) -> bytes:
    return await read_json_body(request, _LIMIT)


async def _json_body(request: Request, what: str) -> Any:
    raw = await _body(request)
    if not raw:
        raise InvalidRequest(f"{what}: a JSON object body is required")
    return parse_json(raw)


def _drained_from_json(data: Any) -> DrainedRequest:
    """The drained body: ``{"task_ids": [ints]}`` (fields checked against its schema)."""
    ids = data.get("task_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not ids or any(type(i) is not int or i < 0 for i in ids):
        raise InvalidRequest(
            f"drained: task_ids must be a non-empty list of task ids, got {ids!r} @ $.task_ids"
        )
    return DrainedRequest(tuple(ids))


def _job_id(request: Request) -> str:
    """The path's job id, checked (the query string was, by :func:`~.http.endpoint`)."""
    return check_job_id(request.path_params["id"])


@frozen
class Handlers:
    """One handler per resize operation."""

    hooks: Hooks

    async def status(self, request: Request, principal: Principal) -> Response:
        job_id = _job_id(request)
        status = await run_in_threadpool(self.hooks.viewed_status, principal, job_id)
        return reply(converters.status_json(status), 200)

    async def history(self, request: Request, principal: Principal) -> Response:
        job_id = _job_id(request)
        usage = await run_in_threadpool(self.hooks.viewed_history, principal, job_id)
        return reply(converters.history_json(usage), 200)

    async def grow(self, request: Request, principal: Principal) -> Response:
        return await self._change(request, principal, "resize_grow", converters.grow_from_json)

    async def modify(self, request: Request, principal: Principal) -> Response:
        return await self._change(request, principal, "job_modify", converters.modify_from_json)

    async def release(self, request: Request, principal: Principal) -> Response:
        return await self._change(
            request, principal, "resize_release", converters.release_from_json
        )

    async def _change(
        self,
        request: Request,
        principal: Principal,
        name: str,
        decode: Callable[[Any], ResizeRequest],
    ) -> Response:
        """A change with a JSON body: operation ``name``, its body made by ``decode``."""
        op = BY_NAME[name]
        job_id = _job_id(request)
        what = name.removeprefix("resize_").removeprefix("job_").removesuffix("_set")
        data = await _json_body(request, what)
        check_fields(data, schema_fields(str(op.body)), what)
        change = decode(data)
        status = await run_in_threadpool(self.hooks.change, principal, job_id, change)
        return reply(converters.status_json(status), op.status)

    async def drained(self, request: Request, principal: Principal) -> Response:
        return await self._change(request, principal, "resize_drained", _drained_from_json)

    async def events(self, request: Request, principal: Principal) -> Response:
        """The job's events after the cursor, long-polled like ``wait``."""
        job_id = _job_id(request)
        query = request.query_params
        after = parse_cursor(query.get("after"))
        timeout = parse_timeout(query.get("timeout"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await run_in_threadpool(self.hooks.view, principal, job_id)
        delay = _POLL_FIRST
        while True:
            check_serving(request)
            found, job_state = await run_in_threadpool(self.hooks.events, job_id, after)
            left = deadline - loop.time()
            ended = job_state in (JobState.DONE, JobState.EXIT)
            if found or ended or left <= 0 or await request.is_disconnected():
                break
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)
        return reply([event.to_json() for event in found], 200)

    async def cancel(self, request: Request, principal: Principal) -> Response:
        job_id = _job_id(request)
        if await _body(request):
            raise InvalidRequest("cancel takes no body")
        status = await run_in_threadpool(self.hooks.change, principal, job_id, CancelRequest())
        return reply(converters.status_json(status), 200)

    async def ready(self, request: Request, principal: Principal) -> Response:
        """A task says it is ready (docs/in-job-api.md, "Readiness and exits")."""
        job_id = _job_id(request)
        task_id = parse_task_id(request.path_params["task_id"])
        if await _body(request):
            raise InvalidRequest("ready takes no body")
        ready = ReadyRequest(task_id)
        status = await run_in_threadpool(self.hooks.change, principal, job_id, ready)
        answer = {
            "job_id": job_id,
            "task_id": task_id,
            "ready": True,
            "phase": status.phase.value,
            "version": status.version,
        }
        return reply(answer, 200)

    async def set_target(self, request: Request, principal: Principal) -> Response:
        return await self._change(
            request, principal, "resize_target_set", converters.target_from_json
        )

    async def clear_target(self, request: Request, principal: Principal) -> Response:
        job_id = _job_id(request)
        if await _body(request):
            raise InvalidRequest("clearing a target takes no body")
        change = TargetRequest(None)
        status = await run_in_threadpool(self.hooks.change, principal, job_id, change)
        return reply(converters.status_json(status), 200)

    async def wait(self, request: Request, principal: Principal) -> Response:
        job_id = _job_id(request)
        query = request.query_params  # checked by endpoint(): known, once, version given
        version = parse_version(query["version"])
        timeout = parse_timeout(query.get("timeout"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await run_in_threadpool(self.hooks.view, principal, job_id)
        delay = _POLL_FIRST
        saw_change = False
        while True:
            check_serving(request)
            status, job_state = await run_in_threadpool(self.hooks.poll, job_id)
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
        result = converters.status_json(status)
        # gave_up: the answer came early because a change seen during this wait ended
        # without a new version, which a client cannot tell from a poll that ran out.
        gave_up = idle and saw_change and not done
        result.update(done=done, job_state=job_state.value, gave_up=gave_up)
        return reply(result, 200)


def resize_routes(controller: Controller) -> list[ApiRoute]:
    """The resize routes for ``controller``, one per operation."""
    handlers = Handlers(Hooks(controller))
    by_operation: dict[str, Handler] = {
        "resize_status": handlers.status,
        "resize_grow": handlers.grow,
        "resize_release": handlers.release,
        "resize_cancel": handlers.cancel,
        "resize_history": handlers.history,
        "resize_wait": handlers.wait,
        "job_modify": handlers.modify,
        "task_ready": handlers.ready,
        "resize_drained": handlers.drained,
        "job_events": handlers.events,
        "resize_target_set": handlers.set_target,
        "resize_target_clear": handlers.clear_target,
    }
    return [
        ApiRoute(op, endpoint(op, by_operation[op.name], controller.authenticate), SCHEMAS)
        for op in OPERATIONS
    ]


__all__ = ["Handlers", "Hooks", "resize_routes"]
