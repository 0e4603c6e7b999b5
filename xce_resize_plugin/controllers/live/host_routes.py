"""The live controller's own routes, built with the REST layer
(:mod:`xce_resize_plugin.rest.http`): every one but ``/v1/health`` behind
``Authorization: Bearer <token>`` (a user's token from ``[users] tokens``, or a job's
``XCE_JOB_TOKEN``), authenticated before any byte of a body is read.

- ``GET /v1/health``: liveness and epoch (no token; 503 when fenced, or while the
  state cannot be written);
- ``POST /v1/jobs`` (201): submit; ``GET /v1/jobs``: the caller's jobs (all for an
  administrator); ``GET /v1/jobs/{id}``: one job; ``DELETE /v1/jobs/{id}`` (202): kill;
- ``PUT``/``GET``/``DELETE /v1/jobs/{id}/kv/{key}``: the job's key-value store (:mod:`.kv_routes`);
- ``GET /v1/hosts``, ``POST /v1/hosts/{name}/close|open``: host states and an
  administrator's drain (:mod:`.host_admin`);
- ``GET /v1/cluster``: hosts, users, worker agents and the invariant check for an
  administrator; for anyone else what :func:`cluster_view` leaves (no other user's
  usage, no agent's pid or port).

A submission body is at most :data:`MAX_BODY` bytes. Errors are problem documents, as
the resize routes' are; an error that means the controller was fenced (a newer one took
over the state directory) also stops this one, and a write that failed (a full disk) is
answered 503 after the controller went back to what is on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import frozen
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from xce_resize_plugin.controllers.live.host_admin import (
    HOST_ADMIN_SCHEMAS,
    HOST_COMMAND,
    LIST_HOSTS,
)
from xce_resize_plugin.controllers.live.kv_routes import kv_routes
from xce_resize_plugin.controllers.live.live_controller import LiveController
from xce_resize_plugin.controllers.live.storage_faults import fenced_cause, storage_failure
from xce_resize_plugin.errors import InvalidRequest, ResizeError
from xce_resize_plugin.host import Principal
from xce_resize_plugin.rest.http import (
    ApiRoute,
    BodyLimit,
    Translate,
    endpoint,
    read_json_body,
    reply,
)
from xce_resize_plugin.rest.logcontext import note_job
from xce_resize_plugin.rest.operation import Operation, Param
from xce_resize_plugin.rest.parsing import parse_json
from xce_resize_plugin.rest.resize_operations import check_job_id

#: Largest submission body accepted (bytes).
MAX_BODY = 256 * 1024
_LIMIT = BodyLimit(MAX_BODY, lambda declared: InvalidRequest(f"body larger than {MAX_BODY} bytes"))
_ID = Param("id", {"type": "string"}, True, "The job id.", location="path")

HEALTH = Operation(
    "health",
    "GET",
    "/v1/health",
    "Liveness and the controller's epoch",
    response="Health",
    errors=(503,),
    public=True,
)
LIST_JOBS = Operation(
    "list_jobs",
    "GET",
    "/v1/jobs",
    "The caller's jobs (every job for an administrator)",
    response="JobList",
    errors=(401, 503),
)
SUBMIT_JOB = Operation(
    "submit_job",
    "POST",
    "/v1/jobs",
    "Submit a job (bsub)",
    status=201,
    response="SubmitResult",
    body="JobSubmission",
    errors=(400, 401, 403, 408, 503),
)
SHOW_JOB = Operation(
    "show_job",
    "GET",
    "/v1/jobs/{id}",
    "One job: allocation, tasks with pids, resize state, accounting",
    response="Job",
    params=(_ID,),
    errors=(401, 404, 503),
)
KILL_JOB = Operation(
    "kill_job",
    "DELETE",
    "/v1/jobs/{id}",
    "Kill a job (bkill): tasks stopped, then EXIT",
    status=202,
    response="Job",
    params=(_ID,),
    errors=(401, 404, 409, 503),
)
CLUSTER = Operation(
    "cluster",
    "GET",
    "/v1/cluster",
    "Hosts, users, worker agents and the invariant check",
    "An administrator sees everything. Anyone else sees each host's slots and use and "
    "whether its agent is ready, and their own usage only: no other user's usage, no "
    "agent's pid, port or instance, no invariant check.",
    response="Cluster",
    errors=(401, 503),
)

_TASK_REF = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "host": {"type": "string"}},
    "required": ["id", "host"],
}
HOST_SCHEMAS: dict[str, Any] = {
    "JobSubmission": {
        "type": "object",
        "additionalProperties": False,
        "required": ["command"],
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "minItems": 1,
                "description": 'argv of every task (no shell; use ["/bin/sh", "-c", ...])',
            },
            "tasks": {
                "oneOf": [
                    {"type": "integer", "minimum": 1},
                    {"type": "string", "pattern": "^[0-9]+,[0-9]+$"},
                ],
                "description": 'N, or "MIN,MAX" (bsub -n)',
            },
            "min_tasks": {"type": "integer", "minimum": 1},
            "max_tasks": {"type": "integer", "minimum": 1},
            "ptile": {"type": ["integer", "null"], "minimum": 1},
            "resizable": {"type": "boolean", "default": False},
            "autoresize": {
                "type": "boolean",
                "default": False,
                "description": "bsub -ar: grow toward the range's MAX whenever slots free "
                "up; implies resizable, needs tasks MIN,MAX with MIN < MAX",
            },
            "grow_hosts": {"enum": ["prefer-existing", "new-only", "any"]},
            "notify_cmd": {"type": ["string", "null"]},
            "env": {"type": "object", "additionalProperties": {"type": "string"}},
            "cwd": {
                "type": ["string", "null"],
                "description": "absolute; default: the log dir, or the owner's home",
            },
            "estimate": {"type": ["number", "null"], "minimum": 0},
            "alloc": {
                "type": ["object", "null"],
                "additionalProperties": {"type": "integer", "minimum": 1},
                "description": "start at once on exactly these hosts (host: tasks), in order",
            },
            "initial": {
                "type": ["integer", "null"],
                "minimum": 1,
                "description": "start with at most this many tasks even when more are free",
            },
            "release_exited": {
                "type": "boolean",
                "default": False,
                "description": "a task other than task 0 that exits on its own leaves the "
                "allocation (a shrink, reason task_exit); needs resizable",
            },
        },
    },
    "SubmitResult": {
        "type": "object",
        "required": ["id", "token", "job"],
        "properties": {
            "id": {"type": "string"},
            "token": {"type": "string", "description": "the job's XCE_JOB_TOKEN"},
            "job": {"$ref": "#/components/schemas/Job"},
        },
    },
    "JobTask": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "host": {"type": "string"},
            "state": {"enum": ["STARTING", "RUNNING", "STOPPING", "EXITED", "FAILED"]},
            "pid": {"type": ["integer", "null"]},
            "status": {"type": ["integer", "null"]},
            "reason": {"type": "string"},
        },
    },
    "Job": {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "user": {"type": "string"},
            "state": {"enum": ["PEND", "RUN", "DONE", "EXIT"]},
            "command": {"type": "array", "items": {"type": "string"}},
            "min_tasks": {"type": "integer"},
            "max_tasks": {"type": "integer"},
            "version": {"type": "integer"},
            "requeues": {
                "type": "integer",
                "minimum": 0,
                "description": "Times a host failure put the job back in the queue "
                "(a site policy; at most [resize] max_requeue).",
            },
            "hosts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "allocation": {"type": "array", "items": _TASK_REF},
            "held": {"type": "array", "items": _TASK_REF},
            "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/JobTask"}},
            "ending": {"type": ["object", "null"]},
            "resize": {
                "type": ["object", "null"],
                "description": "The job's resize status, as the resize routes answer it "
                "(their ResizeStatus schema); null before the plugin knows the job.",
            },
            "accounting": {"type": "object"},
            "logs": {"type": "string"},
            "hostfile": {"type": "string"},
            "notifications": {"type": "array", "items": {"type": "object"}},
        },
        "additionalProperties": True,
    },
    "JobList": {
        "type": "object",
        "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}},
    },
    "Cluster": {
        "type": "object",
        "required": ["epoch", "hosts", "users"],
        "properties": {
            "epoch": {"type": "integer"},
            "hosts": {
                "type": "object",
                "description": "host: {slots, used, worker}; worker is {ready} but for an "
                "administrator, who also sees the agent's pid, port, instance and queue",
            },
            "users": {
                "type": "object",
                "description": "user: {slots_in_use, limit}; only the caller's own entry "
                "but for an administrator",
            },
            "problems": {
                "type": "array",
                "items": {"type": "string"},
                "description": "the invariant check (administrators only)",
            },
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "epoch"],
        "properties": {
            "status": {"enum": ["ok", "fenced", "failing"]},
            "epoch": {"type": "integer"},
            "reason": {
                "type": "string",
                "description": "why not ok: fenced by a newer controller, or the state "
                "cannot be written (e.g. a full disk)",
            },
        },
    },
}


#: What a host route does for an authenticated caller, in a worker thread: the
#: principal, the request (for its path) and the decoded body (``None``: no body).
Call = Callable[[Principal, Request, Any], Any]


async def _submission(request: Request) -> Any:
    """The JSON body of a submission (``None`` when empty), decoded as strictly as the
    resize routes' (:func:`parse_json`): a lone surrogate, which no encoder accepts,
    would otherwise reach the commands sent to the agents and fail there."""
    raw = await read_json_body(request, _LIMIT)
    return parse_json(raw) if raw else None


def fencing(ctl: LiveController) -> Translate:
    """The error translation of the host routes: a fenced error (or one caused by a
    fenced journal) stops the controller, and is answered; a failed write (a full disk)
    makes the controller go back to what is on disk, and is answered 503."""

    def translate(exc: Exception) -> ResizeError | None:
        fenced = fenced_cause(exc)
        if fenced is not None:
            ctl.fence(fenced)
            return fenced
        if storage_failure(exc) is not None:
            return ctl.storage_failed(exc)
        return exc if isinstance(exc, ResizeError) else None

    return translate


def cluster_view(full: Mapping[str, Any], principal: Principal) -> dict[str, Any]:
    """What ``principal`` may see of the cluster answer ``full`` (the ``Cluster`` schema).

    An administrator sees all of it. Anyone else (a user, or a job's token, which sees
    what its owner sees) gets each host's ``slots`` and ``used`` and whether its agent
    is ``ready``, and their own entry in ``users``: what a user needs to know where
    their jobs could run and how close they are to their limit. Left out: other
    users' usage (who runs how much), the agents' pids, ports and instance ids (an
    agent's address is for the controller only) and the invariant check (its lines
    name jobs and users).
    """
    if principal.admin:
        return dict(full)
    hosts = {
        name: {
            "slots": host["slots"],
            "used": host["used"],
            "worker": {"ready": bool(host.get("worker", {}).get("ready", False))},
        }
        for name, host in full["hosts"].items()
    }
    own = full["users"].get(principal.name, {"slots_in_use": 0, "limit": None})
    return {"epoch": full["epoch"], "hosts": hosts, "users": {principal.name: dict(own)}}


@frozen
class HostCalls:
    """The controller calls behind the host routes."""

    ctl: LiveController

    def list_jobs(self, principal: Principal, request: Request, data: Any) -> Any:
        return {"jobs": self.ctl.jobs_view(principal)}

    def submit(self, principal: Principal, request: Request, data: Any) -> Any:
        result = self.ctl.submit_job(principal, data)
        note_job(result["id"])  # the request's log lines name the job it made
        return result

    def show(self, principal: Principal, request: Request, data: Any) -> Any:
        return self.ctl.job_view(principal, check_job_id(request.path_params["id"]))

    def kill(self, principal: Principal, request: Request, data: Any) -> Any:
        return self.ctl.kill_job(principal, check_job_id(request.path_params["id"]))

    def hosts(self, principal: Principal, request: Request, data: Any) -> Any:
        return {"hosts": self.ctl.hosts_view(principal)}

    def host_command(self, principal: Principal, request: Request, data: Any) -> Any:
        name, action = request.path_params["name"], request.path_params["action"]
        return self.ctl.host_command(principal, name, action, data)

    def cluster(self, principal: Principal, request: Request, data: Any) -> Any:
        return cluster_view(self.ctl.cluster_json(), principal)

    async def health(self, request: Request) -> Response:
        body, status = self.ctl.health()
        return reply(body, status)


def host_routes(ctl: LiveController) -> list[ApiRoute]:
    """The controller's own routes (the module docstring lists them)."""
    calls = HostCalls(ctl)
    translate = fencing(ctl)

    def route(op: Operation, call: Call, *, body: bool = False) -> ApiRoute:
        async def handle(request: Request, principal: Principal) -> Response:
            data = await _submission(request) if body else None
            return reply(await run_in_threadpool(call, principal, request, data), op.status)

        schemas = {**HOST_SCHEMAS, **HOST_ADMIN_SCHEMAS}
        return ApiRoute(op, endpoint(op, handle, ctl.authenticate, translate), schemas)

    return [
        ApiRoute(HEALTH, calls.health, HOST_SCHEMAS),
        route(LIST_JOBS, calls.list_jobs),
        route(SUBMIT_JOB, calls.submit, body=True),
        route(SHOW_JOB, calls.show),
        route(KILL_JOB, calls.kill),
        route(CLUSTER, calls.cluster),
        route(LIST_HOSTS, calls.hosts),
        route(HOST_COMMAND, calls.host_command, body=True),
        *kv_routes(ctl, translate),
    ]


__all__ = ["HOST_SCHEMAS", "MAX_BODY", "HostCalls", "cluster_view", "fencing", "host_routes"]
